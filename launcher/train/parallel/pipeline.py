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
- The gradient norm is each stage's norm over its dp_shard ranks, then summed in squares over the pp ranks (torch's
  clip_grad_norm_ sees one stage's parameters only; torchtitan's dist_utils.clip_grad_norm_ does the same).

The loss of a step lives on the last stage's ranks: the others report 0 and the loop divides the sum by the ranks that
hold it.
"""

from __future__ import annotations

import functools
import typing

import torch
import torch.distributed as dist
from torch import nn

from launcher.errors import LauncherError
from launcher.planning.plan import stage_blocks
from launcher.train.engines.base import Engine, _by_mesh, _total_norm

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.train.parallel.distributed import DistEnv

SCHEDULES = {"1F1B": "Schedule1F1B", "GPipe": "ScheduleGPipe"}
"""distributed.pipeline.schedule -> the torch.distributed.pipelining class."""


def stage_of(rank: int, world_size: int, stages: int) -> int:
    """The pipeline stage `rank` holds (pp outermost in the mesh)."""
    return rank // (world_size // stages)


def split_for(plan: Plan, n_layers: int) -> tuple[int, ...]:
    """The blocks per stage: the plan's, checked against the model (an hf: / py: model is refused at plan time)."""
    split = plan.distributed.stage_split(n_layers)
    if len(split) != plan.distributed.pipeline_parallel or sum(split) != n_layers or min(split) < 1:
        raise LauncherError(f"distributed.pipeline.layers_per_stage {list(split)} does not cut the model's {n_layers} blocks into "
                            f"{plan.distributed.pipeline_parallel} stages; fix: regenerate the plan with `fp8launch plan SPEC`",
                            rule="PP-LAYERS")
    return split


def cut_stage(model: nn.Module, stage: int, split: typing.Sequence[int]) -> nn.Module:
    """Keep what stage `stage` of the builtin decoder holds (in place; the model on the meta device or not): its blocks
    in a ModuleDict under their own indices, the embedding on the first stage, the norm and the head on the last.
    Returns the model, marked with `pipeline_stage` = (stage, stages)."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(hasattr(model, n) for n in ("tok_embeddings", "norm", "output")):
        raise LauncherError(f"distributed.pipeline_parallel cuts the builtin decoder only, not a {type(model).__name__}; "
                            "fix: set distributed.pipeline_parallel = 1", rule="PP-MODEL")
    keep = stage_blocks(split, stage)
    model.layers = nn.ModuleDict({str(i): layers[i] for i in keep})
    if stage > 0:
        model.tok_embeddings = None
    if stage < len(split) - 1:
        model.norm = None
        model.output = None
    model.pipeline_stage = (stage, len(split))
    return model


def build_schedule(module: nn.Module, plan: Plan, env: DistEnv, mesh, loss_fn: typing.Callable):
    """The PipelineStage of this rank's (sharded) stage, cut by `cut_stage`, and the plan's schedule over it.
    Returns (stage, schedule)."""
    from torch.distributed import pipelining

    index, stages = module.pipeline_stage
    stage = pipelining.PipelineStage(module, index, stages, env.device, group=mesh["pp"].get_group())
    _uncount_shape_inference(stage)
    cls = getattr(pipelining, SCHEDULES[plan.distributed.pipeline.schedule])
    return stage, cls(stage, n_microbatches=plan.pipeline_microbatches, loss_fn=loss_fn, scale_grads=True)


def _uncount_shape_inference(stage) -> None:
    """The stage infers its inputs' and outputs' shapes at the first step by running the first micro-batch forward and
    backward once more (torch 2.13 pipelining/stage.py, dynamic metadata inference), then drops the gradients that left
    (`_post_metadata_inference_cleanup`). MoE layers also counted that micro-batch's tokens per expert, which the load
    balancing reads after the step: dropped there too, so that the expert biases move as without a pipeline."""
    from launcher.train.models.moe import moe_layers

    cleanup = stage._post_metadata_inference_cleanup

    def cleanup_and_uncount() -> None:
        cleanup()
        for layer in moe_layers(stage.submod):
            layer.tokens_per_expert.zero_()

    stage._post_metadata_inference_cleanup = cleanup_and_uncount


class PipelineEngine(Engine):
    """FSDP2 over each stage's ranks, and the schedule that runs a step's micro-batches through the stages (which also
    switches FSDP2's gradient synchronisation, as FSDP2Engine.micro_batch does without a pipeline)."""

    name = "fsdp2"

    def __init__(self, *, stage, schedule, pp_group, **kwargs):
        super().__init__(**kwargs)
        self.stage = stage
        self.schedule = schedule
        self.pp_group = pp_group

    @property
    def is_first(self) -> bool:
        return self.stage.is_first

    @property
    def is_last(self) -> bool:
        return self.stage.is_last

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
