"""What every engine is: the Engine interface with the plain-PyTorch behaviour DDP and FSDP2 share,
and how an engine reads its generated config (fsdp2.json, deepspeed.json) next to plan.json."""

from __future__ import annotations

import contextlib
import json
import os
import typing
from typing import Any, ContextManager

import torch
from torch import nn

from launcher.errors import LauncherError
from launcher.train.models import logits_of

if typing.TYPE_CHECKING:
    from launcher.train.precision import Precision


class Engine:
    """A model wrapped for distributed training, with its optimizer and lr schedule.

    Attributes the checkpoint module reads: `model` (what forward runs: the DDP/FSDP2 module
    or the DeepSpeed engine), `module` (the user's model inside it), `optimizer`, `scheduler`.
    """

    name = "base"
    clips_in_step = False
    """True where the engine clips gradients itself inside step() (DeepSpeed)."""

    def __init__(self, *, model: nn.Module, module: nn.Module, optimizer: Any, scheduler: Any,
                 precision: Precision, accum_steps: int):
        self.model = model
        self.module = module
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.precision = precision
        self.accum_steps = accum_steps

    def micro_batch(self, last: bool) -> ContextManager:
        """The context of one micro-batch's forward and backward; `last` is the one whose
        backward synchronises gradients across ranks."""
        return contextlib.nullcontext()

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
        if self.precision.report.backend == "msamp":  # FP8 ScalingTensor gradients: MS-AMP's own clipping
            return self.precision.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        total = torch.nn.utils.get_total_norm([p.grad for p in params])
        total = _full(total)
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
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
