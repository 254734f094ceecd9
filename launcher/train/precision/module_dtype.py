"""`[[precision.rules]]` entries whose `mode` is not the run's high precision: those Linears compute in a dtype
of their own (e.g. an fp32 router in a bf16 run). Their forward leaves autocast and runs in that dtype; under
FSDP2 each becomes its own FSDP unit whose MixedPrecisionPolicy all-gathers its weight in that dtype
(launcher/train/engines/fsdp2.py), so an fp32 module computes on fp32 weights, not on bf16-rounded ones."""

from __future__ import annotations

import typing

import torch
import torch.nn.functional as F
from torch import nn

from launcher.planning.selection import matching_rule
from launcher.train.fqn import clean_fqn

from .select import called_functionally, linears

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MARK = "fp8launch_dtype"
"""The attribute a module computing in a dtype of its own carries: its mode ("fp32", ...)."""


def own_dtypes(model: nn.Module, plan: Plan) -> dict[str, str]:
    """{fqn: mode} of the Linears a `[[precision.rules]]` mode entry gives another dtype than the run's."""
    high = plan.precision.compute_dtype
    out = {}
    for fqn, module in linears(model):
        rule = matching_rule(clean_fqn(fqn), plan)
        if rule is not None and rule.mode and rule.mode != high and not called_functionally(module):
            out[fqn] = rule.mode
    return out


def apply_module_dtypes(model: nn.Module, plan: Plan) -> dict[str, str]:
    """Give each such Linear its forward in its own dtype; returns {fqn: mode}."""
    chosen = own_dtypes(model, plan)
    for fqn, mode in chosen.items():
        _compute_in(model.get_submodule(fqn), mode)
    return chosen


def _compute_in(module: nn.Module, mode: str) -> None:
    dtype = DTYPES[mode]

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            bias = None if module.bias is None else module.bias.to(dtype)
            return F.linear(x.to(dtype), module.weight.to(dtype), bias)

    module.forward = forward
    setattr(module, MARK, mode)


def dtype_of(module: nn.Module) -> str | None:
    """The mode a module computes in when a rule gave it its own, else None."""
    return getattr(module, MARK, None)
