"""A Transformer Engine 2.20 stand-in for CPU tests (TE needs CUDA), as strict as the library where fp8launch
depends on it, and the tests that hold it to that contract:

- constructors, recipes, te.autocast, quantized_model_init, te.distributed.checkpoint and FusedAdam take only
  the keyword names TE 2.20.2 takes (tests/train/te_2_20.py), and refuse any other;
- FP8 numerics on the CPU: each GEMM operand is cast to float8 (E4M3 forward, E5M2 gradients with HYBRID) with a
  per-tensor scale: current scaling from the tensor's own amax, delayed scaling from the amax history of earlier
  steps (TE's fp8_meta layout: fp8_meta["scaling_fwd"/"scaling_bwd"].scale / .amax_history, 3 tensors per GEMM
  forward, 2 backward; the scales updated when the outermost autocast exits, as FP8GlobalStateManager does);
- extra state as TE 2.x writes it: an empty uint8 tensor before the first FP8 forward and for stateless recipes,
  else `torch.frombuffer(pickle.dumps({...}), uint8)`, which `set_extra_state` refuses to unpickle unless
  NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 (module/_extra_state.py);
- get_fp8_meta_tensors / reset_fp8_meta_tensors / init_fp8_meta_tensors as module/base.py has them;
- te.distributed.checkpoint is dynamo-disabled (torch._disable_dynamo), recomputes with the forward's scales;
- DotProductAttention (causal, "bshd", grouped-query) on an emulated GPU (fake_te(capability=...), an H100 unless told):
  it selects its backend as get_attention_backend does and raises TE's "No dot product attention backend is
  available" where TE would (FP8 attention: sm90 trains head_dim 128 only, ...); under fp8_dpa Q/K/V (one scale), S,
  dO, dP (and with delayed scaling O, dQKV) in FP8 in TE's quantizer slots, and under current scaling TE's layout: a
  [current, delayed] recipe pair whose delayed state (S and dP: 3 forward, 2 backward slots) is fp8_meta's;
- quantized_model_init builds Float8Tensor weights (float8 data + scale, a tensor subclass that dequantizes
  for compute, with FSDP2's fsdp_pre_all_gather / fsdp_post_all_gather) and keeps the high-precision initial
  value (get_high_precision_init_val); FusedAdam keeps an fp32 master copy (master_weights) and re-quantizes.

tests/gpu/test_te_conformance.py runs the same assertions on this stand-in (CPU) and on the real TE (GPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import math
import os
import pickle
import pickletools
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map

from .te_2_20 import (
    DELAYED_STATE_KEYS,
    EXTRA_STATE_REFUSAL,
    TE_CALL_ARGS,
    TE_FORMATS,
    TE_MODULE_ARGS,
    TE_OPTIMIZER_ARGS,
    TE_RECIPE_FIELDS,
    UNSAFE_PICKLE_ENV,
)

FP8_MAX = {"E4M3": 448.0, "E5M2": 57344.0}
TORCH_FP8 = {"E4M3": torch.float8_e4m3fn, "E5M2": torch.float8_e5m2}


def _check(name: str, kwargs: dict, table: dict = TE_MODULE_ARGS) -> None:
    unknown = set(kwargs) - table[name]
    if unknown:
        raise TypeError(f"{name}() got unexpected keyword arguments {sorted(unknown)} (not in TE 2.20.2)")


# --- recipes (transformer_engine.common.recipe) -----------------------------------------------------------------

Format = enum.Enum("Format", {f: f for f in sorted(TE_FORMATS)})


class Recipe:
    """TE's recipes are dataclasses: equal when their fields are; the kind predicates TE's code asks."""

    _DEFAULTS: dict = {}

    def __init__(self, **kwargs):
        _check(type(self).__name__, kwargs, TE_RECIPE_FIELDS)
        for k, v in {**self._DEFAULTS, **kwargs}.items():
            setattr(self, k, v)
        if getattr(self, "fp8_format", None) is None:
            self.fp8_format = Format.HYBRID

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None

    @property
    def cls(self) -> str:
        """The recipe class's name (what the tests compare)."""
        return type(self).__name__

    def delayed(self):
        return isinstance(self, DelayedScaling)

    def float8_current_scaling(self):
        return isinstance(self, Float8CurrentScaling)

    def mxfp8(self):
        return isinstance(self, MXFP8BlockScaling)

    def float8_block_scaling(self):
        return isinstance(self, Float8BlockScaling)

    def nvfp4(self):
        return isinstance(self, NVFP4BlockScaling)

    def custom(self):
        return False


class DelayedScaling(Recipe):
    _DEFAULTS = {"margin": 0, "fp8_format": None, "amax_history_len": 1024, "amax_compute_algo": "max", "reduce_amax": True,
                 "fp8_dpa": False, "fp8_mha": False}


class Float8CurrentScaling(Recipe):
    _DEFAULTS = {"fp8_format": None, "fp8_dpa": False, "fp8_mha": False}


class Float8BlockScaling(Recipe):
    _DEFAULTS = {"fp8_format": None, "fp8_dpa": False, "fp8_mha": False}

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        assert not (self.fp8_dpa or self.fp8_mha), "FP8 attention is not supported for Float8BlockScaling."


class MXFP8BlockScaling(Recipe):
    _DEFAULTS = {"margin": 0, "fp8_format": None, "fp8_dpa": False, "fp8_mha": False}


class NVFP4BlockScaling(Recipe):
    _DEFAULTS = {"fp8_format": None, "fp8_dpa": False, "fp8_mha": False}


RECIPES = {c.__name__: c for c in (DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling)}


def _formats(recipe) -> tuple[str, str]:
    """(forward, backward) float8 formats of a recipe."""
    return ("E4M3", "E4M3") if recipe.fp8_format is Format.E4M3 else ("E4M3", "E5M2")


# --- global FP8 state (FP8GlobalStateManager) -------------------------------------------------------------------

