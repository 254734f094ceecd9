"""The gradient reduction's payload (`precision.grad_reduce`), and the bytes each rank sends for it.

    reduction = install(engine_model, plan, strategy)   # before the first backward; the engine keeps it
    ...backward...
    sent = reduction.take(engine)                       # bytes this rank sent for this step's gradients
    reduction.payload                                   # "fp32" | "bf16" | "fp8" as built (the start record's effects)

- DDP: a communication hook (torch.distributed.algorithms.ddp_comm_hooks' contract: hook(state, bucket) -> a Future
  of the bucket's averaged gradients). bf16 / fp32: the bucket cast and all-reduced as torch's compress hooks do.
  fp8: a reduce-scatter and an all-gather, both in FP8: each rank's bucket is cut in world-size chunks, each chunk
  quantized to e4m3 with one fp32 scale per REDUCE_BLOCK values and sent to the rank that owns it (all_to_all);
  the owner sums what it received in fp32, divides by the world size, quantizes its chunk again and all-gathers it.
  Every rank decodes the same gathered codes, so the replicas stay identical. Synchronous inside the hook.
- FSDP2: a custom reduce-scatter (`FSDPModule.set_custom_reduce_scatter`; FSDP2 is asked for SUM reductions only,
  `set_force_sum_reduction_for_comms`, and divides afterwards itself). fp8: the all_to_all of FP8 chunks and the
  fp32 sum above; FSDP2 keeps the result sharded, so there is no all-gather. bf16 / fp32: a reduce-scatter of the
  gradients cast to that dtype.
- auto: the engine's own reduction, counted from the tensors it reduces (DDP: every gradient, all-reduced;
  FSDP2: each parameter group's padded reduce-scatter input in its reduce dtype; DeepSpeed: every parameter in its
  communication dtype, per micro-batch under ZeRO-2/3).

Bytes follow the ring convention of launcher/planning/levels.py: a collective over n ranks sends (n - 1) / n of
the reduce-scatter input or all-gather output (twice for an all-reduce) from each rank. gloo has no FP8 dtype: the
codes travel as uint8.
"""

from __future__ import annotations

import math
import typing

import torch
import torch.distributed as dist

