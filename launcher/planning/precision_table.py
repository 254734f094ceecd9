"""What runs in which dtype, for a plan: the rows of an MS-AMP-style precision chart.

Pure data from the Plan; the entrypoint reports what it really converted at run time.
"""

from __future__ import annotations

import typing

from launcher.planning.backends import backend_of

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

ROWS = (
    ("gemm", "Linear GEMMs (forward and backward)"),
    ("other_compute", "everything else: attention, norms, activations, loss"),
    ("weights", "parameters as stored between steps"),
    ("weight_comm", "parameter communication (all-gather)"),
    ("grad_reduce", "gradient reduction (all-reduce / reduce-scatter)"),
    ("weight_grads", "weight gradients as accumulated"),
    ("master_weights", "master weights the optimizer updates"),
    ("optimizer_states", "optimizer states (moments)"),
    ("tp_comm", "tensor-parallel collectives (only with distributed.tensor_parallel > 1)"),
)


def precision_table(plan: Plan) -> dict[str, str]:
    """{row: dtype description} for the plan's precision, backend and strategy. Which dtype the weights,
    master weights and optimizer states are kept in is one fact with two uses: the memory estimate's
    rows (launcher/planning/memory.py `model_states`) decide it, this table describes it."""
    from launcher.planning.memory import model_states

    p, d = plan.precision, plan.distributed
    hp = p.compute_dtype
    rows = {r.name: r for r in model_states(plan, 1)}
    stored, master, states = _stored(plan, rows), _master(plan, rows), _states(rows["optimizer_states"])
    gemm = hp
    weight_comm = "none (replicated)"
    grad_reduce = "fp32"

    if d.strategy == "ddp":
        grad_reduce = "bf16 (gradients of bf16 master weights)" if p.master_weights == "bf16" else "fp32 (gradients of fp32 weights)"
    elif d.strategy == "fsdp2":
        weight_comm = hp
        grad_reduce = d.fsdp2.reduce_dtype
    elif d.strategy == "deepspeed":
        grad_reduce = hp
        weight_comm = hp if d.deepspeed.zero_stage == 3 else "none (replicated)"

    b = backend_of(p)
    if b is not None:
        gemm = b.gemm_text(p)
        if b.float8_all_gather(p, d.strategy):
            weight_comm = "fp8 e4m3 (float8 all-gather)"
        if b.setting(p, "fp8_params") and d.strategy == "fsdp2":
            weight_comm = "fp8 (TE's FP8 weights all-gathered as FP8)"
        if b.scaling_tensors:
            grad_reduce = "fp8 (MS-AMP scaled all-reduce)"

    if p.grad_reduce != "auto" and d.strategy in ("ddp", "fsdp2"):
        grad_reduce = _GRAD_REDUCE[p.grad_reduce][d.strategy]
    weight_grads = "fp8 (MS-AMP)" if _msamp(plan) else grad_reduce.split(" ")[0]
    if p.grad_reduce == "fp8":  # FP8 on the wire only: the gradients are accumulated in the parameters' dtype
        weight_grads = rows["grads"].dtype

    table = {
        "gemm": gemm,
        "other_compute": hp,
        "weights": stored,
        "weight_comm": weight_comm,
        "grad_reduce": grad_reduce,
        "weight_grads": weight_grads,
        "master_weights": master,
        "optimizer_states": states,
    }
    if d.tensor_parallel > 1:
        table["tp_comm"] = tp_comm(plan)
    return table


_GRAD_REDUCE = {
    "fp8": {"ddp": "fp8 e4m3, one fp32 scale per 256 values (communication hook: reduce-scatter + all-gather, fp32 sum)",
            "fsdp2": "fp8 e4m3, one fp32 scale per 256 values (custom reduce-scatter, fp32 sum)"},
    "bf16": {"ddp": "bf16 (communication hook)", "fsdp2": "bf16 (custom reduce-scatter)"},
    "fp32": {"ddp": "fp32 (communication hook)", "fsdp2": "fp32 (custom reduce-scatter)"},
}
"""precision.grad_reduce -> strategy -> the payload as the gradient reduction sends it (launcher/train/parallel/grad_reduce.py)."""

_STATES = {"fp8": "fp8 e4m3 first and second moment, one fp32 scale per 256 values (torchao AdamWFp8)",
           "int8": "8-bit dynamic-tree codes, one fp32 scale per 256 values (torchao AdamW8bit)",
           "bf16": "bf16 first and second moment"}
"""precision.optimizer_states -> the moments as fp8launch's optimizer keeps them (launcher/train/optim_lowbit.py)."""


def tp_comm(plan: Plan) -> str:
    """The dtype of the tensor-parallel all-gathers and reduce-scatters (launcher/train/parallel/tensor_parallel.py)."""
    p = plan.precision
    hp = p.compute_dtype
    b = backend_of(p)
    if b is not None and b.float8_tp(p):
        return (f"all-gathers in fp8 (torchao Float8 TP styles: e4m3 activations forward, e5m2 gradients backward); "
                f"reduce-scatters and the logits all-gather in {hp}")
    if b is not None and b.float8_tp_recipes:
        return (f"{hp} all-gathers and reduce-scatters ({b.name} has float8 TP for {' and '.join(b.float8_tp_recipes)} only; "
                "rule TP-ROWWISE-BF16-COMM)")
    return f"{hp} all-gathers and reduce-scatters"


def _msamp(plan: Plan) -> bool:
    """MS-AMP's ScalingTensor weights, gradients and master copy."""
    b = backend_of(plan.precision)
    return b is not None and b.scaling_tensors


def _stored(plan: Plan, rows: dict) -> str:
    dtype = rows["params"].dtype
    if dtype != "fp8":
        return dtype
    return "fp8 weights with scales (ScalingTensor)" if _msamp(plan) else "fp8 (quantized_model_init)"


def _master(plan: Plan, rows: dict) -> str:
    row = rows.get("master_weights")
    if row is None and plan.precision.master_weights == "bf16":
        return "bf16: the stored weights, updated with stochastic rounding (no fp32 copy)"
    if row is None:  # the optimizer steps the stored weights themselves
        return f"{rows['params'].dtype} (the stored weights)"
    if _msamp(plan):
        return row.dtype if row.dtype == "fp32" else f"{row.dtype} with scale"
    if plan.distributed.strategy == "deepspeed":
        return f"{row.dtype} (in the ZeRO optimizer)"
    return f"{row.dtype} (TE FusedAdam's master copy of the fp8 weights)"


def _states(row) -> str:
    if not row.bytes_per_param:
        return "none (plain SGD)"
    if row.dtype == "fp8+fp16":
        return "fp8 first moment, fp16 second moment"
    return _STATES.get(row.dtype, row.dtype)
