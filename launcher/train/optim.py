"""The optimizer and the learning-rate schedule a plan asks for (`train.optimizer`, `train.lr`,
`train.weight_decay`, `train.weight_decay_exclude`, `train.adam_betas`, `train.adam_eps`,
`train.warmup_steps`, `train.min_lr_ratio`, `train.steps`).

Schedule: linear warm-up over `warmup_steps` (as torchtitan: the first step already has
lr / (warmup_steps + 1)), then cosine decay from `lr` to `min_lr_ratio` x `lr` at `steps`
(default 0.1: 10% of `lr`).

Weight decay: `weight_decay_exclude = "none"` puts every parameter in one group (torchtitan's
build_optimizers does the same); "norms_and_biases" moves every parameter with one dimension (norm
weights, biases) into a second group with weight_decay 0, Megatron-Core's rule ("skipping all len 1
and bias parameters", megatron/core/optimizer/__init__.py). A bias has one dimension, so the shape
alone decides. The decaying group comes first, each group in `module.parameters()` order.
"""

from __future__ import annotations

import math
import typing
from typing import Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR

if typing.TYPE_CHECKING:
    from launcher.planning.plan import PrecisionConfig, TrainConfig

FINAL_LR_FRACTION = 0.1
"""The default of train.min_lr_ratio: the cosine decay ends at this fraction of the peak learning rate."""


def param_groups(params: Iterable[torch.nn.Parameter], train: TrainConfig) -> list[dict]:
    """The trainable `params` as optimizer parameter groups: one group, or (weight_decay_exclude =
    "norms_and_biases") the decaying parameters and then the one-dimensional ones with weight_decay 0.
    An empty group is left out."""
    params = [p for p in params if p.requires_grad]
    if train.weight_decay_exclude == "none":
        return [{"params": params}]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay}, {"params": no_decay, "weight_decay": 0.0}) if g["params"]]


def adam_implementation(params) -> dict:
    """torch's fused Adam/AdamW kernel where every parameter is on a CUDA device (torchtitan's default optimizer
    implementation, "fused": one kernel for the whole step instead of foreach's several per group); elsewhere torch's
    default (foreach on CUDA, a loop on CPU), so CPU runs keep the numerics they have."""
    params = list(params)
    return {"fused": True} if params and all(p.device.type == "cuda" for p in params) else {}


def build_optimizer(params: Iterable[torch.nn.Parameter], train: TrainConfig,
                    precision: PrecisionConfig | None = None) -> torch.optim.Optimizer:
    """AdamW, Adam (with train.adam_betas and adam_eps; fused on CUDA) or plain SGD (no momentum) over `params`, at `train.lr`.
    With `precision`'s optimizer_states other than fp32 or bf16 master_weights: torchao's Adam with those moments
    (launcher/train/optim_lowbit.py)."""
    groups = param_groups(params, train)
    if precision is not None and train.optimizer in ("adamw", "adam"):
        from launcher.train import optim_lowbit

        if optim_lowbit.needs_lowbit(precision.optimizer_states, precision.master_weights):
            return optim_lowbit.build(groups, train, states=precision.optimizer_states, master=precision.master_weights)
    if train.optimizer in ("adamw", "adam"):
        cls = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
        return cls(groups, lr=train.lr, betas=tuple(train.adam_betas), eps=train.adam_eps, weight_decay=train.weight_decay,
                   **adam_implementation(p for g in groups for p in g["params"]))
    if train.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=train.lr, weight_decay=train.weight_decay)
    raise ValueError(f"unknown train.optimizer {train.optimizer!r}")  # the schema allows no other value


def lr_factor(step: int, *, warmup_steps: int, steps: int, min_lr_ratio: float = FINAL_LR_FRACTION) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    decay_steps = max(steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig) -> LambdaLR:
    """A LambdaLR stepped once per optimizer step (its state_dict is the step count)."""
    return LambdaLR(optimizer, lambda step: lr_factor(step, warmup_steps=train.warmup_steps, steps=train.steps,
                                                      min_lr_ratio=train.min_lr_ratio))
