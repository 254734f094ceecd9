"""Transformer Engine: replace torch modules with TE modules (te_swap decides which) and run the
forward inside te.autocast(recipe) (te_recipe decides which recipe).

Written against Transformer Engine 2.20 (its current names: te.autocast, te.quantized_model_init, the
recipe classes DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling,
NVFP4BlockScaling); the deprecated fp8_autocast / fp8_model_init only where the installed TE lacks the
new ones (TE 1.x, MS-AMP's pinned one).

- precision.te.fp8_dpa: the builtin models' attention core becomes te.DotProductAttention (causal,
  grouped-query, "bshd", rotary embeddings applied before it), whose GEMMs the recipe's fp8_dpa runs in
  FP8. The start record's `layers` shows it: "layers.0.attention.core": "fp8 dpa".
- precision.te.fp8_params: the swapped Linears are built under quantized_model_init (FP8 weights, the
  high-precision initial value kept aside), and `wrap_optimizer` replaces the torch optimizer by TE's
  FusedAdam with master_weights=True: it keeps an fp32 master copy of every FP8 weight (seeded from the
  high-precision initial value, not from its FP8 rounding), steps it and re-quantizes the weight. Under
  FSDP2 TE all-gathers the FP8 weights itself (Float8Tensor.fsdp_pre_all_gather / fsdp_post_all_gather).

The only code here that touches TE is `_te()`, `build_recipe`, `check_support`, the module constructors in
`swap_modules` and the optimizer in `wrap_optimizer`; tests pass a stand-in `te` namespace to those.
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from launcher.errors import BackendMissing, EnvironmentProblem, with_fix
from launcher.planning.install import INSTALL

from .amp import Precision, amp_settings
from .report import count
from .te_recipe import RECIPE_CLASS, fused_adam_args, recipe_kwargs, unread_fields
from .te_swap import Swap, attention_swaps, linear_reasons, swap_plan

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

TE_FP8_LINEAR_CLASSES = ("Linear", "LayerNormLinear")
"""TE modules whose GEMM runs in FP8 inside te.autocast (each counted as one Linear)."""
TE_ATTENTION_CLASS = "DotProductAttention"
"""The TE module the builtin attention core becomes with precision.te.fp8_dpa."""
FP8_DPA_LABEL = "fp8 dpa"
"""`layers` entry of an attention core that runs under the recipe's fp8_dpa."""

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


def _too_old(what: str, recipe: str) -> EnvironmentProblem:
    return EnvironmentProblem(with_fix(
        f"the installed Transformer Engine has no {what}, which precision.te.recipe = {recipe!r} needs (Transformer Engine 2.20 has it)",
        f'install a current Transformer Engine ({INSTALL["transformer_engine"]}), or set precision.te.recipe = "delayed"'),
        rule="BACKEND-MISSING")


def build_recipe(te_cfg, te_recipe) -> Any:
    """The TE recipe object: `te_recipe.<Class>(**kwargs)` with fp8_format as a Format member."""
    name, kwargs = recipe_kwargs(te_cfg)
    cls = getattr(te_recipe, name, None)
    if cls is None:
        raise _too_old(f"recipe class {name}", te_cfg.recipe)
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = te_recipe.Format[kwargs["fp8_format"]]
    return cls(**kwargs)


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


def quantized_init(te, recipe) -> ContextManager:
    """TE's context that builds FP8 weights, keeping each weight's high-precision initial value (for the
    optimizer's master copy): quantized_model_init (TE 2.x), else the deprecated fp8_model_init."""
    fn = getattr(te, "quantized_model_init", None) or getattr(te, "fp8_model_init", None)
    if fn is None:
        raise EnvironmentProblem(with_fix("the installed Transformer Engine has neither quantized_model_init nor fp8_model_init, "
                                          "which precision.te.fp8_params needs",
                                          f'install a current Transformer Engine ({INSTALL["transformer_engine"]}), or set '
                                          "precision.te.fp8_params = false"), rule="BACKEND-MISSING")
    params = inspect.signature(fn).parameters  # TE 1.x's fp8_model_init took neither keyword
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in (("recipe", recipe), ("preserve_high_precision_init_val", True)) if any_keyword or k in params}
    return fn(enabled=True, **kwargs)


def swap_modules(model: nn.Module, swaps: list[Swap], te, *, device: torch.device, recipe=None, fp8_params: bool = False) -> int:
    """Build each planned TE module on `device`, copy the torch module's weights into it and put it
    in the torch module's place. Returns how many modules were replaced."""
    n = 0
    for s in swaps:
        if not s.swapped:
            continue
        parent, name = _parent(model, s.fqn)
        src = getattr(parent, name)
        kwargs = dict(s.kwargs)
        if s.kind != "attention":  # te.DotProductAttention holds no weights and takes no device
            kwargs["device"] = device
        copy = list(s.params)
        if s.kind == "linear":
            kwargs["init_method"] = _copy_init(src.weight)
            copy = [(d, p) for d, p in copy if d != "weight"]
        with quantized_init(te, recipe) if fp8_params and s.kind == "linear" else contextlib.nullcontext():
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


