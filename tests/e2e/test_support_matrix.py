"""The support matrix, run (docs/support-matrix.md; tools/support_matrix.py generates both).

Every run that the rule table lets train goes through `fp8launch run` for real (torchrun, 2 processes
over gloo, 2 blocks of llama-debug, 32 tokens, 2 steps) and must finish with every step logged and a
start record whose `effects` and `layers` follow its spec, as computed here from the spec alone. A
crash after the start fails. Every pair the rule table refuses must stop before torchrun starts, exit 2
(3 for a run-stage rule), with one line naming the rule. Refused runs go through the CLI in-process:
they never get as far as starting a process.

Run it alone: `pytest -m slow tests/e2e/test_support_matrix.py -n 2` (12.0 min on 2 cores from an empty Inductor cache,
2026-11-26: the compiled rows that build a graph 40-130 s, the rest 10-20 s).
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from launcher.cli import main
from launcher.commands.preflight import libaio_present
from tools.support_matrix import CPU_BASE, CPU_OPTIONS, MOE_BASE, load, spec_of

from .helpers import output_of, run

MATRIX = load("cpu")  # docs/support-matrix.json (tests/test_support_matrix.py holds it to the generator)
BLOCKS = 2
"""builtin:llama-debug?layers=2."""

DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def test_the_matrix_covers_every_pair():
    assert MATRIX.covered() == set(MATRIX.pairs)
    print(MATRIX.coverage_line())


def _value(config: dict, key: str):
    from tools.support_matrix import _default

    return config.get(key, _default(key))


def expected_effects(config: dict, fp8_layers: int) -> dict:
    """What each effect must be for this spec, from the spec alone."""
    get = lambda key: _value(config, key)  # noqa: E731
    strategy, mode = get("distributed.strategy"), get("precision.mode")
    compute = "bf16" if mode == "fp8" else mode
    fp8 = mode == "fp8"
    all_gather = None
    if strategy == "fsdp2":
        all_gather = "float8_e4m3fn" if fp8 and get("precision.torchao.fsdp_float8_all_gather") else DTYPE[compute]
    compiled = get("compile.enabled")
    held = 1 if get("distributed.pipeline_parallel") > 1 else BLOCKS  # rank 0's stage holds block 0 of the 2
    offload = {"parameters": "device", "optimizer_states": "device"}
    if strategy == "fsdp2" and get("distributed.fsdp2.cpu_offload"):
        offload = {"parameters": "cpu", "optimizer_states": "cpu"}
    if strategy == "deepspeed":
        where = lambda v: "device" if v == "none" else v  # noqa: E731
        offload = {"parameters": where(get("distributed.deepspeed.offload_param")),
                   "optimizer_states": where(get("distributed.deepspeed.offload_optimizer"))}
    optimizer = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}[get("train.optimizer")]
    if strategy == "deepspeed" and offload["optimizer_states"] != "device" and optimizer != "SGD":
        optimizer = "DeepSpeedCPUAdam"
    # the engine's own gradient reduction (precision.grad_reduce = "auto"): DDP in the gradients' dtype (fp32 weights),
    # FSDP2 in its MixedPrecisionPolicy's reduce dtype, DeepSpeed in its communication dtype (the model's)
    grad_reduce = {"ddp": "fp32", "fsdp2": get("distributed.fsdp2.reduce_dtype"), "deepspeed": compute}[strategy]
    # rank 0's: the first of 2 one-block stages (1F1B over micro-batches of one sequence), or its half of each sequence
    parallel = {}
    if get("distributed.pipeline_parallel") > 1:
        parallel["pipeline"] = {"stages": 2, "stage": 0, "schedule": "Schedule1F1B", "microbatches": get("train.grad_accum_steps"),
                                "blocks": [0], "stages_per_rank": 1, "rank_stages": [0]}
    if get("distributed.context_parallel") > 1:
        parallel["context"] = {"ranks": 2, "positioned_attentions": BLOCKS}
    return {
        "all_gather_dtype": all_gather,
        "compiled_blocks": held if compiled else 0,
        "fullgraph": bool(get("compile.fullgraph")) if compiled else None,
        "checkpointed_blocks": {"none": 0, "full": held, "selective": 1}[get("activation_checkpointing.mode")],  # selective: 0, 2, ...
        "optimizer": optimizer,
        "offload": offload,
        "tensor_parallel": get("distributed.tensor_parallel"),
        "async_tp": False,
        "expert_parallel": 1,
        "monitor_hooks": fp8_layers if fp8 and get("monitor.fp8_stats_every") else 0,
        "optimizer_states": "none" if optimizer == "SGD" else "fp32",
        "grad_reduce": grad_reduce,
        "master_weights": "fp32",
        # backend = "msamp" without MS-AMP's stack plans as its opt level's native keys (launcher/planning/msamp_levels.py)
        "msamp_level": f"{get('precision.msamp.opt_level')} natively" if fp8 and get("precision.backend") == "msamp" else None,
        **parallel,
    }


def _params(matrix) -> list:
    """The trained runs: the compiled ones marked `compiles` (they run first), those sharing compiled graphs with one
    xdist group (Matrix.graph_groups: one worker, one after another)."""
    groups = matrix.graph_groups()

    def marks(r):
        return ([pytest.mark.compiles] if r.config.get("compile.enabled") else []) + (
            [pytest.mark.xdist_group(groups[r.name])] if r.name in groups else [])

    return [pytest.param(r, id=r.name, marks=marks(r)) for r in matrix.trained]


@pytest.mark.slow
@pytest.mark.parametrize("matrix_run", _params(MATRIX))
def test_trains_and_its_effects_follow_the_spec(matrix_run, tmp_path):
    spec = spec_of(matrix_run.config, matrix_run.name)
    path = tmp_path / f"{matrix_run.name}.json"
    path.write_text(json.dumps(spec, indent=1))
    r, seconds = run(tmp_path, "run", str(path))
    assert r.returncode == 0, output_of(r)
    lines = [json.loads(line) for line in (tmp_path / "runs" / matrix_run.name / "metrics.jsonl").read_text().splitlines()]
    start, steps, end = lines[0], [x for x in lines if x["event"] == "step"], lines[-1]
    assert start["event"] == "start" and end["event"] == "end" and [x["step"] for x in steps] == [1, 2]
    assert all(math.isfinite(x["loss"]) and x["loss"] > 0 for x in steps), steps
    # the lr schedule steps once per optimizer step (DeepSpeed too, with accumulation): cosine from 1e-3 to 10% at step 2
    assert [x["lr"] for x in steps] == pytest.approx([1e-3, 1e-3 * (0.1 + 0.9 * 0.5)]), steps
    deepspeed = _value(matrix_run.config, "distributed.strategy") == "deepspeed"
    norms = [x["grad_norm"] for x in steps]
    if deepspeed:  # DeepSpeed clips inside its step
        assert norms == [None, None], steps
    elif _value(matrix_run.config, "precision.mode") == "fp16":
        # fp16's GradScaler skips a step whose scaled gradients overflow (the norm inf, written null) and halves its scale
        # (seen at step 2 of m30 under cp 2); one of the two steps has a finite norm
        assert all(n is None or n > 0 for n in norms) and any(n is not None for n in norms), steps
    else:
        assert all(n is not None and n > 0 for n in norms), steps
    assert r.stdout.count("precision: ") == 1  # rank 0 only
    get = lambda key: _value(matrix_run.config, key)  # noqa: E731
    # the ranks of a TP or CP group, and a pipeline's stages, read the same batches
    dp = 2 // (get("distributed.tensor_parallel") * get("distributed.context_parallel") * get("distributed.pipeline_parallel"))
    assert start["tokens_per_step"] == 1 * get("train.grad_accum_steps") * dp * 32  # micro 1 x accum x dp x seq 32
    fp8_all_gather = bool(get("precision.mode") == "fp8" and get("precision.torchao.fsdp_float8_all_gather"))
    assert ("float8 all-gather" in start["precision"]) == fp8_all_gather
    mode = _value(matrix_run.config, "precision.mode")
    fp8_layers = start["fp8_layers"]
    assert (fp8_layers > 0) == (mode == "fp8")
    assert start["effects"] == expected_effects(matrix_run.config, fp8_layers), (start["effects"], matrix_run.config)
    # layers: every Linear as built; the FP8 ones name the recipe they run, the others the compute dtype
    layers = start["layers"]
    pipeline = get("distributed.pipeline_parallel") > 1
    if pipeline:  # rank 0's stage, block 0's 7 Linears (the whole model's FP8 layers were chosen before the cut)
        assert len(layers) == 7 and all(k.startswith("layers.0.") for k in layers), layers
    else:
        assert len(layers) == start["total_linear"]
    fp8 = {k: v for k, v in layers.items() if v.startswith("fp8")}
    assert len(fp8) == ((len(layers) if mode == "fp8" else 0) if pipeline else fp8_layers)
    recipe = _value(matrix_run.config, "precision.torchao.recipe")
    assert set(fp8.values()) <= {f"fp8 {recipe}"}
    assert set(layers.values()) - set(fp8.values()) <= {"bf16" if mode == "fp8" else mode}
    assert "effects: optimizer " + start["effects"]["optimizer"] in r.stdout  # the run's first lines say it
    if fp8 and _value(matrix_run.config, "monitor.fp8_stats_every"):
        # sampled every step: every FP8 layer, named as built (no compile or checkpoint wrapper parts), shares in 0..1
        stats = [json.loads(x) for x in (tmp_path / "runs" / matrix_run.name / "fp8_stats.jsonl").read_text().splitlines()]
        assert {s["step"] for s in stats} == {1, 2}
        assert {s["layer"] for s in stats} == set(fp8)
        assert all(0 <= s["underflow"] <= 1 and 0 <= s["overflow"] <= 1 and s["amax"] > 0 for s in stats)
    print(f"{matrix_run.name}: {seconds:.1f} s")


@pytest.mark.parametrize("matrix_run", MATRIX.refused, ids=[r.name for r in MATRIX.refused])
def test_a_refused_pair_stops_before_torchrun_naming_its_rule(matrix_run, tmp_path, monkeypatch):
    if matrix_run.refused_by == ("DS-NVME-AIO",) and libaio_present():
        pytest.skip("libaio is installed here: NVMe offload trains instead (test_nvme_offload_trains_where_libaio_is_installed)")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"{matrix_run.name}.json"
    path.write_text(json.dumps(spec_of(matrix_run.config, matrix_run.name)))
    result = CliRunner().invoke(main, ["run", str(path)], catch_exceptions=False)
    assert result.exit_code == matrix_run.exit_code, result.stderr
    # plan-stage refusals name the spec ("m12.json: error[...]"); run-stage ones (preflight, before torchrun) do not
    errors = [line for line in result.stderr.splitlines() if line.startswith("error[") or ": error[" in line]
    assert errors and all(any(f"error[{rule}]" in line for rule in matrix_run.refused_by) for line in errors), result.stderr
    assert f"error[{matrix_run.refused_by[0]}]" in result.stderr
    assert not (tmp_path / "runs" / matrix_run.name / "logs").exists()  # torchrun never started


@pytest.mark.slow
@pytest.mark.skipif(not libaio_present(), reason="NVMe offload needs libaio (apt-get install libaio-dev): refused with DS-NVME-AIO")
def test_nvme_offload_trains_where_libaio_is_installed(tmp_path):
    """ZeRO-3 swapping both parameters and optimizer states to files under nvme_path (DeepSpeed JIT-builds
    its async_io op the first time: ~2.5 min on 2 cores)."""
    config = {"distributed.strategy": "deepspeed", "distributed.deepspeed.zero_stage": 3, "precision.mode": "fp8",
              "distributed.deepspeed.offload_optimizer": "nvme", "distributed.deepspeed.offload_param": "nvme"}
    path = tmp_path / "nvme.json"
    path.write_text(json.dumps(spec_of(config, "nvme")))
    r, _ = run(tmp_path, "run", str(path), timeout=900)
    assert r.returncode == 0, output_of(r)
    start = json.loads((tmp_path / "runs" / "nvme" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["effects"]["offload"] == {"parameters": "nvme", "optimizer_states": "nvme"}
    assert start["effects"]["optimizer"] == "DeepSpeedCPUAdam"
    swapped = tmp_path / "nvme" / "zero_stage_3"  # nvme_path "nvme": relative to where the run started
    assert swapped.is_dir() and any(swapped.rglob("*.swp")), list(tmp_path.rglob("*"))


def test_the_base_spec_is_what_the_docs_say():
    assert CPU_BASE["train.steps"] == 2 and CPU_BASE["distributed.procs_per_node"] == 2 and CPU_BASE["train.seq_len"] == 32
    assert {o.key for o in CPU_OPTIONS} >= {"distributed.strategy", "precision.mode", "compile.enabled", "train.on_nan"}


# --- Mixture-of-Experts: builtin:moe-debug, each recipe's experts x compile x expert parallelism -------------

MOE_MATRIX = load("moe")
MOE_BLOCKS, EXPERTS = 2, 8
"""builtin:moe-debug: 2 MoE blocks of 8 experts."""


def test_the_moe_matrix_covers_every_pair():
    assert MOE_MATRIX.covered() == set(MOE_MATRIX.pairs)


@pytest.mark.slow
@pytest.mark.parametrize("matrix_run", _params(MOE_MATRIX))
def test_moe_trains_and_its_effects_follow_the_spec(matrix_run, tmp_path):
    spec = spec_of(matrix_run.config, matrix_run.name, MOE_BASE)
    path = tmp_path / f"{matrix_run.name}.json"
    path.write_text(json.dumps(spec, indent=1))
    r, seconds = run(tmp_path, "run", str(path))
    assert r.returncode == 0, output_of(r)
    lines = [json.loads(line) for line in (tmp_path / "runs" / matrix_run.name / "metrics.jsonl").read_text().splitlines()]
    start, steps = lines[0], [x for x in lines if x["event"] == "step"]
    assert [x["step"] for x in steps] == [1, 2] and all(math.isfinite(x["loss"]) and x["loss"] > 0 for x in steps), steps
    get = lambda key: _value(matrix_run.config, key)  # noqa: E731
    ep, compiled = get("distributed.expert_parallel"), get("compile.enabled")
    effects = start["effects"]
    assert effects["compiled_blocks"] == (MOE_BLOCKS if compiled else 0)  # every part of both blocks measured compiled
    assert effects["fullgraph"] == (bool(get("compile.fullgraph")) if compiled else None)
    assert effects["checkpointed_blocks"] == (MOE_BLOCKS if get("activation_checkpointing.mode") == "full" else 0)
    assert effects["expert_parallel"] == ep
    # the expert groups as built: MXFP8 grouped GEMMs for mxfp8, high precision for the recipes torchao has no grouped GEMM for
    mode, recipe = get("precision.mode"), get("precision.torchao.recipe")
    groups = {k: v for k, v in start["layers"].items() if k.endswith(".moe.experts")}
    assert sorted(groups) == [f"layers.{i}.moe.experts" for i in range(MOE_BLOCKS)]
    want = f"fp8 mxfp8 (grouped, {EXPERTS} experts)" if mode == "fp8" and recipe == "mxfp8" else "bf16"
    assert set(groups.values()) == {want}, start["layers"]
    assert all(start["layers"][f"layers.{i}.moe.router.gate"] == "bf16" for i in range(MOE_BLOCKS))  # routers stay high precision
    print(f"{matrix_run.name}: {seconds:.1f} s")


@pytest.mark.parametrize("matrix_run", MOE_MATRIX.refused, ids=[r.name for r in MOE_MATRIX.refused])
def test_a_refused_moe_pair_stops_before_torchrun_naming_its_rule(matrix_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"{matrix_run.name}.json"
    path.write_text(json.dumps(spec_of(matrix_run.config, matrix_run.name, MOE_BASE)))
    result = CliRunner().invoke(main, ["run", str(path)], catch_exceptions=False)
    assert result.exit_code == matrix_run.exit_code, result.stderr
    assert f"error[{matrix_run.refused_by[0]}]" in result.stderr
    assert not (tmp_path / "runs" / matrix_run.name / "logs").exists()
