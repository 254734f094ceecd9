"""FSDP2 (`torch.distributed.fsdp.fully_shard`): the token embedding, one unit per transformer
block, the final norm with the output head, then the root (the units fsdp2.json lists),
configured from the generated fsdp2.json (mesh, MixedPrecisionPolicy, CPUOffloadPolicy,
reshard_after_forward). The optimizer is built on the sharded (DTensor) parameters.

wrap_fsdp2 runs named steps in torchtitan's order: check the layout against fsdp2.json, build the meshes
(launcher/planning/layout.py: pp x dp_shard x cp x tp, or expert parallelism's efsdp x ep), apply tensor parallelism,
expert parallelism, FSDP2, context parallelism, then build the optimizer and the engine: the pipeline's
(launcher/train/engines/pipeline.py) where the model was cut to pipeline stages."""

from __future__ import annotations

import contextlib
import typing
from dataclasses import dataclass
from typing import ContextManager

import torch
from torch import nn

from launcher.errors import LauncherError
from launcher.train.loss import loss_function
from launcher.train.models import edge_units, transformer_blocks
from launcher.train.optim import build_optimizer, build_scheduler
from launcher.train.precision.module_dtype import DTYPES, dtype_of

from .base import Engine

if typing.TYPE_CHECKING:
    from launcher.planning.layout import Layout
    from launcher.planning.plan import Plan
    from launcher.train.materialize import Pending
    from launcher.train.parallel.distributed import DistEnv
    from launcher.train.parallel.pipeline import StageCut
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


@dataclass(frozen=True, slots=True)
class Meshes:
    """The device meshes one FSDP2 job uses."""

    job: typing.Any
    """The job's mesh (pp x dp_shard x cp x tp), or expert parallelism's dense one (every rank, flattened)."""
    shard: typing.Any
    """What FSDP2 shards the dense parameters over."""
    cp: typing.Any = None
    """The context-parallel dim (context_parallel > 1)."""
    experts: typing.Any = None
    """Expert parallelism's efsdp x ep (expert_parallel > 1)."""


def wrap_fsdp2(model: nn.Module, plan: Plan, precision: Precision, config: dict, *, env: DistEnv, layout: Layout,
               blocks: list[nn.Module] | None = None, pending: Pending | None = None, cut: StageCut | None = None) -> FSDP2Engine:
    """Shard `model` (this rank's pipeline stages where `cut`) as fsdp2.json says and wrap it in its engine."""
    check_layout(layout, config, plan)
    meshes = build_meshes(layout, env)
    kwargs = fsdp2_kwargs(config, precision, env.device)
    if pending is None and not config["cpu_offload"]:
        model.to(env.device)
    if layout.tp > 1:  # tensor parallel inside each data-parallel group, then FSDP2 over the data-parallel dimension
        from launcher.train.parallel.tensor_parallel import parallelize

        parallelize(model, plan, meshes.job["tp"])
    reshard = bool(config["reshard_after_forward"])
    if meshes.experts is not None:  # the experts' own FSDP2 units first, over the ranks holding the same experts
        apply_expert_parallel(model, meshes.experts, env.world_size, reshard, kwargs)
    roots = apply_fsdp2(model, transformer_blocks(model) if blocks is None else blocks, config, meshes.shard, kwargs, cut)
    if pending is not None:  # meta-built: each rank allocates and initialises only its shards
        pending(model, torch.device("cpu") if config["cpu_offload"] else env.device)
    if meshes.cp is not None:  # each attention's rotary angles at the sequence positions this rank holds
        from launcher.train.parallel.context import apply_context_parallel

        apply_context_parallel(model, meshes.cp, plan.train.seq_len)
    parts = engine_parts(model, plan, precision, layout)
    if cut is not None:
        return build_pipeline(parts, roots, cut, plan, env.device, meshes.job, layout)
    return FSDP2Engine(**parts, cp_mesh=meshes.cp)


def check_layout(layout: Layout, config: dict, plan: Plan) -> None:
    """The job's layout checked against fsdp2.json's mesh and the compositions a hand-edited plan.json could hold that
    planning refuses (EP-TENSOR-PARALLEL, PP-EXPERT-PARALLEL: `plan` names them)."""
    from launcher.planning.rules import Facts, rule_error

    shape = tuple(config["mesh"]["shape"])
    if shape != layout.mesh_shape:
        degrees = "".join(f" and {k} {v}" for k, v in (("tensor_parallel", layout.tp), ("context_parallel", layout.cp),
                                                       ("pipeline_parallel", layout.pp)) if v > 1)
        raise LauncherError(
            f"fsdp2.json shards over a mesh of {list(shape)} but this job has world size {layout.world_size}{degrees}; "
            "fix: regenerate the plan for this many nodes and processes (`fp8launch run` does it)"
        )
    for rule, other in (("EP-TENSOR-PARALLEL", layout.tp), ("PP-EXPERT-PARALLEL", layout.pp)):
        if layout.ep > 1 and other > 1:
            raise rule_error(rule, Facts(plan=plan))


