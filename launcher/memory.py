"""Bytes per GPU of the model states (parameters, gradients, master weights, optimizer states)
for a plan's precision and sharding. Torch-free: `fp8launch plan` prints it.

Activations are not model states and are not estimated here: they depend on the model's code,
sequence length and activation checkpointing; the run's peak memory reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import Plan

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
STATES_PER_PARAM = {"adamw": 2, "adam": 2, "sgd": 0}  # exp_avg + exp_avg_sq; plain SGD (no momentum) keeps none


@dataclass(frozen=True, slots=True)
class MemoryRow:
    name: str
    dtype: str
    bytes_per_param: float
    """Bytes per model parameter before sharding."""
    shards: int
    """How many ranks split it (1 = replicated)."""
    offloaded: bool = False
    layout: str = ""
    """How the shards are laid out, for the text (e.g. "dp 4 x tp 2"); empty for a 1D split."""

    def bytes_per_gpu(self, params: int) -> float:
        return 0.0 if self.offloaded else params * self.bytes_per_param / self.shards


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    params: int
    rows: tuple[MemoryRow, ...]

    @property
    def total_bytes(self) -> float:
        return sum(r.bytes_per_gpu(self.params) for r in self.rows)

    def lines(self) -> list[str]:
        gib = 1024**3
        out = [f"model states per GPU for {self.params / 1e9:.3g}B parameters (activations not included):"]
        for r in self.rows:
            where = "offloaded to CPU" if r.offloaded else (
                f"/ {r.shards} ranks{f' = {r.layout}' if r.layout else ''}" if r.shards > 1 else "replicated")
            out.append(f"    {r.name:<17} {r.dtype:<8} {r.bytes_per_gpu(self.params) / gib:8.2f} GiB  ({r.bytes_per_param:g} B/param, {where})")
        out.append(f"    {'total':<17} {'':<8} {self.total_bytes / gib:8.2f} GiB")
        return out


def estimate(plan: Plan, params: int) -> MemoryEstimate:
    """Model-state bytes per GPU for `params` parameters trained as `plan` says."""
    p, d = plan.precision, plan.distributed
    n = plan.world_size
    states = STATES_PER_PARAM[plan.train.optimizer]
    hp = p.compute_dtype
    rows: list[MemoryRow]

    if p.fp8 and p.backend == "msamp":
        # MS-AMP keeps FP8 weights and gradients (ScalingTensor); O2+ also FP16 master weights and
        # FP8 first / FP16 second moments. Under ZeRO (O3 via DeepSpeed) optimizer-side states are sharded.
        opt_shards = n if d.strategy == "deepspeed" and d.deepspeed.zero_stage >= 1 else 1
        if p.msamp.opt_level == "O1":
            master, opt = MemoryRow("master_weights", "fp32", 4, opt_shards), MemoryRow("optimizer_states", "fp32", 4 * states, opt_shards)
        else:
            master, opt = MemoryRow("master_weights", "fp16", 2, opt_shards), MemoryRow("optimizer_states", "fp8+fp16", 3, opt_shards)
        rows = [MemoryRow("params", "fp8", 1, 1), MemoryRow("grads", "fp8", 1, 1), master, opt]
    elif d.strategy == "fsdp2":
        # FSDP2 shards the fp32 parameters, their gradients and the optimizer states; the compute-dtype
        # copy exists only for the blocks being all-gathered.
        # With tensor parallelism (2D mesh) TP splits each Linear weight over tp ranks and FSDP2 shards
        # those pieces over dp ranks: dp x tp = world size pieces (the norm weights, replicated over
        # tp, are a negligible exception).
        off = d.fsdp2.cpu_offload
        tp = d.tensor_parallel
        n = d.data_parallel * tp
        layout = f"dp {d.data_parallel} x tp {tp}" if tp > 1 else ""
        rows = [MemoryRow("params", "fp32", 4, n, off, layout), MemoryRow("grads", "fp32", 4, n, off, layout),
                MemoryRow("optimizer_states", "fp32", 4 * states, n, off, layout)]
    elif d.strategy == "deepspeed":
        z, ds = d.deepspeed.zero_stage, d.deepspeed
        low = hp in ("bf16", "fp16")
        param_dtype = hp if low else "fp32"
        rows = [MemoryRow("params", param_dtype, BYTES[param_dtype], n if z >= 3 else 1, ds.offload_param != "none"),
                MemoryRow("grads", param_dtype, BYTES[param_dtype], n if z >= 2 else 1)]
        if low:
            rows.append(MemoryRow("master_weights", "fp32", 4, n if z >= 1 else 1, ds.offload_optimizer != "none"))
        rows.append(MemoryRow("optimizer_states", "fp32", 4 * states, n if z >= 1 else 1, ds.offload_optimizer != "none"))
    else:  # DDP: everything replicated; autocast computes in the low dtype from fp32 weights
        rows = [MemoryRow("params", "fp32", 4, 1), MemoryRow("grads", "fp32", 4, 1), MemoryRow("optimizer_states", "fp32", 4 * states, 1)]

    if p.fp8 and p.backend == "te" and p.te.fp8_params:
        # quantized_model_init keeps FP8 weights; the optimizer keeps fp32 master copies.
        rows = [MemoryRow("params", "fp8", 1, rows[0].shards, rows[0].offloaded),
                MemoryRow("master_weights", "fp32", 4, rows[-1].shards, rows[-1].offloaded)] + [r for r in rows if r.name not in ("params", "master_weights")]
    return MemoryEstimate(params, tuple(rows))


def model_params(model: str) -> int | None:
    """Parameter count of a builtin model spec (`builtin:NAME[?layers=N]`), else None (use --params)."""
    if not model.startswith("builtin:"):
        return None
    from .train.factory import InputError
    from .train.models.config import param_count, parse_builtin

    try:
        return param_count(parse_builtin(model))
    except InputError:  # a bad name: planning reports it with did-you-mean; no estimate here
        return None
