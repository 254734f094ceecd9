"""MS-AMP's levels in today's stack: what `precision.optimizer_states`, `precision.grad_reduce` and
`precision.master_weights` cost in bytes, and which keys give each MS-AMP opt level natively. Torch-free:
the memory estimate, the prediction, the rules, `init --preset` and the doctor read these facts here, and the
training side (launcher/train/optim_lowbit.py, launcher/train/grad_reduce.py) builds what they describe.

MS-AMP's chart (its docs, repeated in Accelerate's low-precision guide) and the keys that give each level here:

    level  GEMM  comm  weight  master  weight grad  optimizer states   native keys (torchao FP8 GEMMs)
    O1     FP8   FP8   FP16    N/A     FP8          FP32 + FP32        grad_reduce = "fp8", master_weights = "bf16"
    O2     FP8   FP8   FP16    N/A     FP8          FP8 + FP16         O1 + optimizer_states = "fp8"
    O3     FP8   FP8   FP8     FP16    FP8          FP8 + FP16         O2 + FSDP2 (ZeRO-3 sharding) + float8 all-gather

Bytes on the wire follow the ring algorithms' convention (NCCL's "bus bytes"): an all-reduce of B bytes sends
2 (n - 1) / n x B from each of n ranks; a reduce-scatter of B input bytes, or an all-gather of B output bytes,
(n - 1) / n x B. The FP8 reduction sends e4m3 codes plus one fp32 scale per REDUCE_BLOCK values: DDP's is a
reduce-scatter and an all-gather in FP8 (the sum in fp32 between them), FSDP2's a reduce-scatter in FP8.
"""

from __future__ import annotations

import typing

from launcher.planning import stack
from launcher.planning.backends import BACKENDS

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

STATE_BLOCK = 256
"""torchao's block size for AdamWFp8 / AdamW8bit states: one fp32 scale per this many values."""
SMALL_STATE = 4096
"""torchao keeps full-precision states for tensors with fewer values than this (bitsandbytes' rule), or whose size
the block does not divide."""
REDUCE_BLOCK = 256
"""The FP8 gradient reduction's block: one fp32 scale per this many values of each rank's chunk."""

STATE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp8": 1 + 4 / STATE_BLOCK, "int8": 1 + 4 / STATE_BLOCK}
"""Bytes per value of one Adam moment, by precision.optimizer_states (codes + block scales)."""
REDUCE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1 + 4 / REDUCE_BLOCK}
"""Bytes per gradient value on the wire, by reduction payload."""
MOMENTS = {"adamw": 2, "adam": 2, "sgd": 0}
"""Moments per parameter: exp_avg + exp_avg_sq; plain SGD (no momentum) keeps none."""


def master_dtype(plan: Plan) -> str:
    """fp32 | bf16: the dtype of the weights the optimizer updates (and of the parameters and their gradients)."""
    return plan.precision.master_weights


def reduce_payload(plan: Plan) -> str:
    """The gradient reduction's payload as the run builds it: precision.grad_reduce, or the engine's own for "auto"
    (DDP: the gradients' dtype, which is the parameters'; FSDP2: distributed.fsdp2.reduce_dtype; DeepSpeed: its
    communication dtype, the model's dtype under bf16 / fp16)."""
    p, d = plan.precision, plan.distributed
    if p.grad_reduce != "auto":
        return p.grad_reduce
    if d.strategy == "fsdp2":
        return d.fsdp2.reduce_dtype
    if d.strategy == "deepspeed":
        return p.compute_dtype if p.compute_dtype in ("bf16", "fp16") else "fp32"
    return master_dtype(plan)


def grad_comm_bytes(plan: Plan, params: int) -> float:
    """Bytes one rank sends for the gradient reduction of one optimizer step of a model of `params` parameters
    (bucket and block padding aside): the figure each step record's grad_comm_bytes measures."""
    d = plan.distributed
    dp = max(1, d.data_parallel)
    if dp == 1:
        return 0.0
    share = (dp - 1) / dp
    local = params / max(1, d.tensor_parallel)
    per_value = REDUCE_BYTES[reduce_payload(plan)]
    if d.strategy == "ddp":  # all-reduce (fp8: reduce-scatter + all-gather), once per step (no_sync before the last micro-batch)
        return 2 * share * per_value * local
    if d.strategy == "fsdp2":  # reduce-scatter, once per step (set_requires_gradient_sync before the last micro-batch)
        return share * per_value * local
    z = d.deepspeed.zero_stage
    if z == 0:  # all-reduce at the accumulation boundary
        return 2 * share * per_value * local
    if z == 1:  # reduce-scatter of the accumulated gradients at the boundary
        return share * per_value * local
    return plan.train.grad_accum_steps * share * per_value * local  # ZeRO-2/3 reduce in every micro-batch's backward


