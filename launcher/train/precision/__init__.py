"""Apply the plan's precision to a model: plain AMP, or one of the FP8 backends (torchao,
Transformer Engine, MS-AMP), each in its own module and imported only when chosen.

    precision = apply_precision(model, plan, device)   # before DDP/FSDP2/DeepSpeed, before compile
    print(precision.report.line())
    model, optimizer = precision.wrap_optimizer(model, optimizer)
    with precision.autocast():
        loss = loss_fn(model(tokens), targets)
    ...
    optimizer.step(); precision.after_optimizer_step(model)
"""

from __future__ import annotations

import importlib
import typing

import torch
from torch import nn

from launcher.errors import LauncherError
from launcher.planning.backends import BACKENDS

from .amp import Precision, apply_amp
from .checks import capability, raise_run_errors
from .conv1d import foreign_matmuls, linearize
from .module_dtype import apply_module_dtypes
from .report import PrecisionReport

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

__all__ = ["Precision", "PrecisionReport", "apply_precision", "capability", "raise_run_errors"]


def apply_precision(model: nn.Module, plan: Plan, device: torch.device) -> Precision:
    """Convert `model` in place for the plan's precision and return what the loop needs.

    Call it BEFORE wrapping in DDP/FSDP2/DeepSpeed and before torch.compile. Raises
    BackendMissing (exit 3) when the backend package is not importable, and
    EnvironmentProblem with rule FP8-HARDWARE / TE-RECIPE-HARDWARE (GPU too old) or
    FP8-NOT-APPLIED (FP8 asked for, zero Linear layers converted).
    """
    device = torch.device(device)
    if device.type == "cpu":  # every FP8 GEMM through torch's emulated kernel, whatever the CPU (cpu_scaled_mm.py)
        from .cpu_scaled_mm import install

        install()
    p = plan.precision
    if not p.fp8:
        precision = apply_amp(model, plan, device)
        apply_module_dtypes(model, plan)
        return precision
    raise_run_errors(plan, device, capability=capability(device))
    linearize(model)  # transformers' Conv1D (GPT-2) -> the equivalent nn.Linear, which every backend converts
    backend = BACKENDS.get(p.backend)
    if backend is not None:
        module, function = backend.apply.split(":")
        precision = getattr(importlib.import_module(module), function)(model, plan, device)
    else:  # the schema allows no other value; a hand-edited plan.json could
        raise LauncherError(f"unknown precision.backend {p.backend!r} in the plan; fix: regenerate the plan with `fp8launch plan SPEC` "
                            f"(precision.backend is one of {', '.join(BACKENDS)}; a registered backend must be registered here too)")
    fp8_layers = precision.report.fp8_layers + precision.report.fp8_expert_groups
    kept = tuple(k.split(" (", 1)[1][:-1] for k in precision.report.kept if " (" in k) if fp8_layers == 0 else ()  # "fqn (reason)"
    raise_run_errors(plan, device, fp8_layers=fp8_layers, kept=kept,
                     foreign_matmuls=tuple(foreign_matmuls(model)) if fp8_layers == 0 else ())
    apply_module_dtypes(model, plan)  # the layers rules keep in a dtype of their own (not converted above: kept)
    return precision