@dataclasses.dataclass
class _GlobalState:
    enabled: bool = False
    recipe: Recipe | None = None
    depth: int = 0
    with_fp8_parameters: bool = False
    preserve_high_precision_init_val: bool = False
    fp8_parameters_recipe: Recipe | None = None
    recompute: bool = False
    checkpointing: bool = False
    forwarded: list = dataclasses.field(default_factory=list)
    """Delayed-scaling modules that ran a forward in this autocast region (their fwd scales update on exit)."""
    capability: tuple[int, int] = (9, 0)
    """The GPU the stand-in is (torch.cuda.get_device_capability): what DotProductAttention selects its backend for."""
    cudnn: tuple[int, int, int] = (9, 21, 0)
    """The cuDNN version it has (cudnnGetVersion)."""


STATE = _GlobalState()


class autocast:  # noqa: N801 - TE's name
    def __init__(self, enabled=True, calibrating=False, recipe=None, amax_reduction_group=None, _graph=False):
        self.enabled, self.recipe = enabled, recipe if recipe is not None else DelayedScaling()
        self.saved = None

    def __enter__(self):
        self.saved = (STATE.enabled, STATE.recipe)
        STATE.enabled, STATE.recipe = self.enabled, self.recipe
        STATE.depth += 1
        return self

    def __exit__(self, *exc):
        STATE.depth -= 1
        STATE.enabled, STATE.recipe = self.saved
        if STATE.depth == 0 and self.enabled and torch.is_grad_enabled() and not STATE.recompute:
            for m in STATE.forwarded:  # reduce_and_update_fp8_tensors(forward=True)
                m._update_scales("scaling_fwd")
            STATE.forwarded.clear()
        return False


def fp8_autocast(enabled=True, calibrating=False, fp8_recipe=None, fp8_group=None, _graph=False):
    """Deprecated in TE 2.x (quantization.py): the same as autocast(recipe=fp8_recipe)."""
    return autocast(enabled=enabled, calibrating=calibrating, recipe=fp8_recipe)


@contextlib.contextmanager
def quantized_model_init(enabled=True, recipe=None, preserve_high_precision_init_val=False):
    saved = (STATE.with_fp8_parameters, STATE.preserve_high_precision_init_val, STATE.fp8_parameters_recipe)
    STATE.with_fp8_parameters, STATE.preserve_high_precision_init_val = enabled, preserve_high_precision_init_val
    STATE.fp8_parameters_recipe = recipe if recipe is not None else DelayedScaling()
    try:
        yield
    finally:
        STATE.with_fp8_parameters, STATE.preserve_high_precision_init_val, STATE.fp8_parameters_recipe = saved


# --- FP8 casts -----------------------------------------------------------------------------------------------------