def build_meshes(layout: Layout, env: DistEnv) -> Meshes:
    """The job's mesh from the layout (launcher/train/parallel/distributed.py device_mesh), or with expert parallelism
    (launcher/train/parallel/expert_parallel.py) experts over efsdp x ep and dense parameters over both flattened."""
    if layout.ep > 1:
        from launcher.train.parallel.expert_parallel import ep_mesh

        experts, dense = ep_mesh(env, layout)
        return Meshes(job=dense, shard=dense, experts=experts)
    from launcher.train.parallel.distributed import device_mesh

    job = device_mesh(env, layout)
    # FSDP2 over dp_shard x cp with context parallel (torchtitan: a CP group's ranks hold different tokens, so they
    # average gradients), over dp_shard with tensor or pipeline parallel, else over the whole (one-dim) mesh
    shard = job[layout.shard_dim] if layout.shard_dim is not None else job
    return Meshes(job=job, shard=shard, cp=job["cp"] if layout.cp > 1 else None)


def apply_expert_parallel(model: nn.Module, experts, world_size: int, reshard: bool, kwargs: dict) -> None:
    """The experts over the ep ranks, each expert's parameters sharded over the efsdp ranks that hold it."""
    from launcher.train.parallel.expert_parallel import apply_expert_parallel as spread
    from launcher.train.parallel.expert_parallel import shard_experts

    shard_experts(spread(model, experts["ep"]), experts["efsdp"], world_size, reshard_after_forward=reshard, **kwargs)


def apply_fsdp2(model: nn.Module, blocks: list[nn.Module], config: dict, mesh, kwargs: dict,
                cut: StageCut | None) -> list[nn.Module]:
    """fully_shard the units fsdp2.json lists, then the roots: the model, or this rank's pipeline stages (views of the
    model with several a rank, as torchtitan's chunks). Returns the roots."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from launcher.train.parallel.pipeline import stage_roots

    reshard = bool(config["reshard_after_forward"])
    # The units fsdp2.json lists; a plan written before "embedding" and "output" were units keeps its two.
    units = config.get("units", ["transformer_block", "root"])
    embedding, head = edge_units(model, stage=cut is not None) if {"embedding", "output"} & set(units) else (None, [])
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
    roots = stage_roots(model, cut) if cut is not None else [model]
    for root in roots:
        fully_shard(root, mesh=mesh, reshard_after_forward=reshard, **kwargs)
    return roots


def engine_parts(model: nn.Module, plan: Plan, precision: Precision, layout: Layout) -> dict:
    """The optimizer on the sharded parameters (the precision backend may wrap it), the lr schedule and the gradient
    reduction (a custom reduce-scatter unless grad_reduce = "auto"): what every FSDP2 engine holds."""
    from launcher.train.parallel.grad_reduce import install

    optimizer = build_optimizer(model.parameters(), plan.train, plan.precision)
    model, optimizer = precision.wrap_optimizer(model, optimizer)
    scheduler = build_scheduler(optimizer, plan.train)
    reduction = install(model, plan, "fsdp2", world_size=layout.world_size)
    return dict(model=model, module=model, optimizer=optimizer, scheduler=scheduler, precision=precision,
                accum_steps=plan.train.grad_accum_steps, grad_reduction=reduction, layout=layout)


def build_pipeline(parts: dict, roots: list[nn.Module], cut: StageCut, plan: Plan, device: torch.device, mesh,
                   layout: Layout) -> FSDP2Engine:
    """The PipelineStages of this rank's sharded stages and the plan's schedule over the pipeline ranks, in their engine;
    MoE load balancing sums over the ranks that hold this stage."""
    from launcher.train.parallel.pipeline import make_schedule

    from .pipeline import PipelineEngine

    pp_group = mesh["pp"].get_group()
    stages, schedule = make_schedule(roots, cut, layout.schedule, plan.pipeline_microbatches, device, pp_group,
                                     loss_function(plan))
    return PipelineEngine(cut=cut, stages=stages, schedule=schedule, pp_group=pp_group,
                          balance_group=mesh[layout.stage_dim].get_group(), **parts)
