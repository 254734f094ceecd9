"""The `[[precision.schedule]]` switch inside a run: a Trainer callback that, after the last step of a phase,
converts each Linear whose precision the next phase changes, in place, keeping its Parameter objects (weights,
gradients' buckets and optimizer state carry over exactly):

    torchao Float8Linear -> nn.Linear           (to the run's high precision)
    nn.Linear -> Float8Linear(recipe)           (into FP8)
    Float8Linear(a) -> Float8Linear(b)          (another float8 recipe)

by swapping the module's class and setting the few attributes Float8Linear.__init__ derives from its config
(torchao/float8/float8_linear.py: scaling types, config, linear_mm_config), taken from a meta-device twin built by
Float8Linear itself. A model converted this way computes what a model converted by convert_to_float8_training with
that phase's plan computes, so a resumed run (built in the phase in force) continues bit-identically. Compiled regions
are rebuilt, a line is printed and a `precision` event written to metrics.jsonl. Rules SCHEDULE-* refuse what it
cannot switch (float8 all-gather, tensor parallel, DeepSpeed, MX / NVFP4, TE, MS-AMP, the monitor, layers with a
dtype of their own)."""

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
        from launcher.train.precision.torchao_fp8 import _follow_cpu_autocast, _torchao, float8_config, recipe_of

        Float8Linear = _torchao().Float8Linear
        fp8 = phase.plan.precision.mode == "fp8"
        wanted = select.choices(self.model, phase.plan) if fp8 else {}
        configs: dict[str, Any] = {}
        moved, changed = [], {}
        for fqn, module in select.linears(self.model):
            have = recipe_of(module.config) if isinstance(module, Float8Linear) else None
            want = wanted.get(fqn, (None, None))[0]
            if want == have:
                continue
            if want is None:
                module.__class__ = nn.Linear  # nn.Linear's own forward from now on, on the same weight and bias
                moved.append(clean_fqn(fqn))
            else:
                if want not in configs:
                    configs[want] = float8_config(phase.plan, want)
                _configure_float8(module, configs[want], Float8Linear)
                if module.weight.device.type == "cpu" and _follow_cpu_autocast not in module._forward_pre_hooks.values():
                    module.register_forward_pre_hook(_follow_cpu_autocast)  # as apply_torchao registers it on CPU
            changed[clean_fqn(fqn)] = f"fp8 {want}" if want else phase.plan.precision.compute_dtype
        if self.plan.compile.enabled:
            torch._dynamo.reset()  # the compiled blocks traced the old classes: recompile them at their next call
        remaining = sum(1 for m in self.model.modules() if isinstance(m, Float8Linear))
        before, self.current = self.current, phase
        state.precision_phase = phase.index
        record = {"event": "precision", "step": phase.first_step, "phase": phase.index, "precision": phase_label(phase),
                  "previous": phase_label(before), "fp8_layers": remaining, "to_high_precision": moved, "changed": changed}
        into = len(changed) - len(moved)
        self.logger.event(record, f"precision: from step {phase.first_step}: {phase_label(phase)} (was {phase_label(before)}); "
                                  f"{len(moved)} Linear layers back to {phase.plan.precision.compute_dtype}, {into} into FP8 or another "
                                  f"recipe, {remaining} in FP8")
        return record


DERIVED = ("scaling_type_input", "scaling_type_weight", "scaling_type_grad_output", "config", "linear_mm_config")
"""What Float8Linear.__init__ sets on top of nn.Linear's (torchao 0.18, float8_linear.py); everything its forward reads."""


def _configure_float8(module: nn.Linear, config, Float8Linear) -> None:
    """`module` (nn.Linear or Float8Linear) becomes a Float8Linear with `config`, on its own Parameters."""
    if config.enable_fsdp_float8_all_gather:  # the weight would need wrapping (rule SCHEDULE-SUPPORT refuses it)
        raise ValueError("a schedule cannot switch layers into FP8 with float8 all-gather")
    twin = Float8Linear(1, 1, bias=False, config=config, device="meta")
    module.__class__ = Float8Linear
    for name in DERIVED:
        setattr(module, name, getattr(twin, name))
