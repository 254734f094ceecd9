"""Which torch modules become Transformer Engine modules, with which constructor arguments and
which weights to copy, and why the others stay. Pure: no TE import; te.py applies the plan.

Candidates, in module registration order:
- nn.Linear (precision.te.swap has "linear") -> te.Linear; kept by the same rules as every FP8
  backend (select.py: keep globs, keep_first_last, dims not multiples of 16);
- nn.LayerNorm ("layernorm") -> te.LayerNorm, when it has an affine weight and a bias
  (te.LayerNorm always has both) over one dimension;
- RMSNorm-like modules ("rmsnorm": class name contains "RMSNorm", a 1-D `weight` and `eps` or
  `variance_epsilon`: torch.nn.RMSNorm, Hugging Face *RMSNorm, the builtin Llama) -> te.RMSNorm.
  Gemma's RMSNorm computes x * (1 + weight): it maps to zero_centered_gamma=True.
- the builtin models' attention core (launcher/train/models/llama.py CoreAttention: causal, grouped-query,
  rotary embeddings applied before it, q/k/v as (batch, seq, heads, head_dim)) -> te.DotProductAttention
  with qkv_format "bshd", attn_mask_type "causal", num_gqa_groups = the KV heads, when precision.te.fp8_dpa
  is set (the recipe's fp8_dpa then runs its GEMMs in FP8). It has no weights to copy. Other models'
  attention is theirs: rule TE-FP8-ATTENTION-MODEL refuses fp8_dpa / fp8_mha for hf: and py: models.
"""

from __future__ import annotations

import fnmatch
import typing
from dataclasses import dataclass, field

import torch
from torch import nn

from launcher.planning.selection import keep_reason

from . import select

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan, TEConfig

ZERO_CENTERED_RMSNORM = ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm", "Gemma3nRMSNorm")
"""RMSNorm classes that scale by (1 + weight): TE's zero_centered_gamma computes the same."""


@dataclass(frozen=True, slots=True)
class Swap:
    fqn: str
    kind: str
    """linear | layernorm | rmsnorm | attention"""
    te_class: str
    """Linear | LayerNorm | RMSNorm | DotProductAttention: the attribute of transformer_engine.pytorch to build."""
    kwargs: dict = field(default_factory=dict)
    """Constructor arguments (te.py adds device and, for Linear, init_method)."""
    params: tuple[tuple[str, str], ...] = ()
    """(TE module parameter, source module parameter) pairs to copy."""
    reason: str | None = None
    """None: replaced; else why the torch module stays."""

    @property
    def swapped(self) -> bool:
        return self.reason is None