def _cast(t: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """t -> float8 (saturating) -> back, in t's dtype: the values an FP8 GEMM sees."""
    s = scale.to(torch.float32)
    q = (t.float() * s).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(TORCH_FP8[fmt])
    return (q.float() / s).to(t.dtype)


def _current_scale(t: torch.Tensor, fmt: str, margin: int = 0) -> torch.Tensor:
    amax = t.detach().abs().max().float()
    return torch.where(amax > 0, FP8_MAX[fmt] / amax / 2**margin, torch.ones((), dtype=torch.float32))


class _FakeQuant(torch.autograd.Function):
    """Forward: the FP8 cast of x; backward: the gradient as it is (straight through)."""

    @staticmethod
    def forward(ctx, x, scale, fmt):
        return _cast(x, scale, fmt)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _GradQuant(torch.autograd.Function):
    """Forward: identity; backward: the gradient cast to FP8 with the module's backward scaling (grad_output)."""

    @staticmethod
    def forward(ctx, x, module, index):
        ctx.module, ctx.index = module, index
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return ctx.module._quantize(grad, "scaling_bwd", ctx.index), None, None


# --- modules (transformer_engine.pytorch.module.base.TransformerEngineBaseModule) -------------------------------

class _DelayedState:
    """DelayedScalingRecipeState: scale (n,), amax_history (len, n)."""

    def __init__(self, recipe, n: int, device=None):
        self.recipe = recipe
        self.scale = torch.ones(n, dtype=torch.float32, device=device)
        self.amax_history = torch.zeros(recipe.amax_history_len, n, dtype=torch.float32, device=device)


class _StatelessState:
    def __init__(self, recipe):
        self.recipe = recipe


def _adjust_amax_history_length(state: _DelayedState, length: int) -> None:
    """module/base.py adjust_amax_history_length: the history cut or zero-padded to `length` rows."""
    h = state.amax_history
    if h.shape[0] != length:
        new = torch.zeros(length, h.shape[1], dtype=h.dtype, device=h.device)
        n = min(h.shape[0], length)
        new[:n] = h[:n]
        state.amax_history = new


class TEModule(nn.Module):
    """The parts of TransformerEngineBaseModule fp8launch depends on."""

    num_gemms = 1

    def __init__(self):
        super().__init__()
        self.fp8 = False
        self.fp8_initialized = False
        self.fp8_meta = {"fp8_checkpoint": False, "fp8_group": None}
        self.fp8_meta_tensors_initialized = False
        self.quantizers: dict = {"scaling_fwd": [], "scaling_bwd": []}
        """Per slot (FP8FwdTensors / FP8BwdTensors index): the recipe state that scales it and its index there."""
        self._stash: list = []

    # fp8_meta as module/base.py keeps it
    def set_meta_tensor(self, fwd: bool, recipe) -> None:
        key = "scaling_fwd" if fwd else "scaling_bwd"
        if self.fp8_meta_tensors_initialized:
            state = self.fp8_meta[key]
            if recipe.delayed() and isinstance(state, _DelayedState):
                _adjust_amax_history_length(state, recipe.amax_history_len)
                return
            if not recipe.delayed() and isinstance(state, _StatelessState):
                return
        n = self.fp8_meta["num_gemms"] * (3 if fwd else 2)
        self.fp8_meta[key] = _DelayedState(recipe, n) if recipe.delayed() else _StatelessState(recipe)
        self.quantizers[key] = [(self.fp8_meta[key], i) for i in range(n)]

    def init_fp8_meta_tensors(self, recipe) -> None:
        self.set_meta_tensor(True, recipe)
        self.set_meta_tensor(False, recipe)
        self.fp8_meta_tensors_initialized = True

    def get_fp8_meta_tensors(self):
        if "scaling_fwd" not in self.fp8_meta or "scaling_bwd" not in self.fp8_meta:
            return None
        with torch.no_grad():
            return {k: [self.fp8_meta[k].scale.clone(), self.fp8_meta[k].amax_history.clone()] for k in ("scaling_fwd", "scaling_bwd")}

    def reset_fp8_meta_tensors(self, fp8_meta_tensors=None) -> None:
        with torch.no_grad():
            for key in ("scaling_fwd", "scaling_bwd"):
                if key not in self.fp8_meta:
                    continue
                if fp8_meta_tensors is None:
                    self.fp8_meta[key].scale.fill_(1)
                    self.fp8_meta[key].amax_history.zero_()
                else:
                    if key not in fp8_meta_tensors:
                        raise KeyError(f"Cannot reset fp8 tensors: key '{key}' not found in fp8_meta_tensors.")
                    self.fp8_meta[key].scale.copy_(fp8_meta_tensors[key][0])
                    self.fp8_meta[key].amax_history.copy_(fp8_meta_tensors[key][1])

    def get_extra_state(self) -> torch.Tensor:
        if not (self.fp8_meta["fp8_checkpoint"] or self.fp8):
            return torch.empty(0, dtype=torch.uint8)
        recipe = self.fp8_meta["recipe"]
        if not recipe.delayed():
            return torch.empty(0, dtype=torch.uint8)
        state = {"recipe": recipe,
                 "scale_fwd": self.fp8_meta["scaling_fwd"].scale.clone(),
                 "amax_history_fwd": self.fp8_meta["scaling_fwd"].amax_history.clone(),
                 "scale_bwd": self.fp8_meta["scaling_bwd"].scale.clone(),
                 "amax_history_bwd": self.fp8_meta["scaling_bwd"].amax_history.clone(),
                 "extra_fp8_variables": {k: v for k, v in self.fp8_meta.items() if isinstance(v, (bool, int, float, str, tuple, list))}}
        return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)

    def set_extra_state(self, state) -> None:
        if state is None:
            return
        context = type(self).__name__
        if isinstance(state, torch.Tensor):
            if state.numel() == 0:
                return
            data = state.detach().cpu().numpy().tobytes()
            if not _should_load_extra_state_pickle(data, context):
                return
            state = pickle.loads(data)
        elif isinstance(state, io.BytesIO):
            if os.environ.get(UNSAFE_PICKLE_ENV, "0") != "1":
                raise RuntimeError(_advisory(context))
            state.seek(0)
            state = torch.load(state, weights_only=False)
        else:
            raise RuntimeError("Unsupported checkpoint format.")
        self.fp8_meta.update(state["extra_fp8_variables"])
        self.fp8_meta["recipe"] = state["recipe"]
        self.init_fp8_meta_tensors(state["recipe"])
        self.reset_fp8_meta_tensors({"scaling_fwd": [state["scale_fwd"], state["amax_history_fwd"]],
                                     "scaling_bwd": [state["scale_bwd"], state["amax_history_bwd"]]})

    # the forward's FP8 bookkeeping (prepare_forward / init_fp8_metadata)
    def init_fp8_metadata(self) -> None:
        meta = self.fp8_meta
        self.fp8 = STATE.enabled
        meta["fp8_checkpoint"] = self.fp8
        if not self.fp8:
            self.fp8_initialized = False
            return
        if self.fp8_initialized and STATE.recipe == meta.get("recipe"):
            return
        meta["recipe"] = STATE.recipe
        meta["num_gemms"] = self.num_gemms
        meta["fp8_max_fwd"], meta["fp8_max_bwd"] = (FP8_MAX[f] for f in _formats(STATE.recipe))
        self.init_fp8_meta_tensors(STATE.recipe)
        self.fp8_initialized = True

    def prepare_forward(self) -> None:
        if STATE.recompute:  # the recompute of a checkpointed forward: the forward's scales, no new amax
            return
        self.init_fp8_metadata()
        if self.fp8 and self.fp8_meta["recipe"].delayed():
            if self not in STATE.forwarded:
                STATE.forwarded.append(self)
            if STATE.checkpointing and torch.is_grad_enabled():
                self._stash.append(self.fp8_meta["scaling_fwd"].scale.clone())

    def _scale_for(self, t: torch.Tensor, key: str, slot: int) -> torch.Tensor:
        """The scale of slot `slot`'s quantizer for `t`: a delayed-scaling state's (its amax recorded), else t's own."""
        state, index = self.quantizers[key][slot]
        fmt = _formats(state.recipe)[0 if key == "scaling_fwd" else 1]
        if not isinstance(state, _DelayedState):
            return _current_scale(t, fmt, getattr(state.recipe, "margin", 0))
        if key == "scaling_fwd" and STATE.recompute and self._recompute_scale is not None:
            return self._recompute_scale[index]
        if not STATE.recompute:
            with torch.no_grad():
                state.amax_history[0, index] = torch.maximum(state.amax_history[0, index], t.detach().abs().max().float())
        return state.scale[index]

    _bwd_update_slot: int | None = 0
    """The backward slot after whose cast the module's backward is done (its bwd scales update); None: the module says."""

    def _quantize(self, t: torch.Tensor, key: str, slot: int) -> torch.Tensor:
        fmt = _formats(self.quantizers[key][slot][0].recipe)[0 if key == "scaling_fwd" else 1]
        out = _cast(t, self._scale_for(t, key, slot), fmt)
        if key == "scaling_bwd" and slot == self._bwd_update_slot:
            self._update_scales("scaling_bwd")  # reduce_and_update_fp8_tensors(forward=False) after this module's backward
        return out

    def _update_scales(self, key: str) -> None:
        """DelayedScaling's update: amax from the history (max or most_recent), scale = fp8_max / amax / 2^margin,
        then the history rolls (its newest row zeroed for the next step)."""
        state = self.fp8_meta.get(key)
        if not isinstance(state, _DelayedState):
            return
        recipe = self.fp8_meta["recipe"]
        fmt = _formats(recipe)[0 if key == "scaling_fwd" else 1]
        with torch.no_grad():
            h = state.amax_history
            amax = h[0] if recipe.amax_compute_algo == "most_recent" else h.max(dim=0).values
            new = FP8_MAX[fmt] / amax / 2**recipe.margin
            state.scale.copy_(torch.where((amax > 0) & torch.isfinite(new), new, state.scale))
            state.amax_history.copy_(torch.roll(h, -1, 0))
            state.amax_history[0].zero_()

    _recompute_scale = None


