"""`fp8launch export --quant`: which Linear layers are written in FP8, and why each other one stays in high precision.

The layers quantized are the layers the run trained in FP8: the run's own filter (launcher/train/precision/select.py,
`choices`: [[precision.rules]], precision.keep, keep_first_last, the kept blocks, dims, skip_small, MoE routers) on the
model the plan builds, with the precision in force at the checkpoint's step ([[precision.schedule]]). On top of it:

- the output layer (lm_head) stays: vLLM's ParallelLMHead takes no FP8 weight, and serving stacks keep it;
- a layer whose shape the format cannot hold (fp8-block: 128 x 128 blocks, mxfp8: 32 inputs) stays;
- a layer vLLM fuses with its siblings into one weight (q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj,
  `packed_modules_mapping` of its Llama, Qwen2, Mistral ... models) stays when a sibling stays: vLLM's
  `is_layer_skipped` refuses fused shards of different precisions ("Detected some but not all shards of ... are
  quantized", vllm 0.32.0 model_executor/layers/quantization/utils/quant_utils.py).

Non-Linear weights (embeddings, norms, biases) are never quantized: no FP8 loader converts them.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

import torch
from torch import nn

from launcher.errors import InputError

from .quant import Format

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

    from .hf import Target

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""vLLM's fused weights of a decoder block and the checkpoint layers each is loaded from."""
ROW_PARALLEL = ("o_proj", "down_proj")
"""Layers vLLM splits along their inputs under tensor parallel (RowParallelLinear); the others along their outputs."""
OUTPUT = "the output layer (vLLM's ParallelLMHead takes no FP8 weight; serving stacks keep lm_head in high precision)"


@dataclass(frozen=True)
class Layer:
    name: str
    """The Hugging Face module name (model.layers.0.self_attn.q_proj)."""
    ours: str
    """The checkpoint's name of its weight."""
    out_features: int
    in_features: int
    recipe: str | None
    """The recipe the run trained it with; None where the run kept it in high precision."""
    kept: str | None
    """Why it stays in high precision in the export; None where it is quantized."""


def trained_precision(plan: Plan, step: int, spec_dir: str) -> tuple[Plan, dict[str, tuple[str | None, str | None]]]:
    """(the plan in force at `step`, {our Linear name: (recipe, None) or (None, why it trained in high precision)}),
    as the run's own filter decided them on the model the plan builds."""
    from launcher.planning.schedule import plan_at
    from launcher.train.models import build_model
    from launcher.train.precision import select

    phase = plan_at(plan, step).plan
    spec = plan.train.model
    if spec.startswith("hf:"):
        from launcher.train.models.hf import build_hf

        model = build_hf(spec[3:], spec_dir, meta=True)
    else:
        with torch.device("meta"):
            model = build_model(spec, spec_dir)
    if not phase.precision.fp8:
        return phase, {name: (None, f"the run trained in {phase.precision.mode}") for name, _ in select.linears(model)}
    return phase, select.choices(model, phase)


