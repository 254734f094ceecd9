"""What every engine is: the Engine interface with the plain-PyTorch behaviour DDP and FSDP2 share,
and how an engine reads its generated config (fsdp2.json, deepspeed.json) next to plan.json."""

from __future__ import annotations

import contextlib
import json
import os
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, ContextManager

import torch
from torch import nn

from launcher.errors import LauncherError
from launcher.planning.backends import named
from launcher.train.loss import cross_entropy
from launcher.train.models import logits_of

if typing.TYPE_CHECKING:
    from launcher.planning.layout import Layout
    from launcher.train.parallel.grad_reduce import GradReduction
    from launcher.train.precision import Precision


@dataclass(kw_only=True, eq=False, repr=False)
class Engine:
    """A model wrapped for distributed training, with its optimizer and lr schedule.

    What the loop calls: `train_step` (an optimizer step's forward and backward), `clip_grad_norm`, `step`,
    `zero_grad`; what evaluation calls: `eval_loss`, `eval_batches`; both divide the losses summed over all ranks by
    `loss_ranks`. The defaults run micro-batches one by one (`micro_batch`, `sequence_parts`, `forward`, `backward`);
    the pipeline's engine runs them through its schedule (launcher/train/engines/pipeline.py).

    Attributes the checkpoint module reads: `model` (what forward runs: the DDP/FSDP2 module
    or the DeepSpeed engine), `module` (the user's model inside it), `optimizer`, `scheduler`.
    """

    name: ClassVar[str] = "base"
    clips_in_step: ClassVar[bool] = False
    """True where the engine clips gradients itself inside step() (DeepSpeed)."""
    flat_optimizer_state: ClassVar[bool] = False
    """True where the optimizer holds part of the model's parameters, so a checkpoint keys its state by parameter name
    (a pipeline stage's: launcher/train/checkpoint/dcp.py FLAT)."""

    model: nn.Module
    module: nn.Module
    optimizer: Any
    scheduler: Any
    precision: Precision
    accum_steps: int
    grad_reduction: GradReduction | None = None
    """The gradient reduction as built (launcher/train/parallel/grad_reduce.py): its payload and the bytes each step sent."""
    balance_group: Any = None
    """The process group MoE load balancing sums its token counts over (None: every rank; a pipeline stage's ranks under
    pipeline parallelism, whose MoE layers are the stage's own)."""
    cp_mesh: Any = None
    """The context-parallel mesh dimension (distributed.context_parallel > 1): the ranks each sequence is split over."""
    layout: Layout | None = None
    """The job's parallel layout (launcher/planning/layout.py); None: a world of one."""

    @property
    def loss_ranks(self) -> int:
        """The ranks whose losses a step's (or an evaluation's) all-reduce sums: every rank, or under pipeline parallelism
        the last stage's (the others add 0)."""
        return self.layout.loss_ranks if self.layout is not None else 1

    @property
    def eval_batches(self) -> int:
        """Batches one evaluation step reads per rank."""
        return 1

    def train_step(self, next_batch: Callable[[], torch.Tensor],
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Forward and backward of one optimizer step's `accum_steps` micro-batches, each (batch, seq + 1) token ids read
        by `next_batch` when its turn comes. Returns this rank's mean loss over them (fp32, 0-dim)."""
        loss_sum = None
        for micro in range(self.accum_steps):
            tokens = next_batch()
            last = micro == self.accum_steps - 1
            if loss_sum is None:
                loss_sum = torch.zeros((), device=tokens.device, dtype=torch.float32)
            with self.micro_batch(last), self.sequence_parts(tokens[:, :-1], tokens[:, 1:]) as (inputs, targets):
                loss = loss_fn(self.forward(inputs), targets)  # the logits in no frame of ours through backward
                self.backward(loss, last)
            loss_sum += loss.detach().float()
        return loss_sum / self.accum_steps

    def pipeline_effects(self) -> dict[str, Any] | None:
        """This rank's pipeline stages and their schedule, as effects.json records them; None without a pipeline."""
        return None

    def eval_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """This rank's loss of one evaluation step's (batch, seq + 1) token ids, forward only: under context parallel its
        part of every sequence, through the ring (as many tokens on every rank of the group, so the mean over all ranks
        is the whole sequences' mean)."""
        with self.sequence_parts(tokens[:, :-1], tokens[:, 1:]) as (inputs, targets):
            return cross_entropy(self.forward(inputs), targets).float()

    def grad_comm_bytes(self) -> int | None:
        """Bytes this rank sent for gradient reduction since the last call (call it once per step, after the last
        backward); None where the engine has no reduction fp8launch knows."""
        return self.grad_reduction.take(self) if self.grad_reduction is not None else None

    def stepping_optimizer(self) -> Any:
        """The optimizer whose state holds the moments: DeepSpeed's basic optimizer inside ZeRO, else `optimizer`."""
        basic = getattr(self.model, "basic_optimizer", None)
        return basic if basic is not None else self.optimizer

    def optimizer_state_bytes(self) -> int:
        """This rank's optimizer state in bytes, from the live state tensors (launcher/train/optim_lowbit.py)."""
        from launcher.train.optim_lowbit import state_bytes

        return state_bytes(self.stepping_optimizer())

    def micro_batch(self, last: bool) -> ContextManager:
        """The context of one micro-batch's forward and backward; `last` is the one whose
        backward synchronises gradients across ranks."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def sequence_parts(self, inputs: torch.Tensor, targets: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A micro-batch's token ids and targets as this rank trains on them: as they are, or, under context parallel,
        this rank's part of every sequence, with attention through the ring while inside (forward and backward)."""
        if self.cp_mesh is None:
            yield inputs, targets
            return
        from launcher.train.parallel.context import step_context

        inputs, targets = inputs.contiguous(), targets.contiguous()  # resharded in place: not views of the batch
        with step_context(self.cp_mesh, [inputs, targets]):
            yield inputs, targets

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits (batch, seq, vocab) for int64 token ids (batch, seq), under the precision's autocast."""
        with self.precision.autocast():
            return logits_of(self.model(inputs))

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backward of one micro-batch's mean loss; gradients accumulate as the mean over micro-batches."""
        loss = loss / self.accum_steps
        scaler = self.precision.grad_scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor | None:
        """Total gradient norm over all ranks before clipping; clips to `max_norm` unless it is 0."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.precision.grad_scaler is not None:
            self.precision.grad_scaler.unscale_(self.optimizer)
        backend = named(self.precision.report.backend)
        if backend is not None and backend.scaling_tensors:  # FP8 ScalingTensor gradients: MS-AMP's own clipping
            return self.precision.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        total = total_norm([p.grad for p in params])
        if max_norm > 0:
            for group in by_mesh(params):
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    def step(self) -> None:
        """Optimizer step, the precision's after-step hook, then the lr schedule."""
        scaler = self.precision.grad_scaler
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.precision.after_optimizer_step(self.model)
        balance_experts(self.model, self.balance_group)
        self.scheduler.step()

    def skip_step(self) -> None:
        """Drop this step's gradients without updating the weights; the lr schedule (and the
        fp16 loss scale, which lowers itself) move on as after a step."""
        scaler = self.precision.grad_scaler
        if scaler is not None:
            scaler.update()
        self.zero_grad()
        self.scheduler.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def lr(self) -> float:
        """The learning rate the next step uses."""
        return float(self.scheduler.get_last_lr()[0])

    def train_state(self) -> dict[str, Any]:
        """The stateful objects a checkpoint saves and restores, by name."""
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}


