"""torchao float8 training: swap the chosen nn.Linear layers for torchao's Float8Linear.

Runs for real on CPU too (torch._scaled_mm has a CPU kernel): all three recipes,
tensorwise, rowwise and rowwise_with_gw_hp, run forward and backward on CPU with torch 2.13.
"""

from __future__ import annotations

import dataclasses
import typing

import torch
from torch import nn

from launcher.errors import BackendMissing

from . import select
from .amp import Precision, amp_settings
from .report import count
from launcher.planning.install import INSTALL
from launcher.planning.read import recipes

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


def _torchao():
    """(Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp, Float8Linear)."""
    try:
        import torchao  # noqa: F401  (the package itself first: a stale torchao.float8 in sys.modules proves nothing)
        from torchao.float8 import (
            Float8LinearConfig,
            convert_to_float8_training,
            precompute_float8_dynamic_scale_for_fsdp,
        )
        from torchao.float8.float8_linear import Float8Linear
    except ImportError as e:
        raise BackendMissing("torchao", INSTALL["torchao"]) from e
    return Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp, Float8Linear


def float8_config_kwargs(plan: Plan) -> dict:
    """The fields fp8launch sets on top of Float8LinearConfig.from_recipe_name(recipe)."""
    t = plan.precision.torchao
    return {
        # float8 all-gather is an FSDP2 feature; rules FP8-ALLGATHER-* stop other combinations at plan time
        "enable_fsdp_float8_all_gather": bool(t.fsdp_float8_all_gather and plan.distributed.strategy == "fsdp2"),
        "pad_inner_dim": bool(t.pad_inner_dim),
    }


def float8_config(plan: Plan):
    """torchao's Float8LinearConfig for the plan."""
    Float8LinearConfig = _torchao()[0]
    base = Float8LinearConfig.from_recipe_name(plan.precision.torchao.recipe)
    return dataclasses.replace(base, **float8_config_kwargs(plan))


def _follow_cpu_autocast(module: nn.Module, args: tuple) -> tuple | None:
    # Float8Linear casts its input to the autocast dtype only under CUDA autocast ("For now,
    # hardcode to GPU's autocast dtype", torchao/float8/float8_linear.py). Do the same under CPU
    # autocast, so a CPU run has the dtypes of a GPU run (rowwise_with_gw_hp's high-precision
    # weight-gradient GEMM fails on mixed fp32/bf16 operands otherwise).
    if torch.is_autocast_enabled("cpu") and args and isinstance(args[0], torch.Tensor):
        return (args[0].to(torch.get_autocast_dtype("cpu")),) + args[1:]
    return None


class TorchaoPrecision(Precision):
    def __init__(self, *, precompute_scale: bool, **fields):
        super().__init__(**fields)
        self.precompute_scale = precompute_scale
        """precompute_float8_dynamic_scale_for_fsdp after each step (only with float8 all-gather)."""

    def after_optimizer_step(self, model: nn.Module) -> None:
        """One all-reduce computes every float8 weight's scale for the next FSDP2 all-gather."""
        if self.fsdp_float8_all_gather and self.precompute_scale:
            _torchao()[2](model)

    def fp8_label(self, module: nn.Module) -> str | None:
        if not isinstance(module, _torchao()[3]):
            return None
        return f"fp8 {recipe_of(module.config)}"


def recipe_of(config) -> str:
    """The torchao recipe a Float8Linear's config is, read from its casts (the FSDP2 all-gather and
    padding settings aside); "custom" when it is none of them."""
    Float8LinearConfig = _torchao()[0]
    for name in recipes("torchao"):
        base = Float8LinearConfig.from_recipe_name(name)
        if dataclasses.replace(config, enable_fsdp_float8_all_gather=base.enable_fsdp_float8_all_gather,
                               pad_inner_dim=base.pad_inner_dim) == base:
            return name
    return "custom"


def apply_torchao(model: nn.Module, plan: Plan, device: torch.device) -> TorchaoPrecision:
    _, convert, _, Float8Linear = _torchao()
    config = float8_config(plan)
    reasons = select.classify(model, plan)
    convert(model, config=config, module_filter_fn=select.fp8_filter(plan, model))
    if device.type == "cpu":
        for m in model.modules():
            if isinstance(m, Float8Linear):
                m.register_forward_pre_hook(_follow_cpu_autocast)
    recipe = plan.precision.torchao.recipe
    note = ", ".join(name for name, on in (("float8 all-gather", config.enable_fsdp_float8_all_gather),
                                           ("pad_inner_dim", config.pad_inner_dim)) if on)
    report = count(
        model, backend="torchao", recipe=recipe, mode="fp8", high_precision=plan.precision.high_precision,
        is_fp8=lambda m: isinstance(m, Float8Linear), reasons=reasons, note=note,
    )
    s = amp_settings(plan, device)
    return TorchaoPrecision(
        report=report, device_type=device.type, autocast_dtype=s["autocast_dtype"], param_dtype=s["param_dtype"],
        grad_scaler=s["grad_scaler"], fsdp_float8_all_gather=config.enable_fsdp_float8_all_gather,
        precompute_scale=plan.precision.torchao.precompute_scale,
    )
