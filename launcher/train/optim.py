"""The optimizer and the learning-rate schedule a plan asks for (`train.optimizer`, `train.lr`,
`train.weight_decay`, `train.warmup_steps`, `train.steps`).

Schedule: linear warm-up over `warmup_steps` (as torchtitan: the first step already has
lr / (warmup_steps + 1)), then cosine decay from `lr` to 10% of `lr` at `steps`.
"""

from __future__ import annotations

import math
import typing
from typing import Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

if typing.TYPE_CHECKING:
    from launcher.planning.plan import TrainConfig

FINAL_LR_FRACTION = 0.1
"""The cosine decay ends at this fraction of the peak learning rate."""


def build_optimizer(params: Iterable[torch.nn.Parameter], train: TrainConfig) -> torch.optim.Optimizer:
    """AdamW, Adam or plain SGD (no momentum) over `params`, at `train.lr`."""
    params = [p for p in params if p.requires_grad]
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == "adam":
        return torch.optim.Adam(params, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=train.lr, weight_decay=train.weight_decay)
    raise ValueError(f"unknown train.optimizer {train.optimizer!r}")  # the schema allows no other value


def lr_factor(step: int, *, warmup_steps: int, steps: int) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    decay_steps = max(steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig) -> LambdaLR:
    """A LambdaLR stepped once per optimizer step (its state_dict is the step count)."""
    return LambdaLR(optimizer, lambda step: lr_factor(step, warmup_steps=train.warmup_steps, steps=train.steps))
