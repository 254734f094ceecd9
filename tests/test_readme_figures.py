"""The figures README.md quotes are what the code computes, or what the committed result files measured,
within 10% (issue 23): a change to the estimate, the prediction or a re-measured GPU run that moves a figure
fails here until the README says the new one."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO
from launcher.commands.plan import plan_one
from launcher.planning.memory import BYTES, estimate, loss_bytes_per_token, model_config, model_params
from launcher.planning.plan import resolve
from launcher.planning.read import read_spec, validate

README = " ".join((REPO / "README.md").read_text().split())
GIB = 2**30


def quoted(pattern: str) -> tuple[float, ...]:
    """The numbers the README's sentence matching `pattern` quotes (one capture group per number)."""
    m = re.search(pattern, README)
    assert m, f"README.md no longer says {pattern!r}: update this test with the README"
    return tuple(float(g.replace(",", "")) for g in m.groups())


def llama3_8b(tmp_path, *sets: str):
    return plan_one(str(REPO / "specs" / "llama3-8b-torchao-fsdp2.toml"), str(tmp_path), list(sets))


def test_llama3_8b_activation_figures_are_the_estimates(tmp_path):
    none, full, logits, log_softmax, recompute = quoted(
        r"no checkpointing they are about ([0-9.]+) GiB per GPU; with full checkpointing about ([0-9.]+) GiB \(([0-9.]+) of them the "
        r"bf16 logits the\s+compiled loss keeps; an eager loss keeps its fp32 log-softmax, ([0-9.]+) GiB\) plus ([0-9.]+) GiB")
    batch = ["train.seq_len=8192", "train.micro_batch_size=1"]
    got = {}
    for mode in ("none", "full"):
        planned = llama3_8b(tmp_path / mode, *batch, f'activation_checkpointing.mode="{mode}"')
        got[mode] = estimate(planned.plan, model_params(planned.plan.train.model)).activations
    assert none == pytest.approx(got["none"].bytes / GIB, rel=0.10)
    assert full == pytest.approx(got["full"].bytes / GIB, rel=0.10)
    assert recompute == pytest.approx(got["full"].recompute_bytes / GIB, rel=0.10)
    for compiled, figure in ((True, logits), (False, log_softmax)):  # what the loss keeps, by the estimator
        plan = llama3_8b(tmp_path / f"loss-{compiled}", *batch, f"compile.enabled={str(compiled).lower()}").plan
        assert plan.precision.compute_dtype == "bf16"
        assert figure == pytest.approx(loss_bytes_per_token(plan, model_config(plan.train.model)) * 8192 / GIB, rel=0.10)


def test_the_prediction_line_is_what_plan_predicts_for_the_8b_spec(tmp_path):
    speedup, share, fp8, linears = quoted(r"predicted FP8 speed-up on 8 x h100: ([0-9.]+)x \(Linear GEMMs ([0-9]+)% of the "
                                          r"bf16 step; ([0-9]+) of ([0-9]+) layers in FP8")
    pr = llama3_8b(tmp_path).prediction
    assert speedup == pytest.approx(pr.fp8_vs_bf16, rel=0.10) and round(pr.fp8_vs_bf16, 2) == speedup
    assert share / 100 == pytest.approx(pr.to_json()["linear_gemm_share_bf16"], rel=0.10)
    assert (fp8, linears) == (pr.n_fp8, pr.n_linear)


