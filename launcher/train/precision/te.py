"""Transformer Engine: replace torch modules with TE modules (te_swap decides which) and run the
forward inside te.autocast(recipe) (te_recipe decides which recipe).

The only code here that touches TE is `_te()`, `build_recipe`, `check_support` and the module
constructors in `swap_modules`; tests pass a stand-in `te` namespace to those.
"""

from __future__ import annotations

import contextlib
import typing
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from launcher.errors import BackendMissing, EnvironmentProblem, with_fix

from .amp import Precision, amp_settings
from .report import count
from .te_recipe import recipe_kwargs, unread_fields
from .te_swap import Swap, linear_reasons, swap_plan
from launcher.planning.install import INSTALL

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

TE_FP8_LINEAR_CLASSES = ("Linear", "LayerNormLinear")
"""TE modules whose GEMM runs in FP8 inside te.autocast (each counted as one Linear)."""

_SUPPORT_CHECK = {
    "delayed": ("is_fp8_available", "FP8-HARDWARE"),
    "current": ("is_fp8_available", "FP8-HARDWARE"),
    "block": ("is_fp8_block_scaling_available", "TE-RECIPE-HARDWARE"),
    "mxfp8": ("is_mxfp8_available", "TE-RECIPE-HARDWARE"),
    "nvfp4": ("is_nvfp4_available", "TE-RECIPE-HARDWARE"),
}


def _te():
    """(transformer_engine.pytorch, transformer_engine.common.recipe)."""
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as te_recipe
    except ImportError as e:
        raise BackendMissing("transformer_engine", INSTALL["transformer_engine"]) from e
    return te, te_recipe


def build_recipe(te_cfg, te_recipe) -> Any:
    """The TE recipe object: `te_recipe.<Class>(**kwargs)` with fp8_format as a Format member."""
    name, kwargs = recipe_kwargs(te_cfg)
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = te_recipe.Format[kwargs["fp8_format"]]
    return getattr(te_recipe, name)(**kwargs)


def check_support(te, recipe: str) -> None:
    """TE's own availability check for the recipe (compute capability, CUDA and cuBLASLt versions;
    MXFP8 is refused on sm120). The rule table has already checked the capability."""
    fn_name, rule = _SUPPORT_CHECK[recipe]
    fn = getattr(te, fn_name, None)
    if fn is None:
        return
    ok, reason = fn(return_reason=True)
    if not ok:
        raise EnvironmentProblem(
            with_fix(f"Transformer Engine cannot run recipe {recipe!r} here: {reason}",
                     'set precision.te.recipe = "current" (or "delayed"), or precision.mode = "bf16"'), rule=rule)


def _parent(model: nn.Module, fqn: str) -> tuple[nn.Module, str]:
    parent_name, _, name = fqn.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), name


def _copy_init(src: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """A TE init_method that copies the existing weight: TE then quantizes it itself when
    quantized_model_init is on, exactly as it would a fresh initialization."""

    def init(weight: torch.Tensor) -> None:
        with torch.no_grad():
            weight.copy_(src.detach().to(device=weight.device, dtype=weight.dtype))

    return init


def _quantized_init(te, enabled: bool, recipe) -> ContextManager:
    if not enabled:
        return contextlib.nullcontext()
    init = getattr(te, "quantized_model_init", None) or te.fp8_model_init  # older TE: fp8_model_init
    return init(enabled=True, recipe=recipe)


def swap_modules(model: nn.Module, swaps: list[Swap], te, *, device: torch.device, recipe=None, fp8_params: bool = False) -> int:
    """Build each planned TE module on `device`, copy the torch module's weights into it and put it
    in the torch module's place. Returns how many modules were replaced."""
    n = 0
    for s in swaps:
        if not s.swapped:
            continue
        parent, name = _parent(model, s.fqn)
        src = getattr(parent, name)
        kwargs = dict(s.kwargs, device=device)
        copy = list(s.params)
        if s.kind == "linear":
            kwargs["init_method"] = _copy_init(src.weight)
            copy = [(d, p) for d, p in copy if d != "weight"]
        with _quantized_init(te, fp8_params and s.kind == "linear", recipe):
            new = getattr(te, s.te_class)(**kwargs)
        with torch.no_grad():
            for dst_name, src_name in copy:
                getattr(new, dst_name).copy_(getattr(src, src_name))
        for dst_name, src_name in s.params:  # frozen stays frozen
            getattr(new, dst_name).requires_grad_(getattr(src, src_name).requires_grad)
        setattr(parent, name, new)
        n += 1
    return n


def te_autocast(te, recipe) -> ContextManager:
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)  # older TE (and MS-AMP's pinned 1.x): fp8_autocast


class TEPrecision(Precision):
    def __init__(self, *, te, recipe, **fields):
        super().__init__(**fields)
        self.te = te
        self.recipe = recipe
        """The TE recipe object every forward runs under."""

    @contextlib.contextmanager
    def autocast(self):
        """torch.autocast(high_precision) for what stays in torch, te.autocast(recipe) for TE modules."""
        with super().autocast(), te_autocast(self.te, self.recipe):
            yield

    def fp8_label(self, module: nn.Module) -> str | None:
        if not isinstance(module, te_fp8_classes(self.te)):
            return None
        name = type(self.recipe).__name__
        return f"fp8 {TE_RECIPE_NAMES.get(name, name)}"


TE_RECIPE_NAMES = {"DelayedScaling": "delayed", "Float8CurrentScaling": "current", "Float8BlockScaling": "block",
                   "MXFP8BlockScaling": "mxfp8", "NVFP4BlockScaling": "nvfp4"}
"""TE recipe class -> precision.te.recipe."""


def _norms_note(swaps: list[Swap]) -> str:
    n = sum(1 for s in swaps if s.swapped and s.kind != "linear")
    return f"{n} norms in TE" if n else ""


def te_fp8_classes(te) -> tuple[type, ...]:
    return tuple(getattr(te, n) for n in TE_FP8_LINEAR_CLASSES if isinstance(getattr(te, n, None), type))


def apply_te(model: nn.Module, plan: Plan, device: torch.device, te=None, te_recipe=None) -> TEPrecision:
    """Swap modules and return the TE precision. `te`/`te_recipe` default to the real packages."""
    from launcher.planning.read import defaults

    if te is None or te_recipe is None:
        te, te_recipe = _te()
    cfg = plan.precision.te
    if device.type == "cuda":
        check_support(te, cfg.recipe)
    recipe = build_recipe(cfg, te_recipe)
    swaps = swap_plan(model, cfg, plan)
    swap_modules(model, swaps, te, device=device, recipe=recipe, fp8_params=cfg.fp8_params)

    fp8_classes = te_fp8_classes(te)
    ignored = unread_fields(cfg, defaults()["precision"]["te"])
    note = ", ".join(filter(None, [
        cfg.fp8_format if "fp8_format" in recipe_kwargs(cfg)[1] else "",
        "fp8 weights" if cfg.fp8_params else "",
        _norms_note(swaps),
        ("ignores " + ", ".join(f"precision.te.{f}" for f in ignored)) if ignored else "",
    ]))
    report = count(
        model, backend="te", recipe=cfg.recipe, mode="fp8", high_precision=plan.precision.high_precision,
        is_fp8=lambda m: isinstance(m, fp8_classes), reasons=linear_reasons(swaps), note=note,
    )
    s = amp_settings(plan, device)
    return TEPrecision(
        te=te, recipe=recipe, report=report, device_type=device.type, autocast_dtype=s["autocast_dtype"],
        param_dtype=s["param_dtype"], grad_scaler=s["grad_scaler"],
    )
