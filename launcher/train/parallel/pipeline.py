"""Pipeline parallelism (distributed.pipeline_parallel) through torch.distributed.pipelining, as torchtitan does it:

- The mesh is pp x dp_shard (x tp) (launcher/planning/layout.py; pp outermost, so that a stage's ranks are adjacent and
  the stages' point-to-point sends cross nodes).
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

The cut is a record (StageCut) that the engine holds (launcher/train/engines/pipeline.py PipelineEngine), not a mark on
the model. The loss of a step lives on the last stage's ranks: the others report 0 and the loop divides the sum by the
ranks that hold it (Engine.loss_ranks).
"""

from __future__ import annotations

import copy
import typing
from dataclasses import dataclass

from torch import nn

from launcher.errors import LauncherError
from launcher.planning.plan import stage_blocks
from launcher.train.compat import after_shape_inference

if typing.TYPE_CHECKING:
    from launcher.planning.layout import Layout

SCHEDULES = {"1F1B": "Schedule1F1B", "GPipe": "ScheduleGPipe", "Interleaved1F1B": "ScheduleInterleaved1F1B",
             "ZBVZeroBubble": "ScheduleZBVZeroBubble"}
"""distributed.pipeline.schedule -> the torch.distributed.pipelining class."""


@dataclass(frozen=True, slots=True)
class StageCut:
    """Which pipeline stages a rank's model was cut to: `stages`, this rank's stages in order, of the `split` (the
    blocks on each stage, first stage first)."""

    stages: tuple[int, ...]
    split: tuple[int, ...]

    @property
    def count(self) -> int:
        """Pipeline stages in all."""
        return len(self.split)

    @property
    def blocks(self) -> list[int]:
        """The indices of the blocks this rank's stages hold, in order."""
        return [i for s in self.stages for i in stage_blocks(self.split, s)]


def split_for(layout: Layout, n_layers: int) -> tuple[int, ...]:
    """The blocks per stage: the layout's, checked against the model (an hf: / py: model is refused at plan time)."""
    split = layout.stage_split(n_layers)
    if len(split) != layout.pipeline_stages or sum(split) != n_layers or min(split) < 1:
        raise LauncherError(f"distributed.pipeline.layers_per_stage {list(split)} does not cut the model's {n_layers} blocks into "
                            f"{layout.pipeline_stages} stages; fix: regenerate the plan with `fp8launch plan SPEC`",
                            rule="PP-LAYERS")
    return split


def cut_stage(model: nn.Module, stage: int | typing.Sequence[int], split: typing.Sequence[int]) -> StageCut:
    """Keep what stage `stage` (or the stages) of the builtin decoder holds (in place; the model on the meta device or
    not): its blocks in a ModuleDict under their own indices, the embedding with the first stage, the norm and the head
    with the last. Returns the cut, which `stage_roots` and the engine read."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(hasattr(model, n) for n in ("tok_embeddings", "norm", "output")):
        raise LauncherError(f"distributed.pipeline_parallel cuts the builtin decoder only, not a {type(model).__name__}; "
                            "fix: set distributed.pipeline_parallel = 1", rule="PP-MODEL")
    cut = StageCut((stage,) if isinstance(stage, int) else tuple(stage), tuple(split))
    _keep(model, layers, cut.blocks, 0 in cut.stages, cut.count - 1 in cut.stages)
    return cut


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
    return view


def stage_roots(model: nn.Module, cut: StageCut) -> list[nn.Module]:
    """The modules that run as this rank's pipeline stages, one per stage of `cut` in its order, each its own FSDP2 root:
    the model, or with several stages views of it. Make them after activation checkpointing and compile have wrapped
    the blocks, which replaces them in the model's layers (a view made before would hold the bare blocks)."""
    if len(cut.stages) <= 1:
        return [model]
    return [_view(model, s, cut.split) for s in cut.stages]


def make_schedule(roots: typing.Sequence[nn.Module], cut: StageCut, schedule: str, microbatches: int, device, group,
                  loss_fn: typing.Callable):
    """(PipelineStages, schedule) of `roots` (the stages of `cut`, as stage_roots gives them, sharded or not) over
    `group`, the pipeline ranks: `schedule` (distributed.pipeline.schedule) over `microbatches` micro-batches
    (plan.pipeline_microbatches); a single-stage schedule takes its one stage, a multi-stage one the list."""
    from torch.distributed import pipelining

    stages = [pipelining.PipelineStage(root, s, cut.count, device, group=group) for root, s in zip(roots, cut.stages, strict=True)]
    for stage in stages:
        _uncount_shape_inference(stage)
    cls = getattr(pipelining, SCHEDULES[schedule])
    several = issubclass(cls, pipelining.schedules.PipelineScheduleMulti)
    return stages, cls(stages if several else stages[0], n_microbatches=microbatches, loss_fn=loss_fn,
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