from launcher.errors import LauncherError
from launcher.planning.levels import REDUCE_BLOCK
from launcher.train.compat import all_gather_single, reduce_scatter_single

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype in the spec's words (fp32, bf16, fp16), else torch's own name."""
    return NAMES.get(dtype, str(dtype).removeprefix("torch."))


def share(world: int) -> float:
    """The part of a reduce-scatter's input (an all-gather's output) that leaves each of `world` ranks."""
    return (world - 1) / world if world > 1 else 0.0


# --- FP8 blocks ------------------------------------------------------------------------------------------

def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, n) values -> (codes: uint8 (rows, n padded to REDUCE_BLOCK), scales: fp32 (rows, blocks)): e4m3 codes
    of each block divided by its scale, amax / 448 (1 for an all-zero block). Non-finite values stay non-finite."""
    rows, n = x.shape
    blocks = -(-n // REDUCE_BLOCK)
    padded = torch.zeros(rows, blocks * REDUCE_BLOCK, dtype=torch.float32, device=x.device)
    padded[:, :n] = x
    view = padded.view(rows, blocks, REDUCE_BLOCK)
    amax = view.abs().amax(-1)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    codes = (view / scales.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return codes.view(torch.uint8).view(rows, blocks * REDUCE_BLOCK), scales


def dequantize_rows(codes: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
    """The fp32 values (rows, n) of `quantize_rows`' output."""
    rows = codes.shape[0]
    values = codes.view(FP8).float().view(rows, scales.shape[1], REDUCE_BLOCK) * scales.unsqueeze(-1)
    return values.view(rows, -1)[:, :n]


def _payload_bytes(codes: torch.Tensor, scales: torch.Tensor) -> int:
    return codes.numel() * codes.element_size() + scales.numel() * scales.element_size()


def fp8_reduce_scatter(chunks: torch.Tensor, group, meter: "CommMeter") -> torch.Tensor:
    """(world, n) -> this rank's chunk summed over the ranks (fp32, n): every rank sends chunk i to rank i in FP8."""
    world = chunks.shape[0]
    codes, scales = quantize_rows(chunks)
    got_codes, got_scales = torch.empty_like(codes), torch.empty_like(scales)
    dist.all_to_all_single(got_codes.view(-1), codes.view(-1), group=group)
    dist.all_to_all_single(got_scales.view(-1), scales.view(-1), group=group)
    meter.add(share(world) * _payload_bytes(codes, scales))
    return dequantize_rows(got_codes, got_scales, chunks.shape[1]).sum(0)


def fp8_all_reduce(flat: torch.Tensor, group, meter: "CommMeter") -> torch.Tensor:
    """The mean over the ranks of `flat` (N,), fp32: an FP8 reduce-scatter, the fp32 sum divided by the world size,
    then an FP8 all-gather of each rank's chunk; every rank returns the decoded gathered values."""
    world = group.size() if group is not None else dist.get_world_size()
    total = flat.numel()
    n = -(-total // world)
    chunks = torch.zeros(world * n, dtype=torch.float32, device=flat.device)
    chunks[:total] = flat
    mine = fp8_reduce_scatter(chunks.view(world, n), group, meter).div_(world)
    codes, scales = quantize_rows(mine.unsqueeze(0))
    all_codes = torch.empty(world * codes.numel(), dtype=torch.uint8, device=flat.device)
    all_scales = torch.empty(world * scales.numel(), dtype=torch.float32, device=flat.device)
    all_gather_single(all_codes, codes.view(-1), group=group)
    all_gather_single(all_scales, scales.view(-1), group=group)
    meter.add(share(world) * world * _payload_bytes(codes, scales))
    return dequantize_rows(all_codes.view(world, -1), all_scales.view(world, -1), n).reshape(-1)[:total]


# --- the meter and the reductions the engines keep ---------------------------------------------------------

class CommMeter:
    """Bytes this rank sent for gradient reduction since the last `take()`, added where they are sent."""

    def __init__(self):
        self.sent = 0.0

    def add(self, nbytes: float) -> None:
        self.sent += nbytes

    def take(self) -> int:
        sent, self.sent = self.sent, 0.0
        return int(round(sent))


class HookState:
    """The DDP hook's state: its payload, process group and meter (what `payload_of` reads back)."""

    def __init__(self, payload: str, group, meter: CommMeter):
        self.payload = payload
        self.group = group
        self.meter = meter


def ddp_hook(state: HookState, bucket):  # no annotations: DDP compares them with its own (strings here would fail)
    """A DDP communication hook: the bucket's gradients averaged over the ranks, sent in `state.payload`; returns a
    torch.futures.Future of the bucket's buffer."""
    group = state.group if state.group is not None else dist.group.WORLD
    world = group.size()
    buffer = bucket.buffer()
    if state.payload == "fp8":
        buffer.copy_(fp8_all_reduce(buffer, group, state.meter))
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(buffer)
        return done
    sent = buffer.to(DTYPES[state.payload]).div_(world)  # divide first, as torch's compress hooks do (range)
    state.meter.add(2 * share(world) * sent.numel() * sent.element_size())

    def back(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(sent, group=group, async_op=True).get_future().then(back)


def _reduce_scatter_base():
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    return ReduceScatter


def reduce_scatter_class():
    """FSDP2's ReduceScatter interface implemented with a payload (built once, on first use)."""
    global _REDUCE_SCATTER
    if _REDUCE_SCATTER is None:
        base = _reduce_scatter_base()

        class PayloadReduceScatter(base):
            """FSDP2's reduce-scatter with its payload on the wire: fp8 (FP8 chunks, fp32 sum) or a cast to bf16 / fp32."""

            def __init__(self, payload: str, meter: CommMeter):
                self.payload = payload
                self.meter = meter

            def allocate(self, size, *, dtype, device):
                return torch.empty(*size, dtype=dtype, device=device)

            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                world = group.size()
                if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                    raise LauncherError(f"precision.grad_reduce: FSDP2 asked the custom reduce-scatter for {op}, which it does not "
                                        "implement (it sums; FSDP2 divides); fix: report this with your torch version")
                n = output_tensor.numel()
                if self.payload == "fp8":
                    summed = fp8_reduce_scatter(input_tensor.view(world, n), group, self.meter)
                else:
                    sent = input_tensor.to(DTYPES[self.payload])
                    summed = torch.empty(n, dtype=sent.dtype, device=sent.device)
                    reduce_scatter_single(summed, sent, op=dist.ReduceOp.SUM, group=group)
                    self.meter.add(share(world) * sent.numel() * sent.element_size())
                if op == dist.ReduceOp.AVG:
                    summed = summed / world
                output_tensor.copy_(summed.view(output_tensor.shape))
                return None

        _REDUCE_SCATTER = PayloadReduceScatter
    return _REDUCE_SCATTER


_REDUCE_SCATTER = None


class GradReduction:
    """What an engine keeps: the payload as built and how many bytes a step sent."""

    def __init__(self, payload: str, meter: CommMeter | None = None, counted=None):
        self.payload = payload
        self.meter = meter
        self._counted = counted

    def take(self, engine) -> int:
        """Bytes this rank sent for gradient reduction since the last call: metered where a hook or a custom
        reduce-scatter sent them, else counted from the tensors the engine's own reduction reduces."""
        if self.meter is not None:
            return self.meter.take()
        return int(round(self._counted(engine))) if self._counted is not None else 0


def install(model, plan: Plan, strategy: str, *, world_size: int) -> GradReduction:
    """The reduction `plan` asks for on the wrapped `model` (DDP module, FSDP2 root, DeepSpeed engine)."""
    asked = plan.precision.grad_reduce
    if strategy == "ddp":
        if asked == "auto":
            return GradReduction(_ddp_default_payload(model), counted=_ddp_default_bytes)
        meter = CommMeter()
        model.register_comm_hook(HookState(asked, None, meter), ddp_hook)
        return GradReduction(asked, meter)
    if strategy == "fsdp2":
        if asked == "auto":
            return GradReduction(fsdp2_payload(model), counted=_fsdp2_default_bytes)
        from torch.distributed.fsdp import FSDPModule

        meter = CommMeter()
        comm = reduce_scatter_class()(asked, meter)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                state = m._get_fsdp_state()
                if len(getattr(state, "_fsdp_param_groups", [])) > 1:
                    raise LauncherError("precision.grad_reduce: an FSDP2 unit with several parameter groups (per-parameter meshes) "
                                        "takes no custom reduce-scatter; fix: set precision.grad_reduce = \"auto\"")
                m.set_custom_reduce_scatter(comm)
                m.set_force_sum_reduction_for_comms(True)
        return GradReduction(asked, meter)
    if asked != "auto":  # planning refuses it (GRAD-REDUCE-DEEPSPEED); a hand-edited plan.json could hold it
        from launcher.planning.rules import Facts, rule_error

        raise rule_error("GRAD-REDUCE-DEEPSPEED", Facts(plan=plan))
    stage = plan.distributed.deepspeed.zero_stage
    accum = plan.train.grad_accum_steps
    return GradReduction(dtype_name(model.communication_data_type),
                         counted=lambda engine: _deepspeed_bytes(engine, stage, accum, world_size))


# --- what the engines' own reductions send, from the tensors they reduce ------------------------------------

def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _ddp_default_payload(model) -> str:
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    return "+".join(sorted(dtype_name(d) for d in dtypes)) or "fp32"


def _ddp_default_bytes(engine) -> float:
    """DDP all-reduces every gradient (in its dtype) once per step."""
    grads = [p.grad for p in engine.model.parameters() if p.requires_grad and p.grad is not None]
    return 2 * share(_world()) * sum(g.numel() * g.element_size() for g in grads)


def fsdp2_groups(model) -> list:
    """FSDP2's parameter groups of every unit of `model`."""
    from torch.distributed.fsdp import FSDPModule

    groups = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            found = getattr(state, "_fsdp_param_groups", None)
            groups += found if found is not None else [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
    return groups


def fsdp2_payload(model) -> str:
    """What FSDP2 reduce-scatters: our custom reduce-scatter's payload, else its MixedPrecisionPolicy's reduce dtype
    (the gradients' dtype, param_dtype, where it has none)."""
    found = set()
    for group in fsdp2_groups(model):
        comm = group._reduce_scatter_comm
        if isinstance(getattr(comm, "payload", None), str):
            found.add(comm.payload)
            continue
        params = [p for p in group.fsdp_params if p.sharded_param.requires_grad]
        for p in params:
            mp = p.mp_policy  # each parameter's, as fully_shard resolved it (torch 2.15 keeps none on the group)
            found.add(dtype_name(mp.reduce_dtype or mp.param_dtype or p.sharded_param.dtype))
    return "+".join(sorted(found)) or "fp32"


def _fsdp2_default_bytes(engine) -> float:
    """Each FSDP2 group reduce-scatters its trainable parameters' padded unsharded gradients, once per step."""
    total = 0.0
    for group in fsdp2_groups(engine.model):
        world = getattr(group.mesh_info, "shard_mesh_size", None) or _world()
        for p in group.fsdp_params:
            if not p.sharded_param.requires_grad:
                continue
            dtype = getattr(p, "reduce_dtype", None) or getattr(p, "param_dtype", None) or p.sharded_param.dtype
            total += share(world) * world * math.prod(p.padded_sharded_param_size) * torch.empty((), dtype=dtype).element_size()
    return total


def _deepspeed_bytes(engine, stage: int, accum: int, world: int) -> float:
    """DeepSpeed reduces every trainable parameter's gradient in its communication dtype: all-reduced at the boundary
    (ZeRO-0), reduce-scattered at the boundary (ZeRO-1) or in every micro-batch's backward (ZeRO-2/3)."""
    ds = engine.model
    size = torch.empty((), dtype=ds.communication_data_type).element_size()
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in ds.module.parameters() if p.requires_grad)
    if stage == 0:
        return 2 * share(world) * numel * size
    return (accum if stage >= 2 else 1) * share(world) * numel * size


def payload_of(engine) -> str:
    """The payload of the gradient reduction as built, read from the live objects: the DDP hook's state, FSDP2's
    reduce-scatter comm and mixed-precision policy, DeepSpeed's communication dtype."""
    if engine.name == "ddp":
        for hook, state in getattr(engine.model, "_comm_hooks", []):
            if isinstance(state, HookState):
                return state.payload
        return _ddp_default_payload(engine.model)
    if engine.name == "fsdp2":
        return fsdp2_payload(engine.model)
    if engine.name == "deepspeed":
        return dtype_name(engine.model.communication_data_type)
    return "fp32"
