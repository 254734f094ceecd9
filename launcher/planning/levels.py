"""MS-AMP's levels in today's stack: what `precision.optimizer_states`, `precision.grad_reduce` and
`precision.master_weights` cost in bytes, and which keys give each MS-AMP opt level natively. Torch-free:
the memory estimate, the prediction, the rules, `init --preset` and the doctor read these facts here, and the
training side (launcher/train/optim_lowbit.py, launcher/train/parallel/grad_reduce.py) builds what they describe.

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
from launcher.planning.msamp_levels import native_keys

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


def native_line(plan: Plan) -> str:
    """The plan's one line about a `backend = "msamp"` spec planned as its native levels ("" for any other plan)."""
    level = plan.msamp_native
    if not level:
        return ""
    return (f'precision.backend = "msamp" with opt_level {level} planned as its native levels ({native_keys(level)}): '
            f"{stack.msamp_absent(plan.distributed.strategy)}")
