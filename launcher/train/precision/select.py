"""Which Linear layers of a model run in FP8, and why the others do not: launcher/planning/selection.py's
rule (shared with planning's prediction) applied to the model's modules, plus what only the modules
can tell (a Linear whose weight its parent uses functionally never runs as a module). Pure: reads the
model's shapes only."""

from __future__ import annotations

import typing
from typing import Callable

from torch import nn

from launcher.errors import LauncherError, with_fix
from launcher.planning.selection import choose, unmatched, unmatched_globs
from launcher.train.fqn import clean_fqn

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

FUNCTIONAL = "weight used functionally by its parent (not called as a module)"


def linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """Every nn.Linear (subclasses included) with its FQN, in module registration order."""
    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, nn.Linear)]


def called_functionally(mod: nn.Module) -> bool:
    """nn.MultiheadAttention's out_proj is a Linear whose weight its parent passes to
    F.multi_head_attention_forward: swapping the module would change nothing, so it never runs in
    FP8 and must not be counted as if it did. PyTorch marks it with this subclass."""
    return type(mod) is nn.modules.linear.NonDynamicallyQuantizableLinear


def _choice(fqn: str, mod: nn.Linear, plan: Plan, first_last: set[str], blocks: tuple[dict[str, int], int] = ({}, 0)):
    if called_functionally(mod):
        return None, FUNCTIONAL
    of, n_blocks = blocks
    # keep / rules globs and keep_first_last name modules as the model defines them (compile and checkpointing
    # wrappers add `_orig_mod` / `_checkpoint_wrapped_module` once the blocks are prepared)
    return choose(clean_fqn(fqn), mod.in_features, mod.out_features, plan, {clean_fqn(n) for n in first_last}, of.get(fqn), n_blocks)


def block_of_linears(model: nn.Module, plan: Plan) -> tuple[dict[str, int], int]:
    """({Linear FQN: index of the transformer block it is in}, number of blocks) when the plan keeps blocks
    (precision.keep_first_blocks / keep_last_blocks), else ({}, 0). A model without blocks fp8launch can find
    stops the run rather than converting what the spec asked to keep."""
    p = plan.precision
    if not (p.keep_first_blocks or p.keep_last_blocks):
        return {}, 0
    from launcher.train.models import transformer_blocks

    blocks = transformer_blocks(model)
    if not blocks:
        raise LauncherError(with_fix(
            f"precision.keep_first_blocks / keep_last_blocks ask to keep blocks of a {type(model).__name__}, which has no repeated "
            "blocks fp8launch can find (a ModuleList model.layers, or a Hugging Face model's decoder layers)",
            "set precision.keep_first_blocks = 0 and keep_last_blocks = 0, and name the layers with precision.keep globs"))
    index = {id(b): i for i, b in enumerate(blocks)}
    prefixes = {fqn + ".": index[id(m)] for fqn, m in model.named_modules() if id(m) in index}
    out = {}
    for fqn, _ in linears(model):
        for prefix, i in prefixes.items():
            if fqn.startswith(prefix):
                out[fqn] = i
                break
    return out, len(blocks)


def _first_last(model: nn.Module, plan: Plan) -> set[str]:
    if not plan.precision.keep_first_last:
        return set()
    names = [fqn for fqn, m in linears(model) if not called_functionally(m)]
    return {names[0], names[-1]} if names else set()


def choices(model: nn.Module, plan: Plan) -> dict[str, tuple[str | None, str | None]]:
    """{fqn: (the recipe it runs, None) or (None, the reason it is kept in high precision)} for every nn.Linear,
    in registration order (a `[[precision.rules]]` entry's recipe, or the plan's)."""
    first_last, blocks = _first_last(model, plan), block_of_linears(model, plan)
    return {fqn: _choice(fqn, mod, plan, first_last, blocks) for fqn, mod in linears(model)}


def classify(model: nn.Module, plan: Plan) -> dict[str, str | None]:
    """{fqn: None (runs in FP8) or the reason it is kept in high precision} for every nn.Linear,
    in registration order."""
    return {fqn: why for fqn, (_, why) in choices(model, plan).items()}


def fp8_filter(plan: Plan, model: nn.Module | None = None) -> Callable[[nn.Module, str], bool]:
    """A `module_filter_fn(module, fqn) -> bool` (torchao's convention: True = convert to FP8).

    keep_first_last needs to see every Linear, so it needs `model`; without a model and with
    keep_first_last on this raises rather than silently converting the first and last layers.
    """
    p = plan.precision
    if (p.keep_first_last or p.keep_first_blocks or p.keep_last_blocks) and model is None:
        raise ValueError("fp8_filter: precision.keep_first_last / keep_*_blocks need the model "
                         "to find its first and last Linear and blocks")
    first_last = _first_last(model, plan) if model is not None else set()
    blocks = block_of_linears(model, plan) if model is not None else ({}, 0)

    def module_filter_fn(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and _choice(fqn, module, plan, first_last, blocks)[0] is not None

    return module_filter_fn


def unmatched_rules(model: nn.Module, plan: Plan) -> dict[str, list[str]]:
    """{rule id: globs} for the `[[precision.rules]]` match globs (PRECISION-RULE-UNMATCHED) and, in an FP8 run, the
    precision.keep globs (PRECISION-KEEP-UNMATCHED) that name no Linear or grouped-experts module of the built model."""
    from .torchao_moe import grouped_experts

    names = [clean_fqn(fqn) for fqn, _ in linears(model)] + [clean_fqn(fqn) for fqn, _ in grouped_experts(model)]
    found = {"PRECISION-RULE-UNMATCHED": unmatched(plan.precision.rules, names),
             "PRECISION-KEEP-UNMATCHED": unmatched_globs(plan.precision.keep, names) if plan.precision.fp8 else []}
    return {rule: globs for rule, globs in found.items() if globs}
