"""`fp8launch export --quant`: the FP8 formats serving stacks load, as their loaders read them.

Each quantized Linear keeps its Hugging Face name; its `weight` becomes float8_e4m3fn ([out, in]) and a scale
tensor is written beside it. Scales come from the high-precision (master) weights the checkpoint holds: torchao's
Float8Linear keeps no weight scale between steps, and its MX training computes one in each forward.

    fp8-block    "fp8" (DeepSeek-V3 / Qwen-FP8 layout): `weight_scale_inv` fp32 [out/128, in/128], w ~ q * s with
                 s = max(block amax, 1e-12) / 448 (despite its name the multiplier). Read by vLLM's Fp8Config
                 (quantization/fp8.py: `ignored_layers`, else `modules_to_not_convert`), SGLang's fp8.py and
                 transformers' FineGrainedFP8Config (`modules_to_not_convert`; `ignored_layers` only in its place).
    fp8-channel  compressed-tensors "float-quantized", FP8_DYNAMIC: `weight_scale` fp32 [out, 1], s = row amax / 448;
                 activations quantized per token at run time. No block: any shape.
    mxfp8        compressed-tensors "mxfp8-quantized", MXFP8: `weight_scale` uint8 E8M0 [out, in/32], computed by
                 torchao's `to_mx` with the RCEIL rounding the run's MXFP8 training casts with.

The config dicts are compressed-tensors 0.20.1's `QuantizationConfig(...).model_dump(mode="json")` for the presets
(tests/test_export_quant.py holds them to it), written here so an export needs no compressed-tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
SCALE_FLOOR = 1e-12
"""The smallest amax a scale is computed from (vLLM's scaled_quantize clamps the same): an all-zero block gets a
tiny scale and zero codes, never a division by zero."""
BLOCK = 128
MX_BLOCK = 32


def _block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out, inn = w.shape
    blocks = w.reshape(out // BLOCK, BLOCK, inn // BLOCK, BLOCK)
    s = blocks.abs().amax(dim=(1, 3)).clamp(min=SCALE_FLOOR) / FP8_MAX
    q = (blocks / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).reshape(out, inn)
    return q, s


def _block_dequantize(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    out, inn = q.shape
    return (q.float().reshape(out // BLOCK, BLOCK, inn // BLOCK, BLOCK) * s[:, None, :, None]).reshape(out, inn)


def _channel_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = w.abs().amax(dim=1, keepdim=True).clamp(min=SCALE_FLOOR) / FP8_MAX
    return (w / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def _channel_dequantize(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return q.float() * s


def _mx_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scale, q = to_mx(w.contiguous(), FP8, MX_BLOCK, ScaleCalculationMode.RCEIL)
    return q.reshape(w.shape), scale.view(torch.uint8).reshape(w.shape[0], w.shape[1] // MX_BLOCK)


def _mx_dequantize(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    out, inn = q.shape
    return (q.float().reshape(out, inn // MX_BLOCK, MX_BLOCK) * torch.exp2(s.float() - 127)[..., None]).reshape(out, inn)


def _ct_args(strategy: str, **extra) -> dict:
    return {"dynamic": False, "group_size": None, "num_bits": 8, "strategy": strategy, "symmetric": True, "type": "float", **extra}


def _ct_config(fmt: str, weights: dict, inputs: dict, ignore: list[str]) -> dict:
    return {"config_groups": {"group_0": {"format": None, "input_activations": inputs, "output_activations": None,
                                          "targets": ["Linear"], "weights": weights}},
            "format": fmt, "global_compression_ratio": None, "ignore": ignore, "kv_cache_scheme": None,
            "moe_sparsity_config": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}


@dataclass(frozen=True)
class Format:
    name: str
    """The --quant value."""
    title: str
    scale_name: str
    """What the scale beside `weight` is called."""
    scale_dtype: torch.dtype
    block: tuple[int, int]
    """(rows, columns) one scale covers along out and in, where a serving shard must split: (1, 1) for none."""
    quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    """fp32 weight [out, in] -> (float8_e4m3fn codes, scale)."""
    dequantize: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """(codes, scale) -> the fp32 weight the loaders compute: q * s."""
    config: Callable[[list[str]], dict]
    """Skip list -> config.json's quantization_config."""
    unfit_why: str = ""

    def scale_shape(self, out: int, inn: int) -> tuple[int, int]:
        rows, cols = self.block
        return (-(-out // rows) if rows > 1 else out, -(-inn // cols) if cols > 1 else 1)

    def unfit(self, out: int, inn: int) -> str | None:
        """Why a Linear of this shape cannot be held in this format (kept in high precision), or None."""
        rows, cols = self.block
        if out % rows or inn % cols:
            return f"{out} x {inn} is not a multiple of the {rows} x {cols} block{self.unfit_why}"
        return None


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format(name="fp8-block", title="FP8 block-wise (128 x 128 weight scales, dynamic per-token-group activations)",
           scale_name="weight_scale_inv", scale_dtype=torch.float32, block=(BLOCK, BLOCK), quantize=_block_quantize,
           dequantize=_block_dequantize,
           unfit_why=" (transformers' FineGrainedFP8 and compressed-tensors dequantize whole blocks only)",
           config=lambda ignore: {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                  "weight_block_size": [BLOCK, BLOCK], "ignored_layers": ignore, "modules_to_not_convert": ignore}),
    Format(name="fp8-channel", title="compressed-tensors FP8_DYNAMIC (per-output-channel weight scales, dynamic per-token "
                                     "activations)",
           scale_name="weight_scale", scale_dtype=torch.float32, block=(1, 1), quantize=_channel_quantize,
           dequantize=_channel_dequantize,
           config=lambda ignore: _ct_config("float-quantized", _ct_args("channel"),
                                            {**_ct_args("token"), "dynamic": True}, ignore)),
    Format(name="mxfp8", title="compressed-tensors MXFP8 (E8M0 scale per 32 weights of a row, dynamic MXFP8 activations)",
           scale_name="weight_scale", scale_dtype=torch.uint8, block=(1, MX_BLOCK), quantize=_mx_quantize,
           dequantize=_mx_dequantize, unfit_why=" (an MX scale covers 32 inputs)",
           config=lambda ignore: _ct_config(
               "mxfp8-quantized", _ct_args("group", group_size=MX_BLOCK, scale_dtype="torch.uint8"),
               {**_ct_args("group", group_size=MX_BLOCK, scale_dtype="torch.uint8"), "dynamic": True}, ignore)),
)}
