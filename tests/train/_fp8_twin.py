"""An FP8 model against its bf16 twin (the same weights, torch autocast only), on one batch: how far its logits are
from the twin's, what one training run of each gives, and how many FP8 GEMMs (`aten::_scaled_mm`) ran.
Shared by the CPU precision tests and the GPU proofs (tests/gpu/test_fp8_ran_conformance.py, test_te_gpu.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from launcher.train.precision import Precision, apply_precision

from ._precision import lm_loss, make_plan

SCALED_OPS = ("aten::_scaled_mm", "aten::_scaled_grouped_mm")


@dataclass
class Twins:
    model: nn.Module
    precision: Precision
    twin: nn.Module
    """`model` as it was before apply_precision converted it, in torch's bf16 autocast."""
    twin_precision: Precision

    def logits_gap(self, tokens: torch.Tensor) -> float:
        """‖fp8 − bf16‖ / ‖bf16‖ of the logits on `tokens` (no grad): FP8 rounding, measured against the same model."""
        with torch.no_grad():
            with self.precision.autocast():
                fp8 = self.model(tokens).float()
            with self.twin_precision.autocast():
                high = self.twin(tokens).float()
        return ((fp8 - high).norm() / high.norm()).item()

    def losses(self, tokens: torch.Tensor, steps: int, lr: float = 3e-3) -> tuple[list[float], list[float]]:
        """(the FP8 model's, the twin's) losses over `steps` AdamW steps each on the batch `tokens`."""
        return train_losses(self.model, self.precision, tokens, steps, lr), train_losses(self.twin, self.twin_precision, tokens, steps, lr)


def twins(model: nn.Module, plan, device: torch.device) -> Twins:
    """Copy `model` (its bf16 twin), then convert `model` with `plan`'s FP8 precision on `device`."""
    twin = copy.deepcopy(model)
    bf16 = make_plan(precision={"mode": "bf16"}, distributed={"strategy": plan.distributed.strategy, "procs_per_node": 1})
    twin_precision = apply_precision(twin, bf16, device)
    return Twins(model, apply_precision(model, plan, device), twin, twin_precision)


def train_losses(model: nn.Module, precision: Precision, tokens: torch.Tensor, steps: int, lr: float = 3e-3) -> list[float]:
    """`steps` AdamW steps of the next-token loss on one batch, under `precision` (its optimizer wrap and after-step
    hook included); the loss of each step, before its update."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model, optimizer = precision.wrap_optimizer(model, optimizer)
    losses = []
    for _ in range(steps):
        with precision.autocast():
            loss = lm_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        precision.after_optimizer_step(model)
        losses.append(loss.item())
    return losses


def scaled_mm_calls(fn: Callable[[], object]) -> int:
    """How many FP8 GEMMs (torch._scaled_mm, its grouped form) ran inside `fn()`, counted by torch.profiler."""
    with torch.profiler.profile() as prof:
        fn()
    return sum(1 for e in prof.events() if e.name in SCALED_OPS)
