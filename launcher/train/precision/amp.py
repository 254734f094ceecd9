"""Plain torch mixed precision (fp32 / bf16 / fp16), and the `Precision` object every backend returns.

The FP8 backends build on this: the parts of the model that are not FP8 GEMMs run in
`precision.high_precision` through the same autocast, and fp16 gets the same loss scaler.

Who casts what depends on the engine:
- DDP / single process: torch.autocast(device, dtype) around the forward; fp16 adds a
  torch.amp.GradScaler.
- FSDP2: the same autocast; `param_dtype` is what the engine puts in FSDP2's
  MixedPrecisionPolicy; fp16 uses FSDP's ShardedGradScaler (it unscales sharded gradients).
- DeepSpeed: no autocast and no scaler. deepspeed.json's "bf16"/"fp16" section makes
  DeepSpeed cast the model itself, and its fp16 optimizer scales the loss. Autocasting on
  top would be a second, disagreeing source of truth.
"""

from __future__ import annotations

import contextlib
import typing
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable

import torch
from torch import nn

from .report import PrecisionReport, count

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(kw_only=True, eq=False, repr=False)
class Precision:
    """What the engine and the training loop need from the precision backend.

    This base class is plain torch AMP; the FP8 backends subclass it (dataclasses too, adding their own
    fields) and override `autocast`, `wrap_optimizer`, `after_optimizer_step` or `clip_grad_norm_`.
    """

    report: PrecisionReport
    device_type: str
    autocast_dtype: torch.dtype | None
    """dtype of torch.autocast around the forward; None: no autocast (fp32, or DeepSpeed casts)."""
    param_dtype: torch.dtype | None
    """dtype for FSDP2's MixedPrecisionPolicy(param_dtype=...); None keeps fp32 parameters."""
    grad_scaler: Any = None
    """torch.amp.GradScaler (ShardedGradScaler under FSDP2) when the compute dtype is fp16, else None."""
    fsdp_float8_all_gather: bool = False
    """torchao float8 weights are all-gathered in FP8 by FSDP2."""
    ddp_class: type | None = None
    """The DDP class the engine must wrap with when the backend needs its own (MS-AMP); None: torch's."""
    recounter: Callable[[nn.Module], PrecisionReport] | None = None
    """How `recount` counts the FP8 layers again (MS-AMP, which converts after apply_precision); None: it keeps `report`."""

    def autocast(self) -> ContextManager:
        """The context the forward (and loss) runs in."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Call once the optimizer exists (before wrapping in the engine); identity here."""
        return model, optimizer

    def after_optimizer_step(self, model: nn.Module) -> None:
        """Call after every optimizer step; nothing to do here."""

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        """Clip gradients (after grad_scaler.unscale_ when there is a scaler); MS-AMP overrides this."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def fp8_label(self, module: nn.Module) -> str | None:
        """"fp8 <recipe>" when `module` runs its GEMM in FP8 as converted (read from the module), else None."""
        return None

    def deepspeed(self):
        """The module a DeepSpeed run initializes through when the backend has its own DeepSpeed engine (MS-AMP's
        msamp.deepspeed, which converts the model inside initialize); None: DeepSpeed itself."""
        return None

    def monitor_targets(self, model: nn.Module) -> list:
        """The FP8 layers of `model` the FP8 monitor hooks, as the backend converted them (launcher/train/monitor);
        none here (AMP, and MS-AMP, whose casts are its own)."""
        return []

    def recount(self, model: nn.Module) -> PrecisionReport:
        """Count the FP8 layers of `model` again and keep that as `report`: for a conversion that
        happens after apply_precision (MS-AMP converts in wrap_optimizer, or inside DeepSpeed for O3)."""
        if self.recounter is not None:
            self.report = self.recounter(model)
        return self.report


def amp_settings(plan: Plan, device: torch.device) -> dict:
    """autocast_dtype, param_dtype, grad_scaler and the note for the start line, for the plan's
    compute dtype (precision.mode, or precision.high_precision in fp8 mode) and strategy."""
    name = plan.precision.compute_dtype
    strategy = plan.distributed.strategy
    if strategy == "deepspeed":
        note = "" if name == "fp32" else "DeepSpeed casts the model" + (" and scales the loss" if name == "fp16" else "")
        return dict(autocast_dtype=None, param_dtype=None, grad_scaler=None, note=note)
    if name == "fp32":
        return dict(autocast_dtype=None, param_dtype=None, grad_scaler=None, note="")
    dtype = DTYPES[name]
    scaler = None
    if name == "fp16":
        if strategy == "fsdp2":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            scaler = ShardedGradScaler(device=device.type)
        else:
            scaler = torch.amp.GradScaler(device.type)
    note = "autocast" + (" + ShardedGradScaler" if strategy == "fsdp2" and scaler else " + GradScaler" if scaler else "")
    return dict(autocast_dtype=dtype, param_dtype=dtype, grad_scaler=scaler, note=note)


def apply_amp(model: nn.Module, plan: Plan, device: torch.device) -> Precision:
    """fp32 / bf16 / fp16: nothing to convert; the model keeps fp32 weights."""
    s = amp_settings(plan, device)
    report = count(
        model, backend="amp", recipe=plan.precision.mode, mode=plan.precision.mode,
        high_precision=plan.precision.compute_dtype, is_fp8=lambda m: False, reasons={}, note=s["note"],
    )
    return Precision(
        report=report, device_type=device.type, autocast_dtype=s["autocast_dtype"],
        param_dtype=s["param_dtype"], grad_scaler=s["grad_scaler"],
    )

