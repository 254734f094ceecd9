"""A fourth FP8 backend as a plugin would add one: its record and its module, in this one file, and nothing else in
the repository changed (tests/test_toy_backend.py registers it, plans it and trains it on CPU).

"FP8" in name only: it converts nothing numerically. It marks the Linears the plan's selection asked it to convert
(launcher/train/precision/select.py, the rule every backend shares) and records each call, so a test can see what
fp8launch asked of it; the run's report, layers and monitor then speak of it like any other backend's."""

from __future__ import annotations

from torch import nn

from launcher.planning.backends import Backend
from launcher.train.precision import select
from launcher.train.precision.amp import Precision, amp_settings
from launcher.train.precision.report import count

TOY = Backend(
    name="toy", package="tests.toy_backend", apply="tests.toy_backend:apply_toy", default_recipe="noop",
    gemms={"*": "toy: {hp} GEMMs marked as fp8, nothing converted"},
    overflow_hints={"*": "the toy backend converts nothing: look elsewhere"},
)
"""Its record: a package to find (this module), the function that converts a model, its one recipe."""

CALLS: list[tuple[str, tuple[str, ...]]] = []
"""(what fp8launch called, the Linears concerned), in order."""

MARK = "toy_fp8"
"""The attribute it sets on each Linear it was asked to convert."""


class ToyPrecision(Precision):
    def fp8_label(self, module: nn.Module) -> str | None:
        return "fp8 noop" if getattr(module, MARK, False) else None

    def wrap_optimizer(self, model: nn.Module, optimizer):
        CALLS.append(("wrap_optimizer", ()))
        return model, optimizer


def apply_toy(model: nn.Module, plan, device) -> ToyPrecision:
    """Mark what the plan's selection converts; keep the rest as every backend keeps it (its reason)."""
    reasons = select.classify(model, plan)
    marked = tuple(fqn for fqn, reason in reasons.items() if reason is None)
    for fqn in marked:
        setattr(model.get_submodule(fqn), MARK, True)
    CALLS.append(("apply", marked))
    s = amp_settings(plan, device)
    report = count(model, backend=TOY.name, recipe=TOY.default_recipe, mode="fp8", high_precision=plan.precision.compute_dtype,
                   is_fp8=lambda m: getattr(m, MARK, False), reasons=reasons)
    return ToyPrecision(report=report, device_type=device.type, autocast_dtype=s["autocast_dtype"], param_dtype=s["param_dtype"],
                        grad_scaler=s["grad_scaler"])
