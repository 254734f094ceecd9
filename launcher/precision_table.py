"""What runs in which dtype, for a plan: the rows of an MS-AMP-style precision chart.

Pure data from the Plan; the entrypoint reports what it really converted at run time.
"""

from __future__ import annotations

import typing

if typing.TYPE_CHECKING:
    from .plan import Plan

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

_TORCHAO_GEMM = {
    "tensorwise": "fp8: e4m3 inputs/weights, e5m2 output grads, per-tensor scales",
    "rowwise": "fp8: e4m3 everywhere, per-row scales (power of 2)",
    "rowwise_with_gw_hp": "fp8: e4m3 per-row scales; weight-grad GEMM in {hp}",
}
_TE_GEMM = {
    "delayed": "fp8 {fmt}, per-tensor scales from amax history",
    "current": "fp8 {fmt}, per-tensor current scales",
    "block": "fp8 {fmt}, 1x128/128x128 block scales",
    "mxfp8": "mxfp8 (e4m3, 1x32 e8m0 block scales)",
    "nvfp4": "nvfp4 (e2m1, 1x16 block scales)",
}


def precision_table(plan: Plan) -> dict[str, str]:
    """{row: dtype description} for the plan's precision, backend and strategy."""
    p, d = plan.precision, plan.distributed
    hp = p.compute_dtype
    stored = "fp32"
    master = "fp32 (the stored weights)"
    states = "fp32" if plan.train.optimizer != "sgd" else "none (plain SGD)"
    gemm = hp
    weight_comm = "none (replicated)"
    grad_reduce = "fp32"

    if d.strategy == "ddp":
        grad_reduce = "fp32 (gradients of fp32 weights)"
    elif d.strategy == "fsdp2":
        weight_comm = hp
        grad_reduce = d.fsdp2.reduce_dtype
    elif d.strategy == "deepspeed":
        if hp in ("bf16", "fp16"):
            stored = hp
            master = "fp32 (in the ZeRO optimizer)"
        grad_reduce = hp
        weight_comm = hp if d.deepspeed.zero_stage == 3 else "none (replicated)"

    if p.fp8 and p.backend == "torchao":
        gemm = _TORCHAO_GEMM[p.torchao.recipe].format(hp=hp)
        if p.torchao.fsdp_float8_all_gather and d.strategy == "fsdp2":
            weight_comm = "fp8 e4m3 (float8 all-gather)"
    elif p.fp8 and p.backend == "te":
        gemm = _TE_GEMM[p.te.recipe].format(fmt="e4m3 fwd / e5m2 grads" if p.te.fp8_format == "HYBRID" else "e4m3")
        if p.te.fp8_params:
            stored = "fp8 (quantized_model_init)"
            if d.strategy == "deepspeed" and hp in ("bf16", "fp16"):
                master = "fp32 (in the ZeRO optimizer)"
            else:  # a torch optimizer keeps no copy: rule TE-FP8-PARAMS-NO-MASTER refuses the plan
                master = "none: the torch optimizer would step the fp8 weights (refused: TE-FP8-PARAMS-NO-MASTER)"
    elif p.fp8 and p.backend == "msamp":
        gemm = "fp8 e4m3 fwd / e5m2 grads (MS-AMP)"
        stored = "fp8 weights with scales (ScalingTensor)"
        grad_reduce = "fp8 (MS-AMP scaled all-reduce)"
        if p.msamp.opt_level == "O1":
            master = "fp32"
        else:
            master = "fp16 with scale"
            states = "fp8 first moment, fp16 second moment"

    table = {
        "gemm": gemm,
        "other_compute": hp,
        "weights": stored,
        "weight_comm": weight_comm,
        "grad_reduce": grad_reduce,
        "weight_grads": "fp8 (MS-AMP)" if p.fp8 and p.backend == "msamp" else grad_reduce.split(" ")[0],
        "master_weights": master,
        "optimizer_states": states,
    }
    if d.tensor_parallel > 1:
        table["tp_comm"] = tp_comm(plan)
    return table


def tp_comm(plan: Plan) -> str:
    """The dtype of the tensor-parallel all-gathers and reduce-scatters (launcher/train/tensor_parallel.py)."""
    p = plan.precision
    hp = p.compute_dtype
    if p.fp8 and p.backend == "torchao" and p.torchao.recipe == "tensorwise":
        return (f"all-gathers in fp8 (torchao Float8 TP styles: e4m3 activations forward, e5m2 gradients backward); "
                f"reduce-scatters and the logits all-gather in {hp}")
    if p.fp8 and p.backend == "torchao":
        return f"{hp} all-gathers and reduce-scatters (torchao has float8 TP for tensorwise only; rule TP-ROWWISE-BF16-COMM)"
    return f"{hp} all-gathers and reduce-scatters"
