"""Pipeline parallelism (distributed.pipeline_parallel) through torch.distributed.pipelining, as torchtitan does it:

- The mesh is pp x dp_shard (x tp) (launcher/train/parallel/distributed.py device_mesh; pp outermost: rank = stage *
  world_size / pp + dp_rank, so that a stage's ranks are adjacent and the stages' point-to-point sends cross nodes).
- Each rank cuts its stage out of the whole builtin decoder, converted to its precision already (so that
  keep_first_last and keep_*_blocks pick the layers of the whole model): its blocks stay under their own indices (a
  ModuleDict), the embedding stays on the first stage, the final norm and the output layer on the last. Every parameter
  keeps its name, so a checkpoint holds the whole model's names, each written by its stage (DCP), and loads into any
  other layout.
- FSDP2 shards the stage over its dp_shard ranks; a PipelineStage and a single-stage schedule (Schedule1F1B, ScheduleGPipe)
  run one optimizer step's micro-batches through the stages. The schedule scales the gradients by its micro-batches
  (the loss is each micro-batch's mean) and reduces them once, after its last backward.
- Several stages a rank (Interleaved1F1B, ZBVZeroBubble: distributed.pipeline.stages_per_rank): the rank's model keeps
  the blocks of all its stages (every name the whole model's: checkpoints, the optimizer, clipping and effects read it as
  one), and each stage is a view of it holding that stage's parts only (the same modules, not copies), its own FSDP2
  root and PipelineStage, as torchtitan's model chunks are; a multi-stage schedule runs them.
- The gradient norm is each stage's norm over its dp_shard ranks, then summed in squares over the pp ranks (torch's
  clip_grad_norm_ sees one stage's parameters only; torchtitan's dist_utils.clip_grad_norm_ does the same).

The loss of a step lives on the last stage's ranks: the others report 0 and the loop divides the sum by the ranks that
hold it.
"""

from __future__ import annotations

import copy
import functools
import typing

import torch
import torch.distributed as dist
from torch import nn

from launcher.errors import LauncherError
from launcher.planning.plan import stage_blocks
from launcher.train.compat import after_shape_inference
from launcher.train.engines.base import Engine, _by_mesh, _total_norm

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.train.parallel.distributed import DistEnv

SCHEDULES = {"1F1B": "Schedule1F1B", "GPipe": "ScheduleGPipe", "Interleaved1F1B": "ScheduleInterleaved1F1B",
             "ZBVZeroBubble": "ScheduleZBVZeroBubble"}
"""distributed.pipeline.schedule -> the torch.distributed.pipelining class."""


def split_for(plan: Plan, n_layers: int) -> tuple[int, ...]:
    """The blocks per stage: the plan's, checked against the model (an hf: / py: model is refused at plan time)."""
    split = plan.distributed.stage_split(n_layers)
    if len(split) != plan.distributed.pipeline_stages or sum(split) != n_layers or min(split) < 1:
        raise LauncherError(f"distributed.pipeline.layers_per_stage {list(split)} does not cut the model's {n_layers} blocks into "
                            f"{plan.distributed.pipeline_stages} stages; fix: regenerate the plan with `fp8launch plan SPEC`",
                            rule="PP-LAYERS")
    return split


def cut_stage(model: nn.Module, stage: int | typing.Sequence[int], split: typing.Sequence[int]) -> nn.Module:
    """Keep what stage `stage` (or the stages) of the builtin decoder holds (in place; the model on the meta device or
    not): its blocks in a ModuleDict under their own indices, the embedding with the first stage, the norm and the head
    with the last. Returns the model, marked with `pipeline_stage` = (its first stage, stages) and `pipeline_cut` =
    (its stages, the split); with several stages `stage_roots` gives one module per stage."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(hasattr(model, n) for n in ("tok_embeddings", "norm", "output")):
        raise LauncherError(f"distributed.pipeline_parallel cuts the builtin decoder only, not a {type(model).__name__}; "
                            "fix: set distributed.pipeline_parallel = 1", rule="PP-MODEL")
    stages = (stage,) if isinstance(stage, int) else tuple(stage)
    _keep(model, layers, [i for s in stages for i in stage_blocks(split, s)], 0 in stages, len(split) - 1 in stages)
    model.pipeline_stage = (stages[0], len(split))
    model.pipeline_cut = (stages, tuple(split))
    return model


def _keep(model: nn.Module, layers, blocks: typing.Sequence[int], first: bool, last: bool) -> None:
    model.layers = nn.ModuleDict({str(i): layers[i] for i in blocks})
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None


def _view(model: nn.Module, stage: int, split: typing.Sequence[int]) -> nn.Module:
    """Stage `stage` of a model cut to several stages: the same object kind, forward and attributes, holding the model's
    own modules of that stage (not copies), in containers and hook tables of its own (FSDP2 hooks each stage apart)."""
    view = copy.copy(model)
    for name, value in vars(model).items():  # _modules, _parameters, _buffers, the hook tables
        if isinstance(value, (dict, set)):
            view.__dict__[name] = type(value)(value)
    _keep(view, model.layers, [str(i) for i in stage_blocks(split, stage)], stage == 0, stage == len(split) - 1)
    view.pipeline_stage, view.pipeline_cut = (stage, len(split)), ((stage,), tuple(split))
    return view


def stage_roots(model: nn.Module) -> list[nn.Module]:
    """The modules that run as pipeline stages on this rank, each its own FSDP2 root: the model, or with several stages
    its views, made when first asked for: after activation checkpointing and compile have wrapped the blocks, which
    replaces them in the model's layers (a view made before would hold the bare blocks)."""
    stages, split = getattr(model, "pipeline_cut", ((), ()))
    if len(stages) <= 1:
        return [model]
    if model.__dict__.get("pipeline_views") is None:
        model.pipeline_views = [_view(model, s, split) for s in stages]
    return list(model.pipeline_views)


