"""What the GPU acceptance runs (tests/gpu/test_specs_gpu.py), as plain functions that run
without a GPU too (tests/test_gpu_acceptance.py exercises them on CPU):

- `variants()`: every committed spec under specs/ cut to one GPU (`?layers=N`, one process,
  5 steps, a short warm-up), plus a matrix on top of the torchao specs: FSDP2 and DDP, compile
  on and off, full activation checkpointing, each torchao recipe, float8 all-gather;
- `fits(variant, memory_gib)`: the plan's own memory estimate (model states + activations)
  against the GPU's memory, and the backend package installed;
- `run(variant, ...)`: `fp8launch run SPEC --set ...` (the real entrypoint under torchrun),
  then metrics.jsonl read back;
- `signature_gaps(table, fn)`: keyword names fp8launch passes that the installed library's
  callable does not take (Transformer Engine modules and recipes, msamp.initialize).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from launcher.planning.backends import BACKENDS

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted((REPO / "specs").glob("*.toml"))
FP8LAUNCH = str(Path(sys.executable).parent / "fp8launch")
STEPS = 5
LAYERS = 2
MAX_SEQ = 4096
BACKEND_PACKAGE = {b.name: b.package for b in BACKENDS.values()}


@dataclass(frozen=True)
class Variant:
    name: str
    spec: Path
    sets: tuple[str, ...]
    """--set overrides that cut the spec to one GPU (and pick the matrix cell)."""
    data: dict = field(compare=False, repr=False, default_factory=dict)


def _get(data: dict, dotted: str, default=None):
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def one_gpu_sets(data: dict, *, device: str = "cuda", layers: int = LAYERS, steps: int = STEPS) -> list[str]:
    """--set overrides that make the spec `data` one process on one GPU: the same model with
    `layers` blocks (builtin), `steps` steps, seq_len capped at MAX_SEQ, a local torchrun launch."""
    model = _get(data, "train.model", "builtin:llama-debug")
    sets = ["distributed.nodes=1", "distributed.procs_per_node=1", "distributed.global_batch_size=0",
            f'launch.device="{device}"', 'launch.launcher="torchrun"', f"train.steps={steps}", "train.warmup_steps=1",
            "train.log_every=1", f"train.seq_len={min(int(_get(data, 'train.seq_len', 2048)), MAX_SEQ)}", "train.checkpoint_every=0"]
    if model.startswith("builtin:"):
        name, _, query = model.partition("?")
        kept = [q for q in query.split("&") if q and not q.startswith("layers=")]
        sets.append(f'train.model="{name}?{"&".join(kept + [f"layers={layers}"])}"')
    return sets


MATRIX = {
    # name: extra --set overrides on top of a torchao spec cut to one GPU
    "fsdp2": [],
    "ddp": ['distributed.strategy="ddp"', "precision.torchao.fsdp_float8_all_gather=false", "compile.enabled=false"],
    "eager": ["compile.enabled=false"],
    "ac-full": ['activation_checkpointing.mode="full"'],
    "tensorwise": ['precision.torchao.recipe="tensorwise"', "precision.torchao.fsdp_float8_all_gather=false"],
    "tensorwise-allgather": ['precision.torchao.recipe="tensorwise"', "precision.torchao.fsdp_float8_all_gather=true",
                             'distributed.strategy="fsdp2"'],
    "rowwise": ['precision.torchao.recipe="rowwise"', "precision.torchao.fsdp_float8_all_gather=false"],
    "rowwise_with_gw_hp": ['precision.torchao.recipe="rowwise_with_gw_hp"', "precision.torchao.fsdp_float8_all_gather=false"],
}


def variants(device: str = "cuda") -> list[Variant]:
    """Every committed spec cut to one GPU, and the torchao matrix on the first torchao spec."""
    out = []
    torchao_base = None
    for path in SPECS:
        data = tomllib.loads(path.read_text())
        sets = tuple(one_gpu_sets(data, device=device))
        out.append(Variant(path.stem, path, sets, data))
        if torchao_base is None and _get(data, "precision.mode") == "fp8" and _get(data, "precision.backend", "torchao") == "torchao" \
                and str(_get(data, "train.model", "")).startswith("builtin:llama3"):
            torchao_base = (path, data, sets)
    if torchao_base:
        path, data, sets = torchao_base
        out += [Variant(f"{path.stem}+{cell}", path, sets + tuple(extra), data) for cell, extra in MATRIX.items()]
    return out


def planned(variant: Variant, out_dir: str):
    """The Plan of `variant` (planning only: no torch, no GPU)."""
    from launcher.commands.plan import plan_one

    return plan_one(str(variant.spec), out_dir, list(variant.sets)).plan


def fits(plan, memory_gib: float) -> tuple[bool, str]:
    """(whether it can run on one GPU of `memory_gib`, why not)."""
    from launcher.planning.memory import estimate, model_params

    p = plan.precision
    if p.mode == "fp8":
        package = BACKEND_PACKAGE[p.backend]
        if importlib.util.find_spec(package) is None:
            return False, f"{package} is not installed"
    if plan.distributed.strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return False, "deepspeed is not installed"
    params = model_params(plan.train.model)
    if params:
        need = estimate(plan, params).peak_bytes / 2**30
        if need > 0.9 * memory_gib:
            return False, f"needs {need:.1f} GiB, the GPU has {memory_gib:.1f}"
    return True, ""


def run(variant: Variant, output_dir: Path, *extra: str, timeout: float = 900,
        profile: int = 0) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`fp8launch run` of the variant into `output_dir` (with `profile`: `--profile N`, N steps after 2 warm-up
    steps, traced into output_dir/profile/trace.json.gz); (process, metrics.jsonl records)."""
    sets = [*variant.sets, f'train.output_dir="{output_dir}"', *extra]
    cmd = [FP8LAUNCH, "run", str(variant.spec), *[a for s in sets for a in ("--set", s)]]
    if profile:
        cmd += ["--profile", str(profile)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    path = output_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return r, records


SCALED_OPS = ("aten::_scaled_mm", "aten::_scaled_grouped_mm")
SCALED_MM_RECIPES = {"tensorwise": 3, "rowwise": 3, "rowwise_with_gw_hp": 2}
"""torch._scaled_mm calls per FP8 Linear and micro-batch, by torchao recipe: forward, input gradient and weight
gradient (rowwise_with_gw_hp keeps the weight gradient's GEMM in high precision)."""


def scaled_mm_per_step(output_dir: Path) -> float:
    """torch._scaled_mm calls (and grouped ones) per profiled step, on every host thread (the backward's included),
    in the trace `fp8launch run --profile` wrote: the FP8 GEMMs that ran, counted by their ops."""
    from launcher.profiling.trace import read_trace

    trace = read_trace(str(output_dir / "profile" / "trace.json.gz"))
    calls = [n for n in trace.all_nodes() if n.name in SCALED_OPS]
    per_step = [sum(1 for n in calls if step.ts <= n.ts <= step.end) for step in trace.steps]
    return sum(per_step) / len(per_step)


FP8_KERNEL = re.compile(r"e4m3|e5m2|fp8|float8", re.I)
"""A GPU kernel that reads or writes FP8: Transformer Engine's and MS-AMP's casts and GEMMs are templated on its
fp8e4m3 / fp8e5m2 (= CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2, transformer_engine/common/common.h), which the
trace's demangled names spell out; cuBLASLt's FP8 GEMM kernels name their input types (e4m3)."""


def fp8_kernels(output_dir: Path) -> int:
    """GPU kernels with an FP8 dtype in their name in the trace `fp8launch run --profile` wrote (0 on a CPU)."""
    from launcher.profiling.trace import read_trace

    return sum(1 for k in read_trace(str(output_dir / "profile" / "trace.json.gz")).kernels if FP8_KERNEL.search(k.name))


def expected_scaled_mm(plan, fp8_layers: int) -> tuple[int, int] | None:
    """(fewest, most) torch._scaled_mm calls in one step of `plan` with `fp8_layers` FP8 Linears: SCALED_MM_RECIPES
    per layer and micro-batch, and one more per layer whose forward activation checkpointing recomputes: every one
    with full AC in eager mode; with selective AC (every other block) or a compiled block, at least one (Inductor's
    partitioner drops the recomputes the backward does not need: each block's last projection, whose output feeds
    only the residual; measured on the CPU, llama-debug with 2 blocks, tensorwise: 52 eager, 50 compiled). 0 without
    FP8. None where FP8 GEMMs are not torch._scaled_mm calls: Transformer Engine's and MS-AMP's own GEMMs, torchao's
    block recipes and per-module rules, async TP's fused matmuls."""
    p = plan.precision
    if not p.fp8:
        return 0, 0
    per_layer = SCALED_MM_RECIPES.get(p.torchao.recipe) if p.backend == "torchao" else None
    if per_layer is None or p.rules or plan.distributed.async_tp:
        return None
    n = fp8_layers * plan.train.grad_accum_steps
    plain, recomputed = n * per_layer, n * (per_layer + 1)
    ac = plan.activation_checkpointing.mode
    if ac == "none":
        return plain, plain
    if ac == "full" and not plan.compile.enabled:
        return recomputed, recomputed
    return plain + 1, recomputed


TWIN_FIRST_LOSS_GAP = 1e-4
TWIN_LOSS_GAP = 0.03
"""An FP8 run against its bf16 twin (the same spec in precision.mode = "bf16": the same seed, weights and batches):
the first step's losses differ by more than TWIN_FIRST_LOSS_GAP (FP8 rounding moved the forward) and every step's
stay within TWIN_LOSS_GAP. Measured with cpu-smoke cut to one process on the CPU (seq_len 64, seeds 0-4, 5 steps):
first step 0.00046-0.00217 apart, every step within 0.00928; the bounds leave 4.6x and 3.2x. Without FP8 the twins
are bit-equal (gap 0.0); with the FP8 GEMM's input scale dropped the losses part by 1.1."""


def losses_with_bf16_twin(variant: Variant, output_dir: Path, *extra: str) -> tuple[list[float], list[float]]:
    """(the variant's step losses, its bf16 twin's), each from its own `fp8launch run`."""
    losses = []
    for name, mode in (("fp8", []), ("bf16", ['precision.mode="bf16"'])):
        r, records = run(variant, output_dir / name, *extra, *mode)
        assert r.returncode == 0, (name, r.stderr[-3000:])
        losses.append([rec["loss"] for rec in records if rec.get("event") == "step"])
    return losses[0], losses[1]


def signature_gaps(names, fn) -> set[str]:
    """The names in `names` that `fn` (a callable, or a class: its __init__) does not accept as keywords."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    params = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return set()
    return set(names) - set(params)


def recipe_field_gaps(names, cls) -> set[str]:
    """Recipe fields fp8launch sets that the installed TE recipe class does not have (dataclass or __init__)."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        return set(names) - {f.name for f in dataclasses.fields(cls)}
    return signature_gaps(names, cls)