def balance_experts(model: nn.Module, group=None) -> None:
    """MoE auxiliary-loss-free load balancing after each optimizer step (torchtitan: an optimizer
    step pre-hook): each MoE layer's expert_bias moves by its token counts, summed over all ranks so
    that every rank routes with the same bias (sign(mean - count) is the same for any multiple of the
    counts, so summing over tensor-parallel copies changes nothing). No MoE layers: nothing happens."""
    from launcher.train.models.moe import moe_layers, update_expert_bias

    if not moe_layers(model):
        return
    if group is None and torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1:
        group = torch.distributed.group.WORLD
    update_expert_bias(model, group)


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all `grads`. DTensor gradients on different meshes (expert parallelism: the experts'
    ("efsdp", "ep"), the dense parameters' flattened "dp_shard") cannot meet in one norm: one norm per mesh,
    each reduced over its ranks, then the norm of those."""
    groups = by_mesh(grads)
    if len(groups) <= 1:
        return _full(torch.nn.utils.get_total_norm(grads))
    return torch.linalg.vector_norm(torch.stack([_full(torch.nn.utils.get_total_norm(group)) for group in groups]))


def by_mesh(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """`tensors` grouped by their DTensor mesh (plain tensors together), in order of first appearance."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault(getattr(t, "device_mesh", None), []).append(t)
    return list(groups.values())


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor norm (FSDP2) reduced to a plain tensor; a plain tensor unchanged."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def read_config(plan_dir: str, name: str) -> dict:
    """A generated engine config (fsdp2.json, deepspeed.json) next to plan.json."""
    path = os.path.join(plan_dir, name)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError as e:
        raise LauncherError(f"{path} is missing; fix: regenerate the plan with `fp8launch plan SPEC`") from e
    except json.JSONDecodeError as e:
        raise LauncherError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); fix: regenerate it with `fp8launch plan SPEC`") from e
