"""The statistics of one FP8 cast, computed the way the backend scales (pure tensor math).

For a high-precision tensor `x` cast to an FP8 format with scale `s` (the cast stores
`x * s` in FP8 and the GEMM multiplies by `1 / s` again, TE's `scale_inv`):
- amax: max |x| (what dynamic scaling derives the scale from);
- scale: `s`, one per tensor (tensorwise) or one per row (rowwise; min and max reported);
- underflow: the share of the NONZERO values of `x` whose FP8 value is zero (flushed);
- overflow: the share of values whose scaled magnitude lies beyond what the format can
  round to (more than half a step above its max), so the cast saturates them at the max.

`torchao_scale` mirrors torchao.float8.float8_utils.amax_to_scale (fp64 division, EPS
clamp, optional power-of-2 rounding down); a test checks it against torchao's own function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

EPS = 1e-12
"""torchao's floor on amax before dividing (float8_utils.EPS)."""

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
"""The FP8 formats by the short names the records use."""

FIELDS = ("amax", "scale_min", "scale_max", "nonzero", "underflow", "overflow")
"""The columns of one `cast_stats` row (the last three are counts)."""


def format_name(dtype: torch.dtype) -> str:
    """"e4m3" or "e5m2" for a torch float8 dtype (the fnuz variants included)."""
    return "e5m2" if "e5m2" in str(dtype) else "e4m3"


def fp8_max(fmt: str) -> float:
    return float(torch.finfo(FORMATS[fmt]).max)


def saturation_threshold(fmt: str) -> float:
    """Scaled magnitudes above this do not round to the format's max: the cast saturates them.
    Half of the top binade's step above the max (e4m3: 448 + 16, e5m2: 57344 + 4096)."""
    mantissa_bits = {"e4m3": 3, "e5m2": 2}[fmt]
    top = fp8_max(fmt)
    step = 2.0 ** (math.floor(math.log2(top)) - mantissa_bits)
    return top + step / 2


@dataclass(frozen=True, kw_only=True, slots=True)
class Scaling:
    """How one operand of one layer is cast."""

    fmt: str
    """"e4m3" | "e5m2"."""
    rowwise: bool = False
    """One scale per row (the last dim is reduced), as torchao's AXISWISE / TE's block recipes; else one per tensor."""
    power_of_2: bool = False
    """Scales rounded down to a power of 2 (torchao's rowwise recipes)."""
    margin: int = 0
    """TE's margin: the scale is divided by 2**margin."""
    block: int = 0
    """With rowwise: scale blocks of this many elements along the last dim (TE's 1 x N block
    recipes) where it divides the last dim; 0: whole rows."""

    @property
    def granularity(self) -> str:
        if not self.rowwise:
            return "tensorwise"
        return f"block1x{self.block}" if self.block else "rowwise"


def rows_of(x: torch.Tensor, scaling: Scaling) -> torch.Tensor:
    """x as [rows, n] with one scale per row (rows: all leading dims flattened; blocks split further)."""
    n = x.shape[-1] if x.dim() else 1
    if scaling.block and n % scaling.block == 0:
        n = scaling.block
    return x.reshape(-1, n)


def torchao_scale(amax: torch.Tensor, fmt: str, *, power_of_2: bool = False, margin: int = 0) -> torch.Tensor:
    """torchao's amax_to_scale: fp8_max / max(amax, EPS) in fp64, as fp32, optionally rounded
    down to a power of 2; TE's current scaling adds the margin (a divide by 2**margin)."""
    res = (fp8_max(fmt) / torch.clamp(amax.to(torch.float64), min=EPS)).to(torch.float32)
    if margin:
        res = res / (2.0 ** margin)
    if power_of_2:
        # torchao's _round_scale_down_to_power_of_2: exp2(floor(log2(scale)))
        res = torch.exp2(torch.floor(torch.log2(res)))
    return res


def flush_threshold(fmt: str) -> float:
    """Scaled magnitudes at or below this round to zero in the format: half its smallest
    subnormal (e4m3: 2**-10, e5m2: 2**-17; a tie rounds to the even neighbour, zero)."""
    return float(torch.finfo(FORMATS[fmt]).smallest_normal) * 2.0 ** -{"e4m3": 3, "e5m2": 2}[fmt] / 2


def cast_stats(x: torch.Tensor, scaling: Scaling, scale: torch.Tensor | None = None) -> torch.Tensor:
    """One float64 row of FIELDS for the cast of `x`: the dynamic scale of `scaling` unless
    `scale` (a backend's own, e.g. TE's delayed scaling from its amax history) is given.

    Works on |x| in fp32 scaled as the backend scales (torchao: `x.to(float32) * scale`), so a
    value flushes to zero exactly when its scaled magnitude is at most `flush_threshold` and
    saturates when it is above `saturation_threshold` (a test checks this against the real
    FP8 cast). Stays on x's device: no host synchronisation."""
    mag = x.detach().to(torch.float32).abs()
    if scaling.rowwise:
        mag = rows_of(mag, scaling)
        amax = mag.amax(dim=-1, keepdim=True)
    else:
        amax = mag.max()
    if scale is None:
        scale = torchao_scale(amax, scaling.fmt, power_of_2=scaling.power_of_2, margin=scaling.margin)
    nonzero = torch.count_nonzero(mag)
    mag.mul_(scale)
    zero_or_flushed = torch.count_nonzero(mag <= flush_threshold(scaling.fmt))
    overflow = torch.count_nonzero(mag > saturation_threshold(scaling.fmt))
    underflow = zero_or_flushed - (mag.numel() - nonzero)
    scale = scale.to(torch.float64)
    return torch.stack([amax.max().to(torch.float64), scale.min(), scale.max(), nonzero.to(torch.float64),
                        underflow.to(torch.float64), overflow.to(torch.float64)])