def build_schedule(module: nn.Module, plan: Plan, env: DistEnv, mesh, loss_fn: typing.Callable):
    """The PipelineStages of this rank's (sharded) stages, cut by `cut_stage`, and the plan's schedule over them.
    Returns (stages, schedule)."""
    return make_schedule(module, plan, env.device, mesh["pp"].get_group(), loss_fn)


def make_schedule(module: nn.Module, plan: Plan, device, group, loss_fn: typing.Callable):
    """(stages, schedule) over `group`, the pipeline ranks: a single-stage schedule takes its one stage, a multi-stage
    one the list."""
    from torch.distributed import pipelining

    stages = [pipelining.PipelineStage(root, *root.pipeline_stage, device, group=group) for root in stage_roots(module)]
    for stage in stages:
        _uncount_shape_inference(stage)
    cls = getattr(pipelining, SCHEDULES[plan.distributed.pipeline.schedule])
    several = issubclass(cls, pipelining.schedules.PipelineScheduleMulti)
    return stages, cls(stages if several else stages[0], n_microbatches=plan.pipeline_microbatches, loss_fn=loss_fn,
                       scale_grads=True)


def _uncount_shape_inference(stage) -> None:
    """The stage infers its inputs' and outputs' shapes by running the first micro-batch through its module once more
    (launcher.train.compat.after_shape_inference). MoE layers counted that micro-batch's tokens per expert, which the
    load balancing reads after the step: dropped, so that the expert biases move as without a pipeline."""
    from launcher.train.models.moe import moe_layers

    def uncount() -> None:
        for layer in moe_layers(stage.submod):
            layer.tokens_per_expert.zero_()

    after_shape_inference(stage, uncount)


class PipelineEngine(Engine):
    """FSDP2 over each stage's ranks, and the schedule that runs a step's micro-batches through the stages (which also
    switches FSDP2's gradient synchronisation, as FSDP2Engine.micro_batch does without a pipeline)."""

    name = "fsdp2"

    def __init__(self, *, stages, schedule, pp_group, **kwargs):
        super().__init__(**kwargs)
        self.stages = stages
        self.schedule = schedule
        self.pp_group = pp_group

    @property
    def stage(self):
        """This rank's first stage."""
        return self.stages[0]

    @property
    def is_first(self) -> bool:
        """Whether this rank feeds the pipeline (holds stage 0)."""
        return any(s.is_first for s in self.stages)

    @property
    def is_last(self) -> bool:
        """Whether this rank computes the loss (holds the last stage: a V schedule puts it on the first pipeline rank)."""
        return any(s.is_last for s in self.stages)

    def pipeline_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one optimizer step's sequences (batch, seq + 1) through the stages. Returns this rank's
        mean loss over the step's micro-batches (0 on a rank that does not hold the last stage)."""
        return self._through(functools.partial(self.schedule.step, return_outputs=False), tokens)

    def pipeline_eval(self, tokens: torch.Tensor) -> torch.Tensor:
        """The same, forward only (the schedule's eval), for evaluation sequences."""
        return self._through(self.schedule.eval, tokens)

    def _through(self, run: typing.Callable, tokens: torch.Tensor) -> torch.Tensor:
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first else ()  # the later stages receive their inputs from the one before
        with self.precision.autocast():
            run(*args, target=targets if self.is_last else None, losses=losses)
        if not self.is_last:
            return torch.zeros((), device=tokens.device, dtype=torch.float32)
        return torch.stack([loss.detach().float() for loss in losses]).mean()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor | None:
        """The whole model's gradient norm: each stage's (over its dp_shard ranks), summed in squares over the stages."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        squared = _total_norm([p.grad for p in params]).float() ** 2
        dist.all_reduce(squared, group=self.pp_group)
        total = squared.sqrt()
        if max_norm > 0:
            for group in _by_mesh(params):
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total