def _advisory(context: str) -> str:
    return (f"{EXTRA_STATE_REFUSAL} for {context}. Delayed-scaling FP8 metadata can be stored as a Python pickle, and loading "
            f"it can execute arbitrary code. Only enable unsafe loading if this checkpoint is from a trusted source. To load it "
            f"anyway, set {UNSAFE_PICKLE_ENV}=1.")


def _should_load_extra_state_pickle(data: bytes, context: str) -> bool:
    """module/_extra_state.py: ignore an empty or global-free payload; refuse delayed-scaling state without the opt-in."""
    if not data:
        return False
    strings, has_global = set(), False
    for opcode, arg, _ in pickletools.genops(data):
        if isinstance(arg, str):
            strings.add(arg)
        has_global = has_global or opcode.name in ("GLOBAL", "STACK_GLOBAL")
    if not has_global and not (strings & DELAYED_STATE_KEYS):
        return False
    if os.environ.get(UNSAFE_PICKLE_ENV, "0") == "1":
        return True
    raise RuntimeError(_advisory(context))


class Float8Tensor(torch.Tensor):
    """A weight stored in float8 (`_data`) with its inverse scale (`_scale_inv`); its dtype is the high-precision
    one it stands for. Compute dequantizes it; `quantize_` writes new values; FSDP2 all-gathers `_data` (1 byte)."""

    @staticmethod
    def __new__(cls, data, scale_inv, dtype, requires_grad=False):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=dtype, device=data.device, requires_grad=requires_grad)

    def __init__(self, data, scale_inv, dtype, requires_grad=False):
        self._data, self._scale_inv = data, scale_inv

    def __repr__(self):
        return f"Float8Tensor(shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def quantize(cls, t: torch.Tensor, dtype=None) -> "Float8Tensor":
        scale = _current_scale(t, "E4M3")
        data = (t.detach().float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        return cls(data, (1.0 / scale).reshape(1), dtype or t.dtype)

    def dequantize(self, *, dtype=None) -> torch.Tensor:
        return (self._data.float() * self._scale_inv).to(dtype or self.dtype)

    def quantize_(self, src: torch.Tensor) -> "Float8Tensor":
        new = Float8Tensor.quantize(src.detach().to(self.dtype))
        self._data.copy_(new._data)
        self._scale_inv.copy_(new._scale_inv)
        return self

    def __tensor_flatten__(self):
        return ["_data", "_scale_inv"], self.dtype

    @staticmethod
    def __tensor_unflatten__(inner, dtype, outer_size, outer_stride):
        return Float8Tensor(inner["_data"], inner["_scale_inv"], dtype)

    def fsdp_pre_all_gather(self, mesh, orig_size, contiguous_orig_stride, module, mp_policy):
        return (self._data.view(torch.uint8),), (self._scale_inv, self.dtype)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        (data,) = all_gather_outputs
        scale_inv, _ = metadata
        if out is not None:
            out._data = data.view(torch.float8_e4m3fn)
            return
        return Float8Tensor(data.view(torch.float8_e4m3fn), scale_inv, param_dtype), all_gather_outputs

    @classmethod
    def __torch_dispatch__(cls, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        self = args[0]
        if func in (aten.detach.default, aten.alias.default):
            return Float8Tensor(func(self._data), self._scale_inv, self.dtype)
        if func in (aten.view.default, aten._unsafe_view.default, aten.slice.Tensor, aten.as_strided.default,
                    aten.narrow.default, aten.select.int):
            return Float8Tensor(func(self._data, *args[1:], **kwargs), self._scale_inv, self.dtype)
        if func in (aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default):
            return [Float8Tensor(d, self._scale_inv, self.dtype) for d in func(self._data, *args[1:], **kwargs)]
        if func in (aten.new_zeros.default, aten.new_empty.default, aten.empty_like.default, aten.zeros_like.default):
            shape = args[1] if func in (aten.new_zeros.default, aten.new_empty.default) else self.shape
            return Float8Tensor(torch.zeros(shape, dtype=torch.float8_e4m3fn, device=self.device), self._scale_inv.clone(), self.dtype)
        if func is aten.clone.default:
            return Float8Tensor(self._data.clone(), self._scale_inv.clone(), self.dtype)
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            if isinstance(src, Float8Tensor):
                dst._data.copy_(src._data)
                dst._scale_inv.copy_(src._scale_inv)
            else:
                dst.quantize_(src)
            return dst
        if func is aten._to_copy.default and kwargs.get("dtype", self.dtype) == self.dtype:
            device = kwargs.get("device", self.device)
            return Float8Tensor(self._data.to(device), self._scale_inv.to(device), self.dtype)
        if func._schema.is_mutable:
            raise NotImplementedError(f"Float8Tensor stand-in: in-place {func} (TE's QuantizedTensor handles copy_ only)")
        plain = tree_map(lambda a: a.dequantize() if isinstance(a, Float8Tensor) else a, (args, kwargs))
        return func(*plain[0], **plain[1])


class _Dequantize(torch.autograd.Function):
    """The weight the GEMM reads; the gradient goes to the FP8 parameter in its high-precision dtype."""

    @staticmethod
    def forward(ctx, w):
        return w.dequantize()

    @staticmethod
    def backward(ctx, grad):
        return grad


def _weight(w: torch.Tensor) -> torch.Tensor:
    return _Dequantize.apply(w) if isinstance(w, Float8Tensor) else w


class Linear(TEModule):
    def __init__(self, in_features, out_features, **kw):
        super().__init__()
        _check("Linear", {"in_features": in_features, "out_features": out_features, **kw})
        self.in_features, self.out_features = in_features, out_features
        dtype, device = kw.get("params_dtype") or torch.float32, kw.get("device")
        weight = torch.empty(out_features, in_features, dtype=dtype, device=device)
        kw.get("init_method", nn.init.xavier_uniform_)(weight)
        self.primary_weights_in_fp8 = STATE.with_fp8_parameters
        if self.primary_weights_in_fp8:
            hp = weight.detach().cpu().clone() if STATE.preserve_high_precision_init_val else None
            weight = nn.Parameter(Float8Tensor.quantize(weight), requires_grad=True)
            if hp is not None:
                weight._high_precision_init_val = hp
                weight.get_high_precision_init_val = lambda w=weight: getattr(w, "_high_precision_init_val", None)
                weight.clear_high_precision_init_val = lambda w=weight: w.__dict__.pop("_high_precision_init_val", None)
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if kw.get("bias", True) else None

    def forward(self, x, is_first_microbatch=None, fp8_output=False, fp8_grad=False):
        self.prepare_forward()
        w = _weight(self.weight)
        if not self.fp8:
            return F.linear(x, w, self.bias)
        self._recompute_scale = self._stash.pop(0) if STATE.recompute and self._stash else None
        x = _FakeQuant.apply(x, self._scale_for(x, "scaling_fwd", 0), _formats(self.fp8_meta["recipe"])[0])
        w = _FakeQuant.apply(w, self._scale_for(w, "scaling_fwd", 1), _formats(self.fp8_meta["recipe"])[0])
        out = F.linear(x, w, self.bias)
        return _GradQuant.apply(out, self, 0)


# DotProductAttention's FP8 tensors: quantizer slots (cpp_extensions/fused_attn.py META_*, csrc/common.h FP8FwdTensors /
# FP8BwdTensors): QKV = GEMM1_OUTPUT, O = GEMM2_INPUT, S = GEMM3_OUTPUT; dQKV = GRAD_OUTPUT1, dO = GRAD_INPUT2, dP = GRAD_INPUT3
META_QKV, META_O, META_S = 2, 3, 8
META_DQKV, META_DO, META_DP = 0, 3, 5

NO_BACKEND = ("No dot product attention backend is available for the provided inputs. Please run with NVTE_DEBUG=1 "
              "NVTE_DEBUG_LEVEL=2 to find out the reasons for disabling all backends.")
"""dot_product_attention.py, DotProductAttention.forward, when get_attention_backend disabled every backend."""


def _fused_fp8_supported(cc, cudnn, training: bool, d_qk: int, d_v: int, s_q: int, s_kv: int) -> bool:
    """nvte_get_fused_attn_backend's FP8 sub-backend (common/fused_attn/fused_attn.cpp) for what the stand-in runs:
    causal "bshd" attention, no bias, vanilla softmax; cuDNN 9.10.0 excluded for its known FP8 bugs."""
    if cc < (9, 0) or cudnn == (9, 10, 0):
        return False
    hopper, mult16 = cc < (10, 0), d_qk % 16 == 0 and d_v % 16 == 0
    return ((cudnn >= (9, 2, 1) and hopper and s_q % 128 == 0 and s_kv % 128 == 0 and d_qk == d_v == 128)
            or (cudnn >= (9, 7, 0) and mult16 and ((hopper and not training and d_qk <= 256 and d_v <= 256)
                                                  or (hopper and training and d_qk == d_v == 128)
                                                  or (not hopper and d_qk <= 128 and d_v <= 128)))
            or (cudnn >= (9, 21, 0) and not hopper and mult16 and d_qk <= 192 and d_v <= 128))


def _attention_backend(module, d_qk: int, d_v: int, s_q: int, s_kv: int) -> str:
    """get_attention_backend (attention/dot_product_attention/utils.py) on the GPU the stand-in is (STATE.capability,
    STATE.cudnn), flash-attn not installed (TE then drops FlashAttention; FP8 training turns it off anyway): the
    backend it selects, or TE's ValueError where it disables every one."""
    cc, cudnn, meta = STATE.capability, STATE.cudnn, module.fp8_meta
    fused, unfused = cc >= (8, 0), True
    fp8 = module.fp8 and meta["recipe"].fp8_dpa
    if fp8:  # Filter: Execution type
        recipe = (meta.get("local_recipes") or [meta["recipe"]])[0]
        unfused = os.environ.get("NVTE_UnfusedDPA_Emulate_FP8", "0") == "1"
        if recipe.float8_current_scaling() and (cc < (10, 0) or cudnn < (9, 14, 0)):
            fused = False
        if recipe.mxfp8() and (cc < (10, 0) or recipe.fp8_mha or cudnn < (9, 21, 0) or cudnn in ((9, 23, 0), (9, 23, 1))):
            fused = False
        if recipe.float8_block_scaling() or recipe.nvfp4() or cc == (12, 0):
            fused = False
        fused = fused and _fused_fp8_supported(cc, cudnn, module.training, d_qk, d_v, s_q, s_kv)  # Filter: cuDNN support
    if fused:
        return "FusedAttention"
    if unfused:
        return "UnfusedDotProductAttention"
    raise ValueError(NO_BACKEND)


class _BackwardDone(torch.autograd.Function):
    """Forward: identity; backward, after every cast of the module's backward: its backward scales update."""

    @staticmethod
    def forward(ctx, x, module):
        ctx.module = module
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.module._update_scales("scaling_bwd")
        return grad, None


class DotProductAttention(TEModule):
    num_gemms = 3
    _bwd_update_slot = None  # _BackwardDone

    def __init__(self, num_attention_heads, kv_channels, **kw):
        super().__init__()
        _check("DotProductAttention", {"num_attention_heads": num_attention_heads, "kv_channels": kv_channels, **kw})
        assert kw.get("qkv_format") == "bshd" and kw.get("attn_mask_type", "causal") == "causal", kw
        self.heads, self.kv_channels = num_attention_heads, kv_channels
        self.gqa = kw.get("num_gqa_groups") or num_attention_heads
        self.selected_backend = None
        """The backend the last forward ran (TE logs it: "Running with FusedAttention backend")."""

    def init_fp8_metadata(self) -> None:
        """DotProductAttention.init_fp8_metadata (NVTE_DPA_FP8_RECIPE unset): under Float8CurrentScaling with fp8_dpa the
        attention keeps the recipe for QKV, O, dO, dQKV and a DelayedScaling for S and dP (amax_history_len 1,
        "most_recent"), which becomes fp8_meta["recipe"]: local_recipes [CS, DS], 2 GEMMs' slots of current scaling and one
        GEMM's delayed-scaling state (3 forward, 2 backward slots) in fp8_meta["scaling_fwd"/"scaling_bwd"]."""
        meta = self.fp8_meta
        self.fp8 = STATE.enabled
        meta["fp8_checkpoint"] = self.fp8
        if not self.fp8:
            self.fp8_initialized = False
            return
        recipe = recipes = dpa = STATE.recipe
        if recipe.float8_current_scaling() and (recipe.fp8_dpa or recipe.fp8_mha):
            dpa = DelayedScaling(fp8_format=recipe.fp8_format, amax_history_len=1, amax_compute_algo="most_recent",
                                 fp8_dpa=recipe.fp8_dpa, fp8_mha=recipe.fp8_mha, reduce_amax=True)
            recipes = [recipe, dpa]
        meta["global_recipe"] = recipe
        meta["local_recipes"] = recipes if isinstance(recipes, list) else [recipes]
        if self.fp8_initialized and dpa == meta.get("recipe"):
            return
        meta["recipe"], meta["num_gemms"] = dpa, self.num_gemms
        meta["fp8_max_fwd"], meta["fp8_max_bwd"] = (FP8_MAX[f] for f in _formats(dpa))
        self.init_fp8_meta_tensors(recipes)
        self.fp8_initialized = True

    def set_meta_tensor(self, fwd: bool, recipe) -> None:
        """DotProductAttention.set_meta_tensor: a recipe or [CS, DS]; num_gemms [2, 1] for the pair, [3] for one recipe;
        the last recipe's state is fp8_meta's, the quantizers are every state's slots in order."""
        recipes = recipe if isinstance(recipe, list) else [recipe]
        key = "scaling_fwd" if fwd else "scaling_bwd"
        if self.fp8_meta_tensors_initialized:
            state = self.fp8_meta[key]
            if recipes[-1].delayed() and isinstance(state, _DelayedState):
                _adjust_amax_history_length(state, recipes[-1].amax_history_len)
                return
            if not recipes[-1].delayed() and isinstance(state, _StatelessState):
                return
        gemms = [2, 1] if len(recipes) == 2 else [3]
        per_gemm = 3 if fwd else 2
        states = [_DelayedState(r, g * per_gemm) if r.delayed() else _StatelessState(r) for r, g in zip(recipes, gemms)]
        self.fp8_meta[key] = states[-1 if len(recipes) == 2 else 0]
        self.quantizers[key] = [(st, i) for st, g in zip(states, gemms) for i in range(g * per_gemm)]

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None, **kw):
        q, k, v = query_layer, key_layer, value_layer
        assert q.shape[2] == self.heads and k.shape[2] == self.gqa and q.shape[3] == self.kv_channels, (q.shape, k.shape)
        self.prepare_forward()
        self.selected_backend = _attention_backend(self, q.shape[3], v.shape[3], q.shape[1], k.shape[1])
        if self.fp8 and self.fp8_meta["recipe"].fp8_dpa:
            return self._fp8_attention(q, k, v)
        b, s = q.shape[:2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        rep = self.heads // self.gqa
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)

    def _fp8_attention(self, q, k, v):
        """FusedAttention's FP8 tensors: Q, K, V cast together (one QKV scale), S and dO (and under DelayedScaling O and
        dQKV) in FP8, dP in FP8 (utils.py get_fused_attn_spec, combine_and_quantize)."""
        self._recompute_scale = self._stash.pop(0) if STATE.recompute and self._stash else None
        delayed = self.fp8_meta["local_recipes"][0].delayed()
        fmt = _formats(self.fp8_meta["recipe"])[0]
        b, s = q.shape[:2]
        shapes, sizes = [t.shape for t in (q, k, v)], [t.numel() for t in (q, k, v)]
        qkv = _BackwardDone.apply(torch.cat([t.reshape(-1) for t in (q, k, v)]), self)
        if delayed:
            qkv = _GradQuant.apply(qkv, self, META_DQKV)
        qkv = _FakeQuant.apply(qkv, self._scale_for(qkv, "scaling_fwd", META_QKV), fmt)
        q, k, v = (t.view(shape).transpose(1, 2) for t, shape in zip(qkv.split(sizes), shapes))
        rep = self.heads // self.gqa
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])
        future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1).to(q.dtype)
        probs = _GradQuant.apply(probs, self, META_DP)
        probs = _FakeQuant.apply(probs, self._scale_for(probs, "scaling_fwd", META_S), fmt)
        out = (probs @ v).transpose(1, 2).reshape(b, s, -1)
        if delayed:
            out = _FakeQuant.apply(out, self._scale_for(out, "scaling_fwd", META_O), fmt)
        return _GradQuant.apply(out, self, META_DO)


