"""The pipeline-parallel engine (distributed.pipeline_parallel; launcher/train/parallel/pipeline.py cuts the stages):
FSDP2 over each stage's ranks, and torch.distributed.pipelining's schedule running one optimizer step's micro-batches
through the stages (which also switches FSDP2's gradient synchronisation, as FSDP2Engine.micro_batch does without a
pipeline). The loss of a step lives on the last stage's ranks; the others report 0."""

from __future__ import annotations

import functools
import typing
from typing import Any, Callable, ClassVar

import torch
import torch.distributed as dist

from .base import Engine, by_mesh, total_norm

if typing.TYPE_CHECKING:
    from launcher.train.parallel.pipeline import StageCut


class PipelineEngine(Engine):
    """An Engine whose model is this rank's pipeline stages (`cut`), run by `schedule` over its PipelineStages `stages`;
    `pp_group` is the pipeline ranks."""

    name: ClassVar[str] = "fsdp2"
    flat_optimizer_state: ClassVar[bool] = True

    def __init__(self, *, cut: StageCut, stages, schedule, pp_group, **kwargs):
        super().__init__(**kwargs)
        self.cut = cut
        self.stages = stages
        self.schedule = schedule
        self.pp_group = pp_group

    @property
    def is_first(self) -> bool:
        """Whether this rank feeds the pipeline (holds stage 0)."""
        return any(s.is_first for s in self.stages)

    @property
    def is_last(self) -> bool:
        """Whether this rank computes the loss (holds the last stage: a V schedule puts it on the first pipeline rank)."""
        return any(s.is_last for s in self.stages)

    @property
    def eval_batches(self) -> int:
        """A training step's batches (grad_accum_steps), which the schedule's micro-batches divide."""
        return self.accum_steps

    def train_step(self, next_batch: Callable[[], torch.Tensor],
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Forward and backward of one optimizer step's sequences through the stages. The schedule computes the loss it
        was built with (launcher/train/loss.py loss_function), not `loss_fn`. Returns this rank's mean loss over the
        step's micro-batches (0 on a rank that does not hold the last stage)."""
        tokens = torch.cat([next_batch() for _ in range(self.accum_steps)])
        return self._through(functools.partial(self.schedule.step, return_outputs=False), tokens)

    def eval_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """The same, forward only (the schedule's eval), for evaluation sequences."""
        return self._through(self.schedule.eval, tokens)

    def _through(self, run: Callable, tokens: torch.Tensor) -> torch.Tensor:
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
        squared = total_norm([p.grad for p in params]).float() ** 2
        dist.all_reduce(squared, group=self.pp_group)
        total = squared.sqrt()
        if max_norm > 0:
            for group in by_mesh(params):
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    def pipeline_effects(self) -> dict[str, Any] | None:
        """This rank's stages and the schedule that runs them, as effects.json records them."""
        stage = self.stages[0]
        return {"stages": stage.num_stages, "stage": stage.stage_index, "schedule": type(self.schedule).__name__,
                "microbatches": self.schedule._n_microbatches, "blocks": self.cut.blocks, "stages_per_rank": len(self.stages),
                "rank_stages": [s.stage_index for s in self.stages]}