def _local(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return p._local_tensor if isinstance(p, DTensor) else p


def is_quantized_weight(p: torch.Tensor) -> bool:
    """A parameter TE stores quantized (Float8Tensor and the other QuantizedTensors under FSDP2's DTensor):
    it carries the dequantize() and quantize_() every TE QuantizedTensor has."""
    local = _local(p)
    return type(local) not in (torch.Tensor, nn.Parameter) and callable(getattr(local, "dequantize", None)) \
        and callable(getattr(local, "quantize_", None))


def _local_slice(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """This rank's part of `full` (the whole tensor) where `p` is an FSDP2 DTensor; `full` itself otherwise."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return full
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
    return full[index]


@dataclass(kw_only=True, eq=False, repr=False)
class TEPrecision(Precision):
    te: Any
    recipe: Any
    """The TE recipe object every forward runs under."""
    te_recipe: Any = None
    plan: Plan | None = None
    high_precision_init: dict = field(default_factory=dict)
    """precision.te.fp8_params: {parameter name: its high-precision initial value}, the FusedAdam master copy's seed."""
    fp8_dpa: bool = field(init=False)
    """The recipe runs dot-product attention in FP8 (read from `recipe`)."""

    def __post_init__(self):
        self.fp8_dpa = bool(getattr(self.recipe, "fp8_dpa", False))

    @contextlib.contextmanager
    def autocast(self):
        """torch.autocast(high_precision) for what stays in torch, te.autocast(recipe) for TE modules."""
        with super().autocast(), te_autocast(self.te, self.recipe):
            yield

    def fp8_label(self, module: nn.Module) -> str | None:
        if self.fp8_dpa and isinstance(module, te_attention_classes(self.te)):
            return FP8_DPA_LABEL
        if not isinstance(module, te_fp8_classes(self.te)):
            return None
        name = type(self.recipe).__name__
        return f"fp8 {TE_RECIPE_NAMES.get(name, name)}"

    def monitor_targets(self, model: nn.Module) -> list:
        """Every TE FP8 module under this run's recipe (launcher/train/monitor/hooks.py)."""
        from launcher.train.monitor.hooks import te_targets

        return te_targets(model, te_fp8_classes(self.te), self.recipe)

    def delayed_recipe(self, amax_history_len: int):
        """A DelayedScaling recipe of this run's FP8 format with `amax_history_len`: what a resumed TE module's
        saved delayed-scaling state is allocated for (launcher/train/precision/te_state.py)."""
        if type(self.recipe).__name__ == "DelayedScaling" and getattr(self.recipe, "amax_history_len", None) == amax_history_len:
            return self.recipe
        kwargs = {"amax_history_len": amax_history_len}
        if getattr(self.recipe, "fp8_format", None) is not None:
            kwargs["fp8_format"] = self.recipe.fp8_format
        return self.te_recipe.DelayedScaling(**kwargs)

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        """precision.te.fp8_params: TE's FusedAdam with an fp32 master copy of every FP8 weight replaces the
        torch optimizer (which would step the FP8 weights themselves and lose every update below FP8's
        resolution); each master copy starts from its weight's high-precision initial value. The other (fp32)
        parameters get no master copy (`_states_without_master`)."""
        if self.plan is None or not self.plan.precision.te.fp8_params:
            return model, optimizer
        from launcher.train.fqn import clean_fqn
        from launcher.train.optim import param_groups

        fused_adam = getattr(getattr(self.te, "optimizers", None), "FusedAdam", None)
        if fused_adam is None:
            raise EnvironmentProblem(with_fix("the installed Transformer Engine has no te.optimizers.FusedAdam, the optimizer that "
                                              "keeps master weights for precision.te.fp8_params",
                                              f'install a current Transformer Engine ({INSTALL["transformer_engine"]}), or set '
                                              "precision.te.fp8_params = false"), rule="BACKEND-MISSING")
        new = fused_adam(param_groups(model.parameters(), self.plan.train), **fused_adam_args(self.plan))
        for name, p in model.named_parameters():
            full = self.high_precision_init.pop(clean_fqn(name).removeprefix("module."), None)
            if full is None or not p.requires_grad:
                continue
            new.initialize_state(p, store_param_remainders=False)
            seed = _local_slice(full, p).to(device=_local(p).device, dtype=torch.float32)
            new.set_scaled_state(p, "master_param", seed)
        self.high_precision_init.clear()
        _states_without_master(new, [p for p in model.parameters() if p.requires_grad and not new.state[p]
                                     and not is_quantized_weight(p) and _local(p).dtype == torch.float32])
        return model, new


def _states_without_master(optimizer, params: list) -> None:
    """FusedAdam(master_weights=True) gives every parameter an fp32 master copy when it first steps it (initialize_state),
    and steps a plain fp32 parameter in place without ever reading that copy (TE 2.20.2 optimizers/fused_adam.py, step:
    the p_f32_model list): 4 bytes a parameter for nothing, 4.2 GB for llama3-8b's embedding and head. Their states
    (exp_avg, exp_avg_sq) are made here with master_weights off for the call, so the step finds them and makes none."""
    optimizer.master_weights = False
    try:
        for p in params:
            optimizer.initialize_state(p, store_param_remainders=False)
    finally:
        optimizer.master_weights = True


TE_RECIPE_NAMES = {cls: name for name, cls in RECIPE_CLASS.items()}
"""TE recipe class -> precision.te.recipe."""


def _norms_note(swaps: list[Swap]) -> str:
    n = sum(1 for s in swaps if s.swapped and s.kind in ("layernorm", "rmsnorm"))
    return f"{n} norms in TE" if n else ""


def te_fp8_classes(te) -> tuple[type, ...]:
    return tuple(getattr(te, n) for n in TE_FP8_LINEAR_CLASSES if isinstance(getattr(te, n, None), type))


def te_attention_classes(te) -> tuple[type, ...]:
    cls = getattr(te, TE_ATTENTION_CLASS, None)
    return (cls,) if isinstance(cls, type) else ()


def _take_high_precision_init(model: nn.Module) -> dict[str, torch.Tensor]:
    """{parameter name: high-precision initial value} of every FP8 weight quantized_model_init built (TE keeps
    it on the parameter, on the CPU, as get_high_precision_init_val()); taken off the parameters, which FSDP2
    replaces by their shards."""
    out = {}
    for name, p in model.named_parameters():
        get = getattr(p, "get_high_precision_init_val", None)
        value = get() if callable(get) else None
        if value is not None:
            out[name] = value
            clear = getattr(p, "clear_high_precision_init_val", None)
            if callable(clear):
                clear()
    return out


def apply_te(model: nn.Module, plan: Plan, device: torch.device, te=None, te_recipe=None) -> TEPrecision:
    """Swap modules and return the TE precision. `te`/`te_recipe` default to the real packages."""
    from launcher.planning.read import defaults
    from launcher.planning.rules import Facts, rule_error

    if te is None or te_recipe is None:
        te, te_recipe = _te()
    cfg = plan.precision.te
    if device.type == "cuda":
        check_support(te, cfg.recipe)
    if cfg.fp8_mha:
        raise rule_error("TE-FP8-MHA", Facts(plan=plan))  # planning refuses it; a hand-edited plan.json could hold it
    recipe = build_recipe(cfg, te_recipe)
    swaps = swap_plan(model, cfg, plan)
    if cfg.fp8_dpa and not any(s.kind == "attention" for s in swaps):  # no attention core of ours (precision.keep may keep some)
        raise rule_error("TE-FP8-ATTENTION-MODEL", Facts(plan=plan))
    if cfg.fp8_dpa and not te_attention_classes(te):
        raise _too_old("te.DotProductAttention", cfg.recipe)
    swap_modules(model, swaps, te, device=device, recipe=recipe, fp8_params=cfg.fp8_params)
    high_precision_init = _take_high_precision_init(model) if cfg.fp8_params else {}

    fp8_classes = te_fp8_classes(te)
    ignored = unread_fields(cfg, defaults()["precision"]["te"])
    attention = len(attention_swaps(swaps))
    note = ", ".join(filter(None, [
        cfg.fp8_format if "fp8_format" in recipe_kwargs(cfg)[1] else "",
        "fp8 weights, fp32 master copy in FusedAdam" if cfg.fp8_params else "",
        _norms_note(swaps),
        f"{attention} attention cores in FP8 (te.DotProductAttention)" if attention else "",
        ("ignores " + ", ".join(f"precision.te.{f}" for f in ignored)) if ignored else "",
    ]))
    report = count(
        model, backend="te", recipe=cfg.recipe, mode="fp8", high_precision=plan.precision.high_precision,
        is_fp8=lambda m: isinstance(m, fp8_classes), reasons=linear_reasons(swaps), note=note,
    )
    s = amp_settings(plan, device)
    return TEPrecision(
        te=te, recipe=recipe, te_recipe=te_recipe, plan=plan, high_precision_init=high_precision_init, report=report,
        device_type=device.type, autocast_dtype=s["autocast_dtype"], param_dtype=s["param_dtype"], grad_scaler=s["grad_scaler"],
    )