# --- MS-AMP's opt levels, natively ----------------------------------------------------------------------

MSAMP_LEVELS: dict[str, dict[str, typing.Any]] = {
    "O1": {"precision.mode": "fp8", "precision.backend": "torchao", "precision.grad_reduce": "fp8",
           "precision.master_weights": "bf16"},
    "O2": {"precision.mode": "fp8", "precision.backend": "torchao", "precision.grad_reduce": "fp8",
           "precision.master_weights": "bf16", "precision.optimizer_states": "fp8"},
    "O3": {"precision.mode": "fp8", "precision.backend": "torchao", "precision.grad_reduce": "fp8",
           "precision.master_weights": "bf16", "precision.optimizer_states": "fp8", "distributed.strategy": "fsdp2",
           "precision.torchao.fsdp_float8_all_gather": True},
}
"""MS-AMP opt level -> the spec keys that give it with torchao and fp8launch's engines. O1: FP8 gradient
communication and weights kept in 16 bits without a master copy; O2: + 8-bit Adam moments (both in fp8, where
MS-AMP keeps the second in fp16); O3: + ZeRO-3-style sharding (FSDP2) with the weights all-gathered in FP8 (MS-AMP
stores them in FP8 with an FP16 master; here the bf16 master is the only copy)."""

PRESETS = {f"msamp-{level.lower()}": level for level in MSAMP_LEVELS}
"""`fp8launch init --preset NAME` -> the MS-AMP level it writes the native equivalent of."""


def _toml(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else f'"{value}"'


def native_keys(level: str) -> str:
    """The keys of MS-AMP level `level` as a fix names them: 'precision.backend = "torchao", ...'."""
    return ", ".join(f"{k} = {_toml(v)}" for k, v in MSAMP_LEVELS[level].items() if k != "precision.mode")


def native_fix(level: str) -> str:
    """The fix a spec with backend = "msamp" gets where MS-AMP cannot run: its level natively."""
    return f"its native equivalent: set {native_keys(level)} (`fp8launch init --preset msamp-{level.lower()}` writes such a spec)"


def native_level(data: dict, msamp_runs: typing.Callable[[str], bool] | None = None) -> str | None:
    """The MS-AMP opt level a spec (as resolved: every key, defaults filled) names with `backend = "msamp"` where the
    plan gives it natively instead: MS-AMP's own stack is not installed here (launcher/planning/stack.py) and its level's
    keys express the spec. None otherwise: a spec that names another backend, one MS-AMP itself runs here, and what the
    native levels cannot express (its DeepSpeed integration, use_te's TE modules, level keys of its own, a recipe in
    [[precision.rules]] or [[precision.schedule]], an optimizer or high precision the bf16 master weights cannot take,
    O3 without FSDP2, tensor parallel): those stay with MS-AMP and its rules, which refuse what cannot run.
    `msamp_runs(strategy)`: whether MS-AMP's stack is installed (default: here, stack.msamp_runs; the doctor passes the
    machine it assesses)."""
    p, d = data["precision"], data["distributed"]
    b = BACKENDS.get(p["backend"])
    if p["mode"] != "fp8" or b is None or not b.native_as:
        return None
    level = p["msamp"]["opt_level"]
    expressible = (
        d["strategy"] in ("ddp", "fsdp2") and (level != "O3" or d["strategy"] == "fsdp2")
        and not p["msamp"]["use_te"] and d["tensor_parallel"] == 1
        and (p["optimizer_states"], p["grad_reduce"], p["master_weights"]) == ("fp32", "auto", "fp32")
        and not any(r.get("recipe") for r in p["rules"]) and not any(ph.get("recipe") for ph in p["schedule"])
        and data["train"]["optimizer"] in ("adam", "adamw") and p["high_precision"] == "bf16"
    )
    return level if expressible and not (msamp_runs or stack.msamp_runs)(d["strategy"]) else None


def as_native(data: dict, level: str) -> None:
    """Set MS-AMP level `level`'s native keys in a resolved spec's data (in place)."""
    for key, value in MSAMP_LEVELS[level].items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value


def native_line(plan: Plan) -> str:
    """The plan's one line about a `backend = "msamp"` spec planned as its native levels ("" for any other plan)."""
    level = plan.msamp_native
    if not level:
        return ""
    return (f'precision.backend = "msamp" with opt_level {level} planned as its native levels ({native_keys(level)}): '
            f"{stack.msamp_absent(plan.distributed.strategy)}")
