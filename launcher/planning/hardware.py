"""Which GPU runs which precision. Torch-free facts, in one place for `fp8launch doctor`,
`fp8launch init` and the rule table.

Compute capabilities are `(major, minor)` tuples as `torch.cuda.get_device_capability` returns them.
"""

from __future__ import annotations

from launcher.planning.backends import BACKENDS, FP8_MIN_CAPABILITY, backend_of

# Which recipes need more than FP8 itself is each backend's record (launcher/planning/backends.py: capability).

BLOCK_SIZE = {"mxfp8": 32, "nvfp4": 16}
"""The block-scaled recipes (torchao and Transformer Engine alike) and the values that share one scale: every
dimension a GEMM of the layer scales along (in and out features, and the tokens: rule TORCHAO-BLOCK-TOKENS)
must be a multiple (torchao 0.18's MX cast asserts "the last dimension ... must be divisible by block_size 32")."""

BLOCK_RECIPES = tuple(BLOCK_SIZE)

BF16_MIN_CAPABILITY = (8, 0)
"""bf16 tensor cores start with Ampere; older GPUs train in fp16."""


def precision_key(precision) -> tuple[str, str | None, str | None]:
    """(mode, backend, recipe) of a plan's PrecisionConfig, as `supports` and `requirement` take them."""
    b = backend_of(precision)
    if b is None:
        return precision.mode, None, None
    return "fp8", b.name, b.recipe(precision) if b.has_recipes else None


def capability_range(mode: str, backend: str | None = None, recipe: str | None = None) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """(lowest compute capability that runs this precision, first one that does not again or None)."""
    if mode == "fp8":
        b = BACKENDS.get(backend or "")
        return b.needs_capability(recipe) if b else (FP8_MIN_CAPABILITY, None)
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