def rmsnorm_like(m: nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return "RMSNorm" in type(m).__name__ and (hasattr(m, "eps") or hasattr(m, "variance_epsilon")) and (
        w is None or isinstance(w, torch.Tensor))


def _kind(m: nn.Module) -> str | None:
    if isinstance(m, nn.Linear):
        return "linear"
    if isinstance(m, nn.LayerNorm):
        return "layernorm"
    if rmsnorm_like(m):
        return "rmsnorm"
    return None


def _keep_glob(fqn: str, plan: Plan) -> str | None:
    for pattern in plan.precision.keep:
        if fnmatch.fnmatchcase(fqn, pattern):
            return keep_reason(pattern)
    return None


def _linear(fqn: str, m: nn.Linear, reason: str | None) -> Swap:
    has_bias = m.bias is not None
    return Swap(
        fqn=fqn, kind="linear", te_class="Linear", reason=reason,
        kwargs={"in_features": m.in_features, "out_features": m.out_features, "bias": has_bias,
                "params_dtype": m.weight.dtype},
        params=(("weight", "weight"),) + ((("bias", "bias"),) if has_bias else ()),
    )


def _layernorm(fqn: str, m: nn.LayerNorm, reason: str | None) -> Swap:
    if reason is None:
        if m.weight is None:
            reason = "no affine weight (elementwise_affine=False)"
        elif m.bias is None:
            reason = "no bias (te.LayerNorm always has one)"
        elif len(m.normalized_shape) != 1:
            reason = f"normalized_shape {tuple(m.normalized_shape)} is not 1-D"
    if reason is not None:
        return Swap(fqn=fqn, kind="layernorm", te_class="LayerNorm", reason=reason)
    return Swap(
        fqn=fqn, kind="layernorm", te_class="LayerNorm",
        kwargs={"normalized_shape": m.normalized_shape[0], "eps": float(m.eps), "params_dtype": m.weight.dtype},
        params=(("weight", "weight"), ("bias", "bias")),
    )


def _rmsnorm(fqn: str, m: nn.Module, reason: str | None) -> Swap:
    w = getattr(m, "weight", None)
    if reason is None:
        if w is None:
            reason = "no weight (elementwise_affine=False)"
        elif w.dim() != 1:
            reason = f"weight shape {tuple(w.shape)} is not 1-D"
        elif getattr(m, "bias", None) is not None:
            reason = "has a bias (te.RMSNorm has none)"
    if reason is not None:
        return Swap(fqn=fqn, kind="rmsnorm", te_class="RMSNorm", reason=reason)
    eps = getattr(m, "eps", None)
    if eps is None:
        eps = getattr(m, "variance_epsilon", None)
    if eps is None:  # torch.nn.RMSNorm(eps=None) uses the machine epsilon of its input's dtype
        eps = torch.finfo(w.dtype).eps
    kwargs = {"normalized_shape": w.shape[0], "eps": float(eps), "params_dtype": w.dtype}
    if type(m).__name__ in ZERO_CENTERED_RMSNORM:
        kwargs["zero_centered_gamma"] = True
    return Swap(fqn=fqn, kind="rmsnorm", te_class="RMSNorm", kwargs=kwargs, params=(("weight", "weight"),))


def _core_attention(fqn: str, m: nn.Module, parent: nn.Module, te: TEConfig, plan: Plan) -> Swap:
    reason = None if te.fp8_dpa else "precision.te.fp8_dpa is false"
    reason = reason or _keep_glob(fqn, plan)
    heads, kv_heads, head_dim = (getattr(parent, a, None) for a in ("n_heads", "n_kv_heads", "head_dim"))
    if reason is None and None in (heads, kv_heads, head_dim):
        reason = "its attention module names no n_heads / n_kv_heads / head_dim"
    if reason is not None:
        return Swap(fqn=fqn, kind="attention", te_class="DotProductAttention", reason=reason)
    return Swap(fqn=fqn, kind="attention", te_class="DotProductAttention", kwargs={
        "num_attention_heads": heads, "kv_channels": head_dim, "num_gqa_groups": kv_heads, "attention_dropout": 0.0,
        "qkv_format": "bshd", "attn_mask_type": "causal"})


def swap_plan(model: nn.Module, te: TEConfig, plan: Plan) -> list[Swap]:
    """One Swap per candidate module (Linear, LayerNorm, RMSNorm-like, the builtin attention core), in
    registration order: replaced (reason None) or kept, with why."""
    from launcher.train.models.llama import CoreAttention

    fp8_reasons = select.classify(model, plan)
    out = []
    for fqn, m in model.named_modules():
        if isinstance(m, CoreAttention):
            parent = model.get_submodule(fqn.rpartition(".")[0]) if "." in fqn else model
            out.append(_core_attention(fqn, m, parent, te, plan))
            continue
        kind = _kind(m)
        if kind is None:
            continue
        reason = None if kind in te.swap else f"{kind!r} not in precision.te.swap"
        if fqn == "" and reason is None:
            reason = "the model itself (cannot be replaced in place)"
        if kind == "linear":
            out.append(_linear(fqn, m, reason or fp8_reasons[fqn]))
        elif kind == "layernorm":
            out.append(_layernorm(fqn, m, reason or _keep_glob(fqn, plan)))
        else:
            out.append(_rmsnorm(fqn, m, reason or _keep_glob(fqn, plan)))
    return out


def attention_swaps(swaps: list[Swap]) -> list[Swap]:
    """The attention cores replaced by te.DotProductAttention."""
    return [s for s in swaps if s.kind == "attention" and s.swapped]


def linear_reasons(swaps: list[Swap]) -> dict[str, str | None]:
    """{fqn: reason} for the Linear swaps, the shape report.count takes."""
    return {s.fqn: s.reason for s in swaps if s.kind == "linear"}
