"""torchao's MoE training for the grouped experts (GroupedExperts of launcher/train/models/moe.py, or
any module holding 3D w1/w2/w3 expert weights).

torchao 0.18 (torchao/prototype/moe_training) converts a module by wrapping its parameters: `quantize_`
with `MXFP8TrainingOpConfig` (MXFP8TrainingWeightWrapperTensor) or `Float8TrainingOpConfig`
(Float8TrainingWeightWrapperTensor). The wrapper intercepts `torch._grouped_mm(A, W.transpose(-2, -1),
offs=...)` and runs a dynamically quantised grouped GEMM: MXFP8 (e4m3, one power-of-two scale per 32
values; torchao's emulated kernels off CUDA, its SM100 kernels on compute capability >= 10.0) or FP8
rowwise (torch._scaled_grouped_mm, CUDA sm90+). Every token group then needs a row count that is a
multiple of 32 (MXFP8) or 16 (rowwise): GroupedExperts.align, set here, pads them.

The filter selects only the expert modules the plan puts in FP8 (launcher/planning/selection.py
`choose_experts`); the router gate is a Linear that `choose` always keeps. tensorwise /
rowwise_with_gw_hp / nvfp4 experts stay in high precision with the reason in the report (torchao has
no grouped GEMM for them); rule MOE-EXPERTS-HP says so at plan time.
"""

from __future__ import annotations

import typing

import torch
from torch import nn

from launcher.planning.selection import GROUPED_ALIGN, choose_experts
from launcher.train.fqn import clean_fqn

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

WRAPPERS = {"MXFP8TrainingWeightWrapperTensor": "mxfp8", "Float8TrainingWeightWrapperTensor": "rowwise"}
"""torchao's weight wrapper classes -> the grouped recipe they run."""


def is_grouped_wrapper(w: torch.Tensor) -> bool:
    """Whether `w` (or a DTensor's local tensor) is a torchao MoE-training weight wrapper, whose
    `torch._grouped_mm` runs as a dynamically quantised FP8/MXFP8 grouped GEMM."""
    w = getattr(w, "_local_tensor", w)
    return any(c.__name__ == "TrainingWeightWrapperBaseTensor" for c in type(w).__mro__)


def is_grouped_experts(module: nn.Module) -> bool:
    """A module holding 3D expert weights w1 (E, hidden, dim), w2 (E, dim, hidden), w3."""
    w1, w2 = module._parameters.get("w1"), module._parameters.get("w2")
    return w1 is not None and w2 is not None and w1.ndim == 3 and "w3" in module._parameters


def is_hf_experts(module: nn.Module) -> bool:
    """transformers 5.x's fused expert modules (Qwen3MoeExperts, MixtralExperts, ...): 3D gate_up_proj
    (E, 2 * moe_intermediate, hidden) and down_proj (E, hidden, moe_intermediate)."""
    w = module._parameters.get("gate_up_proj")
    return w is not None and w.ndim == 3 and "down_proj" in module._parameters


HF_EXPERTS = ("{cls} keeps its experts as fused 3D gate_up_proj {gate_up} and down_proj {down} and computes them with "
              "F.linear per expert (transformers' eager experts) or torch._grouped_mm without token groups padded to 16/32 "
              "(experts_implementation \"grouped_mm\"); fp8launch converts only GroupedExperts' 3D w1/w2/w3 (builtin MoE)")
"""Why a Hugging Face MoE's experts stay in high precision (the layers map says bf16, the start line's kept list this)."""


def hf_expert_reasons(model: nn.Module) -> dict[str, str]:
    return {fqn: HF_EXPERTS.format(cls=type(m).__name__, gate_up=tuple(m.gate_up_proj.shape), down=tuple(m.down_proj.shape))
            for fqn, m in model.named_modules() if is_hf_experts(m)}


def grouped_experts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(fqn, m) for fqn, m in model.named_modules() if is_grouped_experts(m)]


def grouped_recipe_of(module: nn.Module) -> str | None:
    """mxfp8 / rowwise when torchao's MoE training holds this expert module's weights (read from the
    weights as built, under FSDP2 too), else None."""
    if not is_grouped_experts(module):
        return None
    w = module.w1
    return WRAPPERS.get(type(getattr(w, "_local_tensor", w)).__name__)


def grouped_label(module: nn.Module) -> str | None:
    """"fp8 mxfp8 (grouped, 8 experts)" for a converted expert module, else None."""
    recipe = grouped_recipe_of(module)
    return f"fp8 {recipe} (grouped, {module.w1.shape[0]} experts)" if recipe else None


def _blocks(model: nn.Module, plan: Plan) -> tuple[dict[str, int], int]:
    p = plan.precision
    if not (p.keep_first_blocks or p.keep_last_blocks):
        return {}, 0
    from launcher.train.models import transformer_blocks

    blocks = transformer_blocks(model)
    index = {id(b): i for i, b in enumerate(blocks)}
    prefixes = {fqn + ".": index[id(m)] for fqn, m in model.named_modules() if id(m) in index}
    return {fqn: i for fqn, _ in grouped_experts(model) for prefix, i in prefixes.items() if fqn.startswith(prefix)}, len(blocks)


def expert_choices(model: nn.Module, plan: Plan) -> dict[str, tuple[str | None, str | None]]:
    """{fqn: (grouped recipe, None) or (None, why kept)} for every expert module."""
    of, n_blocks = _blocks(model, plan)
    return {
        fqn: choose_experts(clean_fqn(fqn), m.w1.shape[2], m.w1.shape[1], plan, of.get(fqn), n_blocks)
        for fqn, m in grouped_experts(model)
    }


def op_config(recipe: str, mxfp8_config):
    """torchao's MoE-training config for `recipe`: MXFP8 (`mxfp8_config()`, torchao_fp8's: emulated off
    CUDA, torchao's real kernels need SM100) or FP8 rowwise."""
    if recipe == "mxfp8":
        return mxfp8_config()
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig

    return Float8TrainingOpConfig()


def convert_experts(model: nn.Module, plan: Plan, mxfp8_config) -> dict[str, str | None]:
    """Wrap the chosen expert modules' weights for FP8/MXFP8 grouped GEMMs and set their token-group
    alignment; returns {fqn: None (converted) or the reason kept} for every expert module.
    `mxfp8_config()` gives the MXFP8TrainingOpConfig the dense layers use (passed in: torchao_fp8 imports this module)."""
    choices = expert_choices(model, plan)
    if not choices:
        return hf_expert_reasons(model)
    from torchao.quantization import quantize_

    for recipe in dict.fromkeys(r for r, _ in choices.values() if r is not None):
        chosen = {fqn for fqn, (r, _) in choices.items() if r == recipe}
        quantize_(model, op_config(recipe, mxfp8_config), filter_fn=lambda m, fqn, chosen=chosen: fqn in chosen)
        for fqn in chosen:
            model.get_submodule(fqn).align = GROUPED_ALIGN[recipe]
    return {fqn: why for fqn, (_, why) in choices.items()}