def test_the_gpu_table_is_the_committed_h100_results():
    results = json.loads((REPO / "benchmarks" / "results" / "2026-11-24-nvidia-h100-80gb-hbm3.json").read_text())["results"]
    for row, result in zip((r"Llama-3-8B shape, 4 layers, seq 8192", r"`builtin:llama3-1b`, 2 x 4096 tokens"), results):
        ratio, fp8, bf16, mfu_bf16, mfu_fp8, mem_bf16, mem_fp8 = quoted(
            re.escape(row) + r" \| \*\*([0-9.]+)x\*\* \(([0-9,]+) vs ([0-9,]+)\) \| ([0-9.]+)% / ([0-9.]+)% \| ([0-9.]+) / ([0-9.]+) GiB")
        t = result["tokens_per_s"]
        assert (ratio, fp8, bf16) == (round(t["ratio"], 2), round(t["fp8"]), round(t["baseline"]))
        assert (mfu_bf16, mfu_fp8) == (round(100 * result["mfu"]["baseline"], 1), round(100 * result["mfu"]["fp8"], 1))
        assert (mem_bf16, mem_fp8) == (round(result["peak_mem_gib"]["baseline"], 1), round(result["peak_mem_gib"]["fp8"], 1))


def test_the_output_layers_share_of_the_slices_linear_flops_is_the_predicted_shapes(tmp_path):
    slice_share, full_share = quoted(r"is ([0-9]+)% of the Linear FLOPs \(([0-9]+)% in the 32-layer model\)")
    spec = str(REPO / "benchmarks" / "specs" / "llama3-8b-slice-fp8.toml")
    for model, share in (("builtin:llama3-8b?layers=4", slice_share), ("builtin:llama3-8b", full_share)):
        layers = plan_one(spec, str(tmp_path), [f'train.model="{model}"']).prediction.to_json()["layers"]
        flops = {row["layer"]: row["copies"] * row["k"] * row["n"] for row in layers}
        assert share / 100 == pytest.approx(flops["output"] / sum(flops.values()), rel=0.10)


def test_the_deepspeed_bucket_figure_is_its_default():
    elements, gib = quoted(r"reduce_bucket_size`, ([0-9.e]+) elements by default: ([0-9.]+) GiB in bf16")
    source = read_spec(str(REPO / "specs" / "te-delayed-deepspeed-zero2.toml"))  # a DeepSpeed spec that leaves the bucket alone
    assert "reduce_bucket_size" not in source.data["distributed"]["deepspeed"]
    validate(source)
    plan = resolve(source)
    assert plan.precision.compute_dtype == "bf16"
    assert elements == plan.distributed.deepspeed.reduce_bucket_size
    assert gib == pytest.approx(elements * BYTES[plan.precision.compute_dtype] / GIB, rel=0.10)


def test_the_reliability_record_is_what_the_committed_results_counted():
    """docs/reliability.md and the README quote the corpus and the fuzz as benchmarks/results/hostile_record.json and
    fuzz_inputs.json counted them, and those counted no traceback, hang or lost file."""
    corpus = json.loads((REPO / "benchmarks" / "results" / "hostile_record.json").read_text())
    fuzz = json.loads((REPO / "benchmarks" / "results" / "fuzz_inputs.json").read_text())
    page = " ".join((REPO / "docs" / "reliability.md").read_text().split())
    assert not corpus["failed"] and all(corpus["all"].get(k, 0) == 0 for k in ("traceback", "hang", "lost", "left"))
    assert corpus["all"]["as documented"] == corpus["all"]["tried"]
    assert all(r["traceback"] == r["hang"] == r["other"] == 0 for r in fuzz["rows"]) and not fuzz["failures"]
    tried = corpus["all"]["tried"]
    assert f"| {tried} | {tried} ({corpus['all']['one-line error']} one-line errors, " in page
    assert f"pytest: {corpus['tests']} tests, 0 failed" in page
    per_target = {r["target"]: r["tried"] for r in fuzz["rows"]}
    assert f"| {per_target['plan']} + {per_target['import']} | all (0 other) | 0 | 0 |" in page
    properties = sum(int(n) for n in re.search(r"\| (\d+) \+ (\d+) \+ (\d+) \| all \| 0 \| 0 \|", page).groups())
    hostile, inputs = quoted(r"the record of ([0-9,]+) hostile commands, ([0-9,]+) broken inputs")
    assert (hostile, inputs) == (tried, per_target["plan"] + per_target["import"] + properties)
