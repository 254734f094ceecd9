"""Which Linear layers run in FP8, and why the others do not. Pure: reads the model's shapes only.

Every FP8 backend asks the same question of the same rules, in this order (the first that
applies names the reason a layer is kept in `precision.high_precision`):

1. `precision.keep` — fnmatch globs on the layer's FQN;
2. `precision.keep_first_last` — the first and the last Linear in module registration order
   (for a Llama: `layers.0.attention.wq` and the lm head `output`);
3. in/out features not multiples of 16 — FP8 GEMMs (`torch._scaled_mm`, cuBLASLt) need
   them; torchao can pad the inner dim instead (`precision.torchao.pad_inner_dim`);
4. torchao only, `precision.torchao.skip_small` — torchao's size heuristic: GEMMs this
   small run slower in FP8 than in bf16 on an H100.
"""

from __future__ import annotations

import fnmatch
import typing
from typing import Callable

from torch import nn

from launcher.planning.predict.layers import too_small  # noqa: F401  (the rule lives there, torch-free)

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

KEEP_FIRST_LAST = "keep_first_last"
DIMS = "dims not multiples of 16"
SMALL = "skip_small"
FUNCTIONAL = "weight used functionally by its parent (not called as a module)"


def keep_reason(pattern: str) -> str:
    return f"keep {pattern!r}"


def linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """Every nn.Linear (subclasses included) with its FQN, in module registration order."""
    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, nn.Linear)]


def _needs_dims16(plan: Plan) -> bool:
    p = plan.precision
    return not (p.backend == "torchao" and p.torchao.pad_inner_dim)


def called_functionally(mod: nn.Module) -> bool:
    """nn.MultiheadAttention's out_proj is a Linear whose weight its parent passes to
    F.multi_head_attention_forward: swapping the module would change nothing, so it never runs in
    FP8 and must not be counted as if it did. PyTorch marks it with this subclass."""
    return type(mod) is nn.modules.linear.NonDynamicallyQuantizableLinear


def _reason(fqn: str, mod: nn.Linear, plan: Plan, first_last: set[str]) -> str | None:
    p = plan.precision
    if called_functionally(mod):
        return FUNCTIONAL
    for pattern in p.keep:
        if fnmatch.fnmatchcase(fqn, pattern):
            return keep_reason(pattern)
    if fqn in first_last:
        return KEEP_FIRST_LAST
    if _needs_dims16(plan) and (mod.in_features % 16 or mod.out_features % 16):
        return DIMS
    if p.backend == "torchao" and p.torchao.skip_small and too_small(p.torchao.recipe, mod.in_features, mod.out_features):
        return SMALL
    return None


def _first_last(model: nn.Module, plan: Plan) -> set[str]:
    if not plan.precision.keep_first_last:
        return set()
    names = [fqn for fqn, m in linears(model) if not called_functionally(m)]
    return {names[0], names[-1]} if names else set()


def classify(model: nn.Module, plan: Plan) -> dict[str, str | None]:
    """{fqn: None (runs in FP8) or the reason it is kept in high precision} for every nn.Linear,
    in registration order."""
    first_last = _first_last(model, plan)
    return {fqn: _reason(fqn, mod, plan, first_last) for fqn, mod in linears(model)}


def fp8_filter(plan: Plan, model: nn.Module | None = None) -> Callable[[nn.Module, str], bool]:
    """A `module_filter_fn(module, fqn) -> bool` (torchao's convention: True = convert to FP8).

    keep_first_last needs to see every Linear, so it needs `model`; without a model and with
    keep_first_last on this raises rather than silently converting the first and last layers.
    """
    if plan.precision.keep_first_last and model is None:
        raise ValueError("fp8_filter: precision.keep_first_last needs the model to find its first and last Linear")
    first_last = _first_last(model, plan) if model is not None else set()

    def module_filter_fn(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and _reason(fqn, module, plan, first_last) is None

    return module_filter_fn