class _Norm(nn.Module):
    name = ""

    def __init__(self, normalized_shape, eps=1e-5, **kw):
        super().__init__()
        _check(self.name, {"normalized_shape": normalized_shape, "eps": eps, **kw})
        self.eps, self.zero_centered = eps, kw.get("zero_centered_gamma", False)
        self.weight = nn.Parameter(torch.full((normalized_shape,), 7.0, dtype=kw.get("params_dtype") or torch.float32,
                                              device=kw.get("device")))


class LayerNorm(_Norm):
    name = "LayerNorm"

    def __init__(self, normalized_shape, **kw):
        super().__init__(normalized_shape, **kw)
        self.bias = nn.Parameter(torch.full((normalized_shape,), 7.0))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight.to(x.dtype), self.bias.to(x.dtype), self.eps)


class RMSNorm(_Norm):
    name = "RMSNorm"

    def forward(self, x):
        w = self.weight + 1 if self.zero_centered else self.weight
        return F.rms_norm(x.float(), self.weight.shape, eps=self.eps).type_as(x) * w


# --- te.distributed.checkpoint -----------------------------------------------------------------------------------

def _checkpoint(function, *args, **kwargs):
    """distributed.py checkpoint: TE's keywords popped, the rest to `function`; the recompute runs with the forward's
    scales and records no amax."""
    use_reentrant = kwargs.pop("use_reentrant", True)
    for name in TE_CALL_ARGS["checkpoint"] - {"use_reentrant", "context_fn", "determinism_check", "debug"}:
        kwargs.pop(name, None)
    recipe, enabled = STATE.recipe, STATE.enabled

    @contextlib.contextmanager
    def forward_ctx():
        saved, STATE.checkpointing = STATE.checkpointing, True
        try:
            yield
        finally:
            STATE.checkpointing = saved

    @contextlib.contextmanager
    def recompute_ctx():
        saved = (STATE.recompute, STATE.enabled, STATE.recipe)
        STATE.recompute, STATE.enabled, STATE.recipe = True, enabled, recipe
        try:
            yield
        finally:
            STATE.recompute, STATE.enabled, STATE.recipe = saved

    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=use_reentrant,
                                             context_fn=lambda: (forward_ctx(), recompute_ctx()), **kwargs)