def export_layers(plan: Plan, step: int, spec_dir: str, target: Target, fmt: Format) -> list[Layer]:
    """Every Linear of the Hugging Face model `target` builds, in its order: quantized in `fmt` or kept, with why."""
    from .hf import _meta_model

    phase, trained = trained_precision(plan, step, spec_dir)
    ours_of = {h: o for o, h in target.names.items()}
    model = _meta_model(target.config)
    head = model.get_output_embeddings()
    layers: dict[str, Layer] = {}
    for name, m in model.named_modules():
        if not isinstance(m, nn.Linear) or f"{name}.weight" not in ours_of:
            continue
        ours = ours_of[f"{name}.weight"]
        recipe, why = trained.get(ours.removesuffix(".weight"), (None, "not a Linear of the model the run trained"))
        if why is None and m is head:
            why = OUTPUT
        if why is None:
            why = fmt.unfit(m.out_features, m.in_features)
        layers[name] = Layer(name=name, ours=ours, out_features=m.out_features, in_features=m.in_features, recipe=recipe, kept=why)
    _keep_fused_together(layers)
    if not any(layer.kept is None for layer in layers.values()):
        trained_fp8 = [layer for layer in layers.values() if layer.recipe is not None]
        if not trained_fp8:
            first = next(iter(layers.values()), None)
            detail = (f"precision.mode = {phase.precision.mode} at step {step}" if not phase.precision.fp8 or first is None else
                      f"each Linear stayed in high precision: {first.name}: {first.kept}")
            raise InputError("--quant", f"the run trained no layer in FP8 ({detail})",
                             "export without --quant; to serve in FP8 anyway, let vLLM quantize the bf16 export as it loads "
                             "(vllm serve DIR --quantization fp8)")
        first = trained_fp8[0]
        raise InputError("--quant", f"none of the {len(trained_fp8)} layers the run trained in FP8 can be written as {fmt.name}: "
                         f"{first.name}: {first.kept}",
                         "use --quant fp8-channel (one scale per output row: any shape)" if fmt.name != "fp8-channel"
                         else "export without --quant")
    return list(layers.values())


def _keep_fused_together(layers: dict[str, Layer]) -> None:
    for fused, parts in FUSED.items():
        for name, layer in list(layers.items()):
            prefix, _, last = name.rpartition(".")
            if last != parts[0]:
                continue
            group = [layers[f"{prefix}.{p}"] for p in parts if f"{prefix}.{p}" in layers]
            kept = [g for g in group if g.kept is not None]
            if not kept or len(kept) == len(group):
                continue
            why = (f"fused with {kept[0].name.rpartition('.')[2]} into vLLM's {fused}, which loads one precision "
                   f"({kept[0].name.rpartition('.')[2]}: {kept[0].kept})")
            for g in group:
                if g.kept is None:
                    layers[g.name] = Layer(**{**g.__dict__, "kept": why})


def tp_problem(layers: list[Layer], fmt: Format, tp: int, config) -> str | None:
    """Why vLLM cannot load the export at tensor parallel `tp` (a quantized layer's shard is not a whole number of the
    format's blocks: "is not divisible by weight quantization block_n / block_k", vllm 0.32.0
    model_executor/layers/quantization/utils/fp8_utils.py `validate_fp8_block_shape`, which fp8.py's and the
    compressed-tensors block scheme's `create_weights` call), or None. Stricter than vLLM in one place: vLLM lets the last
    part of a fused weight at tensor parallel 1 end in a partial block, which transformers' and compressed-tensors'
    dequantizers refuse (Format.unfit keeps such layers)."""
    rows, cols = fmt.block
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    for layer in layers:
        if layer.kept is not None:
            continue
        last = layer.name.rpartition(".")[2]
        if last in ROW_PARALLEL:
            if layer.in_features % tp or (layer.in_features // tp) % cols:
                return (f"{layer.name} ({layer.out_features} x {layer.in_features}) split over {tp} ranks by its inputs leaves "
                        f"{layer.in_features / tp:g} columns a rank, not a multiple of the {cols}-column block")
            continue
        shard = layer.out_features / tp
        if last in ("k_proj", "v_proj") and head_dim:  # vLLM's QKVParallelLinear replicates key/value heads over extra ranks
            shard = max(1, (layer.out_features // head_dim) // tp) * head_dim
        if shard != int(shard) or int(shard) % rows:
            return (f"{layer.name} ({layer.out_features} x {layer.in_features}) split over {tp} ranks by its outputs leaves "
                    f"{shard:g} rows a rank, not a multiple of the {rows}-row block")
    return None


def serving_tps(layers: list[Layer], fmt: Format, config, sizes: tuple[int, ...] = (1, 2, 4, 8)) -> list[int]:
    """The tensor-parallel sizes among `sizes` whose shards hold whole blocks."""
    return [tp for tp in sizes if tp_problem(layers, fmt, tp, config) is None]
