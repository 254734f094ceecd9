"""The `[[precision.schedule]]` switch inside a run: a Trainer callback that, after the last step of a phase,
takes the torchao Float8Linear layers the next phase keeps back to nn.Linear in place (the same Parameter
objects: weights, gradients' buckets and optimizer state carry over exactly), rebuilds the compiled regions,
prints a line and writes a `precision` event to metrics.jsonl. Rules SCHEDULE-* refuse what it cannot switch
(float8 all-gather, tensor parallel, DeepSpeed, MX / NVFP4, TE, MS-AMP, the monitor)."""

from __future__ import annotations

import typing
from typing import Any

import torch
from torch import nn

from launcher.planning.schedule import Phase, phases, plan_at
from launcher.planning.selection import default_recipe
from launcher.train.fqn import clean_fqn

from . import select

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.train.metrics import MetricsLogger


def phase_label(phase: Phase) -> str:
    p = phase.plan.precision
    return f"fp8 {p.backend} {default_recipe(phase.plan)}" if p.mode == "fp8" else p.mode


class PrecisionSwitch:
    """Call after every step (Trainer callback): switches when the next step starts a later phase."""

    def __init__(self, plan: Plan, model: nn.Module, logger: MetricsLogger, *, start_step: int):
        self.plan, self.model, self.logger = plan, model, logger
        self.phases = phases(plan)
        self.current = plan_at(plan, start_step + 1)

    def __call__(self, state) -> None:
        upcoming = [p for p in self.phases if p.index > self.current.index and p.first_step == state.step + 1]
        if upcoming:
            self.switch(upcoming[0], state)

    def switch(self, phase: Phase, state) -> dict[str, Any]:
        from torchao.float8.float8_linear import Float8Linear

        keeps = select.classify(self.model, phase.plan) if phase.plan.precision.mode == "fp8" else None
        moved = []
        for fqn, module in self.model.named_modules():
            if isinstance(module, Float8Linear) and (keeps is None or keeps.get(fqn)):
                # nn.Linear's own forward from now on; its weight and bias are the Parameters the optimizer holds
                module.__class__ = nn.Linear
                moved.append(clean_fqn(fqn))
        if self.plan.compile.enabled:
            torch._dynamo.reset()  # the compiled blocks traced Float8Linear: recompile them at their next call
        remaining = sum(1 for m in self.model.modules() if isinstance(m, Float8Linear))
        before, self.current = self.current, phase
        state.precision_phase = phase.index
        record = {"event": "precision", "step": phase.first_step, "phase": phase.index, "precision": phase_label(phase),
                  "previous": phase_label(before), "fp8_layers": remaining, "to_high_precision": moved}
        self.logger.event(record, f"precision: from step {phase.first_step}: {phase_label(phase)} (was {phase_label(before)}); "
                                  f"{len(moved)} Linear layers back to {phase.plan.precision.compute_dtype}, {remaining} in FP8")
        return record