checkpoint = torch._disable_dynamo(_checkpoint)  # as TE's: @torch._disable_dynamo


# --- optimizers.FusedAdam ------------------------------------------------------------------------------------------

class FusedAdam(torch.optim.Optimizer):
    """Adam / AdamW; with master_weights every parameter gets an fp32 master copy when its state is made
    (initialize_state: empty_like + the parameter's value, as TE's _initialize_state); an FP8 or bf16/fp16 parameter
    steps its copy and is written (re-quantized) from it, a plain fp32 parameter steps itself (TE's p_f32_model)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, **kw):
        _check("FusedAdam", kw, TE_OPTIMIZER_ARGS)
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        self.adam_w_mode = kw.get("adam_w_mode", True)
        self.master_weights = kw.get("master_weights", False)
        if self.master_weights and kw.get("master_weight_dtype", torch.float32) not in (torch.float32, torch.float16):
            raise RuntimeError("FusedAdam only supports fp32/fp16 master weights.")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "bias_correction": kw.get("bias_correction", True)})

    @staticmethod
    def _local(p):
        from torch.distributed.tensor import DTensor

        return p._local_tensor if isinstance(p, DTensor) else p

    def _wrap(self, p, t):
        from torch.distributed.tensor import DTensor

        if isinstance(p, DTensor):
            return DTensor.from_local(t, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(), run_check=False)
        return t

    def initialize_state(self, param, store_param_remainders):
        local = self._local(param)
        hp = local.dequantize(dtype=torch.float32) if isinstance(local, Float8Tensor) else local.detach().float()
        state = self.state[param]
        state["step"] = torch.zeros(())
        state["exp_avg"] = self._wrap(param, torch.zeros_like(hp))
        state["exp_avg_sq"] = self._wrap(param, torch.zeros_like(hp))
        if self.master_weights:
            state["master_param"] = self._wrap(param, hp.clone())

    def set_scaled_state(self, param, state_name, unscaled_state):
        assert unscaled_state.dtype == torch.float32
        state = self.state[param]
        if state_name not in state:
            self.initialize_state(param, False)
        self._local(state[state_name]).copy_(unscaled_state)

    def get_unscaled_state(self, param, state_name):
        return self.state[param][state_name]

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                local = self._local(p)
                if isinstance(local, Float8Tensor) and not self.master_weights:
                    raise RuntimeError("FusedAdam without master_weights does not support Float8Tensor parameters. "
                                       "Use master_weights=True.")
                state = self.state[p]
                if not state:
                    self.initialize_state(p, False)
                state["step"] += 1
                t = int(state["step"])
                g = self._local(p.grad).float()
                m, v = self._local(state["exp_avg"]), self._local(state["exp_avg_sq"])
                # TE's lists: an FP8 parameter and a bf16/fp16 one step the master copy (p_main_of_*), a plain fp32 parameter
                # steps itself (p_f32_model) and its master copy, if it has one, is never read or written
                stepped = isinstance(local, Float8Tensor) or (self.master_weights and local.dtype != torch.float32)
                w = self._local(state["master_param"]) if stepped else local.data
                if group["weight_decay"]:
                    if self.adam_w_mode:
                        w.mul_(1 - group["lr"] * group["weight_decay"])
                    else:
                        g = g.add(w, alpha=group["weight_decay"])
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                c1, c2 = (1 - b1**t, 1 - b2**t) if group["bias_correction"] else (1.0, 1.0)
                w.addcdiv_(m / c1, (v / c2).sqrt().add_(group["eps"]), value=-group["lr"])
                if isinstance(local, Float8Tensor):
                    local.quantize_(w)
                elif stepped:
                    local.copy_(w.to(local.dtype))


def fake_te(capability: tuple[int, int] = (9, 0), cudnn: tuple[int, int, int] = (9, 21, 0)):
    """(transformer_engine.pytorch, transformer_engine.common.recipe, log) look-alikes on a GPU of `capability` (an H100
    unless told) with `cudnn`; `log` records what was built and the autocast / quantized_model_init contexts entered (the
    recipe objects)."""
    global STATE
    STATE = _GlobalState(capability=capability, cudnn=cudnn)
    log = types.SimpleNamespace(built=[], quantized_init=[], autocast=[], in_quantized_init=False, in_autocast=None)

    def record(cls):
        class Recorded(cls):
            def __init__(self, *args, **kw):
                super().__init__(*args, **kw)
                log.built.append((cls.__name__, {**dict(zip(("in_features", "out_features"), args)), **kw}))
                if cls is Linear:
                    self.fp8_weight = STATE.with_fp8_parameters

        Recorded.__name__ = Recorded.__qualname__ = cls.__name__
        return Recorded

    @contextlib.contextmanager
    def logged_quantized_model_init(enabled=True, recipe=None, preserve_high_precision_init_val=False):
        log.quantized_init.append(recipe)
        log.in_quantized_init = True
        with quantized_model_init(enabled, recipe, preserve_high_precision_init_val):
            yield
        log.in_quantized_init = False

    @contextlib.contextmanager
    def logged_autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None, _graph=False):
        log.autocast.append(recipe)
        saved, log.in_autocast = log.in_autocast, recipe
        with autocast(enabled, calibrating, recipe, amax_reduction_group, _graph):
            yield
        log.in_autocast = saved

    te = types.SimpleNamespace(
        Linear=record(Linear), LayerNorm=record(LayerNorm), RMSNorm=record(RMSNorm), DotProductAttention=record(DotProductAttention),
        autocast=logged_autocast, quantized_model_init=logged_quantized_model_init,
        distributed=types.SimpleNamespace(checkpoint=checkpoint), checkpoint=checkpoint,
        optimizers=types.SimpleNamespace(FusedAdam=FusedAdam), Float8Tensor=Float8Tensor)
    te_recipe = types.SimpleNamespace(Format=Format, **RECIPES)
    return te, te_recipe, log


# --- the stand-in is held to TE's contract ------------------------------------------------------------------------

def test_the_stand_in_refuses_keywords_te_2_20_does_not_take():
    te, te_recipe, _ = fake_te()
    with pytest.raises(TypeError, match="fp8_dpa_x"):
        te_recipe.DelayedScaling(fp8_dpa_x=True)
    with pytest.raises(TypeError, match="device"):
        te.DotProductAttention(8, 64, device="cpu")  # TE's DotProductAttention takes no device
    with pytest.raises(TypeError, match="fp8_recipe"):
        with te.autocast(enabled=True, fp8_recipe=te_recipe.DelayedScaling()):
            pass
    with pytest.raises(TypeError, match="master_weight"):
        te.optimizers.FusedAdam([nn.Parameter(torch.zeros(2))], master_weight=True)


def test_float8_weights_dequantize_to_their_fp8_values_and_requantize_in_place():
    w = torch.randn(32, 16)
    q = Float8Tensor.quantize(w)
    assert q._data.dtype is torch.float8_e4m3fn and q.dtype is torch.float32
    torch.testing.assert_close(q.dequantize(), w, rtol=0.07, atol=1e-3)
    assert not torch.equal(q.dequantize(), w)  # rounded to FP8
    q.quantize_(w * 2)
    torch.testing.assert_close(q.dequantize(), w * 2, rtol=0.07, atol=2e-3)
    assert math.isclose(float(q._scale_inv), float(w.abs().max() * 2 / 448), rel_tol=1e-5)


@pytest.mark.parametrize("recipe", ["delayed", "current", "mxfp8", "nvfp4"])
def test_the_stand_ins_attention_backend_selection_agrees_with_plannings(recipe):
    """Two transcriptions of TE's selection (get_attention_backend + fused_attn.cpp): the stand-in's, per filter as TE
    runs them, and launcher/planning/rules/te_attention.py's, per refusal; over GPUs and head dims they must agree."""
    from launcher.planning.rules.te_attention import refusal

    classes = {"delayed": DelayedScaling, "current": Float8CurrentScaling, "mxfp8": MXFP8BlockScaling, "nvfp4": NVFP4BlockScaling}
    fake_te()
    r = classes[recipe](fp8_dpa=True)
    dpa = DelayedScaling(fp8_dpa=True, amax_history_len=1) if recipe == "current" else r
    module = types.SimpleNamespace(fp8=True, training=True, fp8_meta={"recipe": dpa, "local_recipes": [r, dpa] if dpa is not r else [r]})
    for cap in [(8, 9), (9, 0), (10, 0), (10, 3), (12, 0)]:
        STATE.capability = cap
        for head_dim in (16, 24, 32, 64, 96, 128, 160, 192, 256):
            try:
                backend = _attention_backend(module, head_dim, head_dim, 128, 128)
            except ValueError as e:
                assert str(e) == NO_BACKEND
                backend = None
            assert (backend is None) == bool(refusal(cap, recipe, head_dim)), (cap, recipe, head_dim, backend)
