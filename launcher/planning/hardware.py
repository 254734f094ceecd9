"""Which GPU runs which precision. Torch-free facts, in one place for `fp8launch doctor`,
`fp8launch init` and the rule table.

Compute capabilities are `(major, minor)` tuples as `torch.cuda.get_device_capability` returns them.
"""

from __future__ import annotations

FP8_MIN_CAPABILITY = (8, 9)
"""FP8 GEMMs need Ada (sm89), Hopper (sm90) or Blackwell (sm100+)."""

TE_RECIPE_CAPABILITY = {"block": ((9, 0), None), "mxfp8": ((10, 0), (12, 0)), "nvfp4": ((10, 0), None)}
"""Transformer Engine recipes that need more than FP8 itself: recipe -> (lowest compute capability,
first one refused again or None). Block scaling needs Hopper, MXFP8/NVFP4 Blackwell; TE 2.20
refuses MXFP8 on sm120 (consumer Blackwell)."""

TORCHAO_RECIPE_CAPABILITY = {"mxfp8": ((10, 0), None), "nvfp4": ((10, 0), None)}
"""torchao's block-scaled recipes: its MX kernels and NVFP4 Triton kernels check `is_sm_at_least_100`
(torchao/prototype/mx_formats/kernels.py, moe_training/nvfp4_training/quantize_2d_triton.py, 0.18.0)."""

BLOCK_SIZE = {"mxfp8": 32, "nvfp4": 16}
"""The block-scaled recipes (torchao and Transformer Engine alike) and the values that share one scale: every
dimension a GEMM of the layer scales along (in and out features, and the tokens: rule TORCHAO-BLOCK-TOKENS)
must be a multiple (torchao 0.18's MX cast asserts "the last dimension ... must be divisible by block_size 32")."""

BLOCK_RECIPES = tuple(BLOCK_SIZE)

BF16_MIN_CAPABILITY = (8, 0)
"""bf16 tensor cores start with Ampere; older GPUs train in fp16."""



def precision_key(precision) -> tuple[str, str | None, str | None]:
    """(mode, backend, recipe) of a plan's PrecisionConfig, as `supports` and `requirement` take them."""
    if precision.mode != "fp8":
        return precision.mode, None, None
    return "fp8", precision.backend, {"torchao": precision.torchao.recipe, "te": precision.te.recipe}.get(precision.backend)


def capability_range(mode: str, backend: str | None = None, recipe: str | None = None) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """(lowest compute capability that runs this precision, first one that does not again or None)."""
    if mode == "fp8":
        table = {"te": TE_RECIPE_CAPABILITY, "torchao": TORCHAO_RECIPE_CAPABILITY}.get(backend, {})
        low, high = table.get(recipe, ((0, 0), None))
        return max(FP8_MIN_CAPABILITY, low), high
    if mode == "bf16":
        return BF16_MIN_CAPABILITY, None
    return (0, 0), None


def supports(capability: tuple[int, int], mode: str, backend: str | None = None, recipe: str | None = None) -> bool:
    """Whether a GPU of this compute capability runs the precision (fp8 with this backend and recipe)."""
    low, high = capability_range(mode, backend, recipe)
    return low <= capability and (high is None or capability < high)


def requirement(mode: str, backend: str | None = None, recipe: str | None = None) -> str:
    """e.g. "compute capability >= 10.0 and below 12.0"."""
    low, high = capability_range(mode, backend, recipe)
    return f"compute capability >= {capability_text(low)}" + (f" and below {capability_text(high)}" if high else "")


def capability_text(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"
