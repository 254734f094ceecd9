"""FSDP2 (`torch.distributed.fsdp.fully_shard`): the token embedding, one unit per transformer
block, the final norm with the output head, then the root (the units fsdp2.json lists),
configured from the generated fsdp2.json (mesh, MixedPrecisionPolicy, CPUOffloadPolicy,
reshard_after_forward). The optimizer is built on the sharded (DTensor) parameters."""

from __future__ import annotations

import contextlib
import typing
from typing import ContextManager

import torch
from torch import nn

from launcher.errors import LauncherError
from launcher.train.models import edge_units, transformer_blocks
from launcher.train.optim import build_optimizer, build_scheduler
from launcher.train.precision.module_dtype import DTYPES, dtype_of

from .base import Engine

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.train.materialize import Pending
    from launcher.train.parallel.distributed import DistEnv
    from launcher.train.precision import Precision


class FSDP2Engine(Engine):
    name = "fsdp2"

    def micro_batch(self, last: bool) -> ContextManager:
        # Non-final micro-batches keep unsharded gradients locally instead of reduce-scattering.
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise LauncherError(f"fsdp2.json names dtype {name!r}, which torch does not have; fix: regenerate it with `fp8launch plan SPEC`")
    return dtype


def fsdp2_kwargs(config: dict, precision: Precision, device: torch.device) -> dict:
    """fully_shard's mp_policy and offload_policy from fsdp2.json, checked against the precision backend."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    mp = config["mixed_precision"]
    param_dtype = _dtype(mp["param_dtype"])
    expected = precision.param_dtype or torch.float32
    if param_dtype != expected:
        raise LauncherError(
            f"fsdp2.json has param_dtype {mp['param_dtype']} but the precision in plan.json computes in {expected}; "
            "fix: regenerate the plan folder with `fp8launch plan SPEC` (do not edit generated files)"
        )
    if bool(config["float8"]["enable_fsdp_float8_all_gather"]) != bool(precision.fsdp_float8_all_gather):
        raise LauncherError(
            f"fsdp2.json has enable_fsdp_float8_all_gather = {config['float8']['enable_fsdp_float8_all_gather']} but the "
            f"precision backend converted the model with {precision.fsdp_float8_all_gather}; "
            "fix: regenerate the plan folder with `fp8launch plan SPEC` (do not edit generated files)"
        )
    return {
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=_dtype(mp["reduce_dtype"])),
        # Pinned host memory needs an accelerator; a CPU run's "offload" is plain host memory.
        "offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda") if config["cpu_offload"] else OffloadPolicy(),
    }


def wrap_fsdp2(model: nn.Module, plan: Plan, precision: Precision, config: dict, *, env: DistEnv,
               blocks: list[nn.Module] | None = None, pending: Pending | None = None) -> FSDP2Engine:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from launcher.train.parallel.distributed import device_mesh
    from launcher.train.parallel.tensor_parallel import parallelize

    d = plan.distributed
    tp, pp, cp = d.tensor_parallel, d.pipeline_parallel, d.context_parallel
    shape = tuple(config["mesh"]["shape"])
    planned = d.layout(env.world_size).mesh_shape
    if shape != planned:
        degrees = "".join(f" and {k} {v}" for k, v in (("tensor_parallel", tp), ("context_parallel", cp), ("pipeline_parallel", pp))
                          if v > 1)
        raise LauncherError(
            f"fsdp2.json shards over a mesh of {list(shape)} but this job has world size {env.world_size}{degrees}; "
            "fix: regenerate the plan for this many nodes and processes (`fp8launch run` does it)"
        )
    ep = plan.distributed.expert_parallel
    if ep > 1 and tp > 1:
        raise LauncherError(f"distributed.expert_parallel = {ep} with distributed.tensor_parallel = {tp}: fp8launch does not "
                            "compose expert and tensor parallelism; fix: set one of them to 1", rule="EP-TENSOR-PARALLEL")
    if ep > 1 and pp > 1:  # planning refuses it; a hand-edited plan.json could hold it
        from launcher.planning.rules import Facts, rule_error

        raise rule_error("PP-EXPERT-PARALLEL", Facts(plan=plan))
    if ep > 1:  # launcher/train/parallel/expert_parallel.py: experts over ("efsdp", "ep"), dense parameters over both flattened
        from launcher.train.parallel.expert_parallel import ep_mesh

        emesh, mesh = ep_mesh(env, ep)
    else:  # pp x dp_shard x tp; with pipeline parallelism (launcher/train/parallel/pipeline.py) this rank's stage
        pmesh = mesh = device_mesh(env, d)
    kwargs = fsdp2_kwargs(config, precision, env.device)
    if pending is None and not config["cpu_offload"]:
        model.to(env.device)
    if tp > 1:  # tensor parallel inside each data-parallel group, then FSDP2 over the data-parallel dimension
        parallelize(model, plan, mesh["tp"])
    cp_mesh = mesh["cp"] if cp > 1 else None
    if cp > 1:  # FSDP2 over dp_shard x cp (torchtitan): a CP group's ranks hold different tokens, so they average gradients
        mesh = mesh["dp_shard_cp"]
    elif tp > 1 or pp > 1:
        mesh = mesh["dp_shard"]
    blocks = transformer_blocks(model) if blocks is None else blocks
    reshard = bool(config["reshard_after_forward"])
    if ep > 1:  # the experts' own FSDP2 units first, over the ranks holding the same experts
        from launcher.train.parallel.expert_parallel import apply_expert_parallel, shard_experts

        shard_experts(apply_expert_parallel(model, emesh["ep"]), emesh["efsdp"], env.world_size, reshard_after_forward=reshard, **kwargs)
    # The units fsdp2.json lists; a plan written before "embedding" and "output" were units keeps its two.
    units = config.get("units", ["transformer_block", "root"])
    embedding, head = edge_units(model) if {"embedding", "output"} & set(units) else (None, [])
    for module in model.modules():  # Linears a precision rule gives a dtype of their own: their own units, in that dtype
        if dtype_of(module) is not None:
            own = MixedPrecisionPolicy(param_dtype=DTYPES[dtype_of(module)], reduce_dtype=torch.float32)
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard, **{**kwargs, "mp_policy": own})
    if embedding is not None and "embedding" in units:
        fully_shard(embedding, mesh=mesh, reshard_after_forward=reshard, **kwargs)
    for i, block in enumerate(blocks):
        # The last block's parameters are all-gathered again at once by backward: keep them (torchtitan).
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard and i < len(blocks) - 1, **kwargs)
    if head and "output" in units:
        # The final norm and the head: backward needs them first, right after forward: kept gathered (torchtitan).
        fully_shard(head, mesh=mesh, reshard_after_forward=False, **kwargs)
    from launcher.train.parallel.pipeline import stage_roots

    for root in stage_roots(model):  # the model; with several pipeline stages a rank, its views (as torchtitan's chunks)
        fully_shard(root, mesh=mesh, reshard_after_forward=reshard, **kwargs)
    if pending is not None:  # meta-built: each rank allocates and initialises only its shards
        pending(model, torch.device("cpu") if config["cpu_offload"] else env.device)
    if cp_mesh is not None:  # each attention's rotary angles at the sequence positions this rank holds
        from launcher.train.parallel.context import apply_context_parallel

        apply_context_parallel(model, cp_mesh, plan.train.seq_len)
    optimizer = build_optimizer(model.parameters(), plan.train, plan.precision)
    model, optimizer = precision.wrap_optimizer(model, optimizer)
    from launcher.train.parallel.grad_reduce import install

    reduction = install(model, plan, "fsdp2", world_size=env.world_size)  # a custom reduce-scatter unless grad_reduce = "auto"
    parts = dict(model=model, module=model, optimizer=optimizer, scheduler=build_scheduler(optimizer, plan.train),
                 precision=precision, accum_steps=plan.train.grad_accum_steps, grad_reduction=reduction)
    if pp > 1:
        from launcher.train.loop import loss_function
        from launcher.train.parallel.pipeline import PipelineEngine, build_schedule

        stages, schedule = build_schedule(model, plan, env, pmesh, loss_function(plan))
        stage_ranks = pmesh["dp_shard_tp" if tp > 1 else "dp_shard"].get_group()  # the ranks that hold this stage
        return PipelineEngine(stages=stages, schedule=schedule, pp_group=pmesh["pp"].get_group(), balance_group=stage_ranks, **parts)
    return FSDP2Engine(**parts, cp_mesh=cp_mesh)
