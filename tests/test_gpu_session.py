"""The speed stage of benchmarks/gpu_session.sh, prepared on the CPU: the representative specs plan (and 15 layers is
what fits one H100 with 10% left), the hand-written reference loop is independent of fp8launch yet trains on the same
batches with the same lr schedule, and the whole stage's dry run (GPU_DRY_RUN=1: the same commands on tiny CPU shapes)
writes every result with values that make sense."""

from __future__ import annotations

import ast
import datetime
import importlib.util
import json
import math
import os
import subprocess
import sys
import weakref

import pytest
import torch

from launcher.planning.models import parse_builtin
from launcher.train.data import SyntheticStream
from launcher.train.optim import lr_factor

from conftest import REPO

BENCH = REPO / "benchmarks"
SPECS = BENCH / "specs"
NEW_SPECS = sorted(SPECS.glob("llama3-8b-ac-*.toml")) + sorted(SPECS.glob("llama3.2-*.toml"))
H100_GIB = 79.2
"""What torch sees of an H100 80GB HBM3 (the 2026-11-24 session's doctor.txt)."""


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"benchmarks_{name}"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference():
    return _module("reference_loop")


def test_the_reference_loop_imports_nothing_from_fp8launch():
    tree = ast.parse((BENCH / "reference_loop.py").read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert "torchao.float8" in imported and "torch.distributed.fsdp" in imported  # the walk sees the lazy imports too
    assert [m for m in imported if m.split(".")[0] == "launcher"] == []


@pytest.mark.parametrize("seq_len,batch,vocab,rank,seed", [(64, 2, 2048, 0, 0), (17, 3, 128256, 1, 7), (8, 1, 100, 3, 2**64 + 5)])
def test_the_reference_batches_are_fp8launchs_synthetic_batches(reference, seq_len, batch, vocab, rank, seed):
    ours = reference.SyntheticBatches(seq_len=seq_len, batch=batch, vocab=vocab, rank=rank, seed=seed)
    theirs = SyntheticStream(seq_len=seq_len, micro_batch_size=batch, vocab_size=vocab, rank=rank, seed=seed)
    for _ in range(3):
        a, b = next(ours), next(theirs)
        assert a.dtype == b.dtype == torch.int64 and a.shape == (batch, seq_len + 1)
        assert torch.equal(a, b)
    # a different rank reads different batches (the stream is per rank)
    other = reference.SyntheticBatches(seq_len=seq_len, batch=batch, vocab=vocab, rank=rank + 1, seed=seed)
    assert not torch.equal(next(other), SyntheticStream(seq_len=seq_len, micro_batch_size=batch, vocab_size=vocab, rank=rank,
                                                        seed=seed).__next__())


@pytest.mark.parametrize("warmup,steps,min_ratio", [(10, 40, 0.1), (0, 12, 0.1), (5, 30, 0.0), (10, 4, 0.1), (3, 3, 0.25)])
def test_the_reference_lr_schedule_is_fp8launchs(reference, warmup, steps, min_ratio):
    for step in range(steps + 2):
        assert reference.lr_factor(step, warmup_steps=warmup, steps=steps, min_lr_ratio=min_ratio) == pytest.approx(
            lr_factor(step, warmup_steps=warmup, steps=steps, min_lr_ratio=min_ratio), abs=1e-12)


def test_the_reference_loop_frees_the_logits_before_backward(reference):
    """As fp8launch's Trainer (`_loss_of`): the logits go straight into the loss, so nothing holds them while backward
    runs (at the core's shape, 2 GiB of bf16 logits). A hook on the loss, which backward calls first, reads a weak
    reference to the head's output; the loop's former shape (`logits = model(...)` kept in the frame) is the control."""
    a = reference.parse_args(["--precision", "bf16", "--device", "cpu", "--dim", "64", "--layers", "1", "--heads", "4",
                              "--kv-heads", "2", "--ffn", "128", "--vocab", "512", "--seq-len", "16"])
    torch.manual_seed(0)
    model = reference.Transformer(a)
    model.init_weights()
    seen: dict = {}
    model.output.register_forward_hook(lambda module, args, out: seen.__setitem__("logits", weakref.ref(out)))

    def loss_fn(logits, targets):
        loss = reference.cross_entropy(logits, targets)
        loss.register_hook(lambda grad: seen.__setitem__("alive_in_backward", seen["logits"]() is not None))
        return loss

    tokens = next(reference.SyntheticBatches(seq_len=16, batch=2, vocab=512, rank=0, seed=0))
    loss = reference.forward_backward(model, loss_fn, tokens)
    assert seen["alive_in_backward"] is False and math.isfinite(loss.item())
    assert model.output.weight.grad is not None and model.output.weight.grad.abs().sum() > 0  # backward did run
    logits = model(tokens[:, :-1])  # the control: a name that holds the logits through backward
    loss_fn(logits, tokens[:, 1:]).backward()
    assert seen["alive_in_backward"] is True


def test_reference_args_give_the_loop_the_specs_shape_batch_and_schedule():
    args = _module("reference_args")
    procs, flags = args.reference_flags(str(SPECS / "llama3-8b-ac-fp8.toml"), ["train.steps=12"])
    got = dict(zip(flags[::2], flags[1::2]))  # flag -> the word after it (flags without a value pair up harmlessly)
    cfg = parse_builtin("builtin:llama3-8b?layers=15")
    assert procs == 1
    assert (got["--dim"], got["--layers"], got["--heads"], got["--kv-heads"], got["--ffn"], got["--vocab"]) == \
        ("4096", "15", "32", "8", "14336", "128256") == tuple(str(v) for v in (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.kv_heads,
                                                                              cfg.ffn_dim, cfg.vocab_size))
    i = flags.index
    assert flags[i("--seq-len") + 1] == "8192" and flags[i("--batch") + 1] == "1" and flags[i("--steps") + 1] == "12"
    assert float(flags[i("--lr") + 1]) == 1e-4 and flags[i("--warmup-steps") + 1] == "10" and flags[i("--ac") + 1] == "full"
    assert "--compile" in flags and "--auto-filter" in flags and flags[i("--filter-fqns") + 1] == "output"
    # keep_first_last = false: nothing is left out by name
    _, flags_all = args.reference_flags(str(SPECS / "llama3-8b-ac-fp8-all.toml"), [])
    assert flags_all[flags_all.index("--filter-fqns") + 1] == ""
    with pytest.raises(ValueError, match="hf:llama3.2-3b/config.json"):
        args.reference_flags(str(SPECS / "llama3.2-3b-fp8.toml"), [])


def test_the_representative_specs_plan_and_the_8b_ac_fills_an_h100_to_90_percent(cli, tmp_path):
    assert len(NEW_SPECS) == 9
    r = cli("plan", "--format", "json", "--out", str(tmp_path / "gen"), *map(str, NEW_SPECS[3:]))
    assert r.exit_code == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if line.startswith("{")]) == 6
    r = cli("plan", "--format", "json", "--out", str(tmp_path / "gen"), *map(str, NEW_SPECS[:3]))
    assert r.exit_code == 0, r.stderr
    plans = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    peaks = {p["name"]: p["memory"]["peak_bytes_per_gpu"] / 2**30 for p in plans}
    assert set(peaks) == {"llama3-8b-ac-bf16", "llama3-8b-ac-fp8", "llama3-8b-ac-fp8-all"}
    assert all(0.85 * H100_GIB < peak <= 0.90 * H100_GIB for peak in peaks.values()), peaks
    # one layer more would leave less than 10%: 15 is the most that does
    r = cli("plan", "--format", "json", "--out", str(tmp_path / "gen"), str(SPECS / "llama3-8b-ac-fp8.toml"),
            "--set", "train.model=builtin:llama3-8b?layers=16")
    assert json.loads(r.stdout.splitlines()[0])["memory"]["peak_bytes_per_gpu"] / 2**30 > 0.90 * H100_GIB


