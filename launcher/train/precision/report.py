"""What the precision backend really did to the model, counted on the converted model itself,
and the one start line that says so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from torch import nn

MAX_KEPT_IN_LINE = 8
"""The start line names at most this many kept layers; the report keeps them all."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionReport:
    backend: str
    """torchao | te | msamp | amp (fp32/bf16/fp16)"""
    recipe: str
    """e.g. tensorwise, delayed, O2; the dtype for amp"""
    fp8_layers: int
    """Linear layers running in FP8."""
    total_linear: int
    """Linear layers in the model."""
    fp8_flop_share: float
    """Share of Linear FLOPs (in_features * out_features per token) that run in FP8, 0..1."""
    kept: tuple[str, ...]
    """FQNs of Linears kept in high precision, each with its reason: "output (keep_first_last)"."""
    mode: str = "fp8"
    """precision.mode: fp32 | fp16 | bf16 | fp8"""
    high_precision: str = "bf16"
    """dtype of everything that is not an FP8 GEMM."""
    note: str = ""
    """Anything else the start line must say (e.g. who casts the model)."""
    expert_groups: int = 0
    """MoE expert modules (3D w1/w2/w3 run as grouped GEMMs); not among the Linear layers."""
    fp8_expert_groups: int = 0
    """Expert modules whose grouped GEMMs run in FP8."""
    experts: int = 0
    """Experts in all expert modules together."""
    head: str = ""
    """The FQN of the last Linear (the output layer of a decoder): the one layer the field's default keeps."""

    def line(self) -> str:
        """The one honest start line."""
        if self.mode != "fp8":
            how = f"{self.mode} ({self.note})" if self.note else self.mode
            return f"precision: {how}, no FP8: {self.total_linear} Linear layers in {self.mode}"
        recipe = f"{self.recipe} ({self.note})" if self.note else self.recipe
        groups = (f" and {self.fp8_expert_groups} of {self.expert_groups} expert groups ({self.experts} experts, grouped GEMMs)"
                  if self.expert_groups else "")
        text = (f"precision: fp8 {self.backend} {recipe}, {self.fp8_layers} of {self.total_linear} Linear layers{groups} "
                f"in FP8, {100 * self.fp8_flop_share:.1f}% of GEMM FLOPs")
        if self.kept:
            # every Linear but the output layer in FP8 is the field's default (torchtitan's filter_fqns, Megatron's TE
            # layers): say apart what this run keeps beyond it
            head = [k for k in self.kept if self.head and k.startswith(self.head + " (")]
            rest = [k for k in self.kept if k not in head]
            shown = ", ".join(rest[:MAX_KEPT_IN_LINE])
            more = len(rest) - MAX_KEPT_IN_LINE
            beyond = (f"{shown}" + (f" and {more} more" if more > 0 else "")) if rest else ""
            if head and beyond:
                text += (f"; kept in {self.high_precision}: {head[0]} and, beyond every Linear but the output layer "
                         f"(torchtitan's and Megatron's default), {beyond}")
            elif head:
                text += f"; kept in {self.high_precision}: {head[0]}"
            else:
                text += f"; kept in {self.high_precision}: {beyond}"
        return text


def linear_like(model: nn.Module, is_fp8: Callable[[nn.Module], bool]) -> list[tuple[str, nn.Module, bool]]:
    """(fqn, module, runs in FP8) for every nn.Linear and every backend FP8 linear module
    (some are not nn.Linear subclasses: te.Linear, MS-AMP's FP8Linear)."""
    from .torchao_moe import is_grouped_experts, is_hf_experts

    out = []
    for fqn, m in model.named_modules():
        fp8 = is_fp8(m)
        if fp8 or isinstance(m, nn.Linear) or is_grouped_experts(m) or is_hf_experts(m):
            out.append((fqn, m, fp8))
    return out


def _flops(m: nn.Module) -> int:
    """Multiply-adds per token: in * out for a Linear; 3 * dim * hidden * top_k for an expert module
    (the experts a token runs through)."""
    w1 = m._parameters.get("w1") if hasattr(m, "_parameters") else None
    if w1 is not None and w1.ndim == 3:
        return 3 * int(w1.shape[1]) * int(w1.shape[2]) * int(getattr(m, "top_k", 1))
    down = m._parameters.get("down_proj") if hasattr(m, "_parameters") else None
    if down is not None and down.ndim == 3:  # transformers' fused experts: the top_k is the model config's
        return 3 * int(down.shape[1]) * int(down.shape[2])
    return int(getattr(m, "in_features", 0)) * int(getattr(m, "out_features", 0))


def count(
    model: nn.Module,
    *,
    backend: str,
    recipe: str,
    mode: str,
    high_precision: str,
    is_fp8: Callable[[nn.Module], bool],
    reasons: Mapping[str, str | None],
    note: str = "",
) -> PrecisionReport:
    """Count the REAL FP8 modules of the converted `model`. `reasons` (from select.classify,
    computed before conversion) names why each kept layer was kept; a layer that was meant
    to be converted but is not says "not converted"."""
    from .torchao_moe import is_grouped_experts, is_hf_experts

    def grouped(m):
        return is_grouped_experts(m) or is_hf_experts(m)

    layers = linear_like(model, is_fp8)
    groups = [(m, fp8) for _, m, fp8 in layers if grouped(m)]
    total = sum(_flops(m) for _, m, _ in layers)
    fp8_flops = sum(_flops(m) for _, m, fp8 in layers if fp8)
    kept = () if mode != "fp8" else tuple(
        f"{fqn or '<root>'} ({reasons.get(fqn) or 'not converted'})" for fqn, _, fp8 in layers if not fp8)
    plain = [fqn for fqn, m, _ in layers if not grouped(m)]
    return PrecisionReport(
        backend=backend,
        recipe=recipe,
        expert_groups=len(groups),
        fp8_expert_groups=sum(1 for _, fp8 in groups if fp8),
        experts=sum(int(next(iter(m.parameters())).shape[0]) for m, _ in groups),
        fp8_layers=sum(1 for _, m, fp8 in layers if fp8 and not grouped(m)),
        total_linear=len(layers) - len(groups),
        fp8_flop_share=fp8_flops / total if total else 0.0,
        kept=kept,
        head=plain[-1] if plain else "",
        mode=mode,
        high_precision=high_precision,
        note=note,
    )