def test_the_targets_are_marked_from_the_measured_values():
    compare = _module("compare_reference")
    core = {"tokens_per_s": {"ratio": 1.2}, "profile": {"of_ceiling": 0.95}}
    ref = {"bf16": {"ratio": 0.99, "mismatch": None}, "fp8": {"ratio": None, "mismatch": "tokens per step 8192 vs 4096"}}
    got = {t["id"]: t for t in compare.verdicts(core, ref, "NVIDIA H100 80GB HBM3", 1)}
    assert [got[k]["verdict"] for k in ("fp8_vs_bf16", "of_ceiling", "vs_reference_bf16")] == ["not met", "met", "met"]
    assert got["vs_reference_fp8"]["verdict"] == "not comparable: tokens per step 8192 vs 4096" and got["vs_reference_fp8"]["met"] is None
    assert all(t["applies"] and not t["note"] for t in got.values())
    on_cpu = {t["id"]: t for t in compare.verdicts(core, ref, "cpu", 2)}
    assert not any(t["applies"] for t in on_cpu.values()) and "not on one H100" in on_cpu["fp8_vs_bf16"]["note"]


@pytest.mark.slow
def test_the_speed_stage_dry_run_writes_every_result(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "GPU_DRY_RUN": "1", "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    r = subprocess.run(["bash", "benchmarks/gpu_session.sh", "NONE", "speed", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-4000:], r.stderr[-2000:])
    assert "GPU_DRY_RUN" in (out / "environment.txt").read_text()

    bench = json.loads((out / "speed" / "8b-ac" / "bench.json").read_text())
    profile = json.loads((out / "speed" / "8b-ac" / "profile.json").read_text())
    assert bench["baseline"]["fp8_layers"] == 0 and bench["spec"]["fp8_layers"] > 0
    assert profile["baseline"]["parts"]["gemm_fp8"] == 0 and profile["baseline"]["fp8_gemm_flop_share"] == 0
    assert 0 < profile["spec"]["fp8_gemm_flop_share"] <= 1 and profile["spec"]["parts"]["gemm_fp8"] > 0
    assert profile["spec"]["ceiling"] > 1 and (out / "speed" / "8b-ac" / "profile.png").stat().st_size > 0
    start = bench["spec"]["runs"][0]["start"]
    assert [s for s, _ in bench["spec"]["runs"][0]["losses"]] == [1, 2, 3, 4] and start["world_size"] == 2

    refs = {p: json.loads((out / "speed" / "reference" / f"{p}.json").read_text()) for p in ("bf16", "fp8")}
    for p, ref in refs.items():
        assert ref["precision"] == p and ref["steps"] == len(ref["losses"]) == len(ref["step_times_s"]) == 4
        assert all(math.isfinite(v) and 0 < v < 20 for v in ref["losses"])
        # the same job as the bench: tokens per step, processes, parameters, the first batch's loss at the same init scale
        assert (ref["tokens_per_step"], ref["world_size"], ref["parameters"]) == (start["tokens_per_step"], 2, start["parameters"])
        assert ref["losses"][0] == pytest.approx(bench["spec"]["runs"][0]["losses"][0][1], abs=0.1)
    assert refs["bf16"]["fp8_layers"] == 0 and refs["fp8"]["fp8_layers"] == refs["fp8"]["total_linear"] - 1  # all but "output"

    today = datetime.date.today().isoformat()
    speed = json.loads((out / f"{today}-cpu-speed.json").read_text())
    for p in ("bf16", "fp8"):
        side = speed["reference"][p]
        assert side["mismatch"] is None and side["ratio"] > 0
        assert side["ratio"] == pytest.approx(side["fp8launch_tokens_per_s"] / refs[p]["tokens_per_s"])
    targets = {t["id"]: t for t in speed["targets"]}
    assert set(targets) == {"fp8_vs_bf16", "of_ceiling", "vs_reference_bf16", "vs_reference_fp8"}
    assert all(t["verdict"] in ("met", "not met") and t["applies"] is False for t in targets.values())
    assert targets["fp8_vs_bf16"]["value"] == pytest.approx(bench["ratios"]["tokens_per_s"])
    assert targets["of_ceiling"]["value"] == pytest.approx(profile["of_ceiling"])
    assert "skipped" in speed["torchtitan"]
    table = (out / f"{today}-cpu-speed.md").read_text()
    assert "## Targets" in table and "| fp8launch / reference loop tokens/s, FP8 |" in table
    assert (out / f"{today}-cpu.md").is_file()  # summarize_bench.py's FP8 vs bf16 table
