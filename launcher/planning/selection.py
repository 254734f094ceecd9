"""Which Linear layers run in FP8, and why the others do not: the one rule the run applies
(launcher/train/precision/select.py, on the model's modules) and planning predicts with
(launcher/planning/predict, on the model's shapes). Torch-free: names and shapes only.

A layer first meets `[[precision.rules]]`: the first entry whose `match` glob fits its name decides it:
`mode` keeps it in that precision, `recipe` runs it with that recipe of the backend (only that recipe's
dimension constraint still applies; the size heuristic does not second-guess a rule).

Otherwise the first rule that applies names the reason a layer is kept in `precision.high_precision`:
1. `precision.keep` — fnmatch globs on the layer's name;
2. `precision.keep_first_last` — the first and the last Linear in registration order
   (for a Llama: `layers.0.attention.wq` and the lm head `output`);
2b. `precision.keep_first_blocks` / `keep_last_blocks` — every Linear of the first / last N transformer
   blocks (the run finds the blocks on the model; the prediction from the model's shapes);
3. in/out features not multiples of 16 — FP8 GEMMs (`torch._scaled_mm`, cuBLASLt) need them; torchao
   can pad the inner dim instead (`precision.torchao.pad_inner_dim`). The block-scaled recipes need
   multiples of their block (mxfp8: 32, nvfp4: 16), which no padding replaces;
4. torchao only, `precision.torchao.skip_small` — torchao's size heuristic: GEMMs this small run
   slower in FP8 than in bf16 on an H100. torchao has none for mxfp8 / nvfp4: it does not apply to them.
"""

from __future__ import annotations

import fnmatch
import typing
from typing import Collection

from launcher.planning.backends import BACKENDS
from launcher.planning.hardware import BLOCK_SIZE

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

KEEP_FIRST_LAST = "keep_first_last"
KEEP_FIRST_BLOCKS = "keep_first_blocks"
KEEP_LAST_BLOCKS = "keep_last_blocks"
DIMS = "dims not multiples of 16"
SMALL = "skip_small"


def dims_reason(block: int) -> str:
    return DIMS if block == 16 else f"dims not multiples of {block}"


def keep_reason(pattern: str) -> str:
    return f"keep {pattern!r}"


def too_small(recipe: str, in_features: int, out_features: int) -> bool:
    """torchao 0.18.0's size heuristic (torchao/float8/float8_linear_utils.py,
    `_auto_filter_for_tensorwise` / `_auto_filter_for_rowwise`, from H100 benchmarks in
    torchao/float8/README.md): True when FP8 is expected to be slower than bf16.

    torchao names the weight shape (N, K) = (out_features, in_features). It has no heuristic
    for rowwise_with_gw_hp (`_auto_filter_for_recipe` raises NotImplementedError); that recipe
    is rowwise scaling with a high-precision weight-gradient GEMM, so the rowwise thresholds apply.
    """
    n, k = out_features, in_features
    if recipe == "tensorwise":
        return k <= 4096 and n <= 1024
    return n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048)


def block_reason(block: int | None, n_blocks: int, plan: Plan) -> str | None:
    """Rule 2b: whether block `block` (0-based, of `n_blocks`; None: the layer is in no block) is kept."""
    p = plan.precision
    if block is None:
        return None
    if block < p.keep_first_blocks:
        return KEEP_FIRST_BLOCKS
    if block >= n_blocks - p.keep_last_blocks:
        return KEEP_LAST_BLOCKS
    return None


def name_reason(name: str, plan: Plan, first_last: Collection[str], block: int | None = None, n_blocks: int = 0) -> str | None:
    """Rules 1-2b: what the layer's name (and the block it is in) keeps in high precision."""
    for pattern in plan.precision.keep:
        if fnmatch.fnmatchcase(name, pattern):
            return keep_reason(pattern)
    return KEEP_FIRST_LAST if name in first_last else block_reason(block, n_blocks, plan)


def default_recipe(plan: Plan) -> str:
    """The recipe (MS-AMP: opt level) of the plan's backend."""
    p = plan.precision
    return BACKENDS[p.backend].recipe(p)


def shape_reason(in_features: int, out_features: int, plan: Plan, recipe: str | None = None, heuristic: bool = True) -> str | None:
    """Rules 3-4: what the layer's shape keeps in high precision, for `recipe` (default: the plan's);
    `heuristic=False` leaves torchao's size heuristic out (a `[[precision.rules]]` recipe asked for this layer)."""
    p = plan.precision
    b = BACKENDS[p.backend]
    recipe = recipe or default_recipe(plan)
    block = BLOCK_SIZE.get(recipe) if b.shape_rules else None
    if block is not None:
        return dims_reason(block) if in_features % block or out_features % block else None
    if not (b.shape_rules and b.setting(p, "pad_inner_dim")) and (in_features % 16 or out_features % 16):
        return DIMS
    if heuristic and b.shape_rules and b.setting(p, "skip_small") and too_small(recipe, in_features, out_features):
        return SMALL
    return None


def matching_rule(name: str, plan: Plan):
    """The first `[[precision.rules]]` entry whose `match` glob fits `name`, or None."""
    return next((r for r in plan.precision.rules if fnmatch.fnmatchcase(name, r.match)), None)


def unmatched(rules, names: Collection[str]) -> list[str]:
    """The match globs of `rules` that fit none of `names` (the model's Linear and expert-group names)."""
    return unmatched_globs([r.match for r in rules], names)


def unmatched_globs(globs: Collection[str], names: Collection[str]) -> list[str]:
    """The globs that fit none of `names`."""
    return [g for g in globs if not any(fnmatch.fnmatchcase(n, g) for n in names)]


def rule_reason(rule) -> str:
    return f"rule {rule.match!r}: {rule.mode}"


def choose(name: str, in_features: int, out_features: int, plan: Plan, first_last: Collection[str],
           block: int | None = None, n_blocks: int = 0) -> tuple[str | None, str | None]:
    """(the recipe the layer runs, None), or (None, the reason it is kept in high precision)."""
    if is_router(name):
        return None, ROUTER
    rule = matching_rule(name, plan)
    if rule is not None and rule.mode:
        return None, rule_reason(rule)
    if rule is not None:
        why = shape_reason(in_features, out_features, plan, rule.recipe, heuristic=False)
        return (None, why) if why else (rule.recipe, None)
    why = name_reason(name, plan, first_last, block, n_blocks) or shape_reason(in_features, out_features, plan)
    return (None, why) if why else (default_recipe(plan), None)


# --- Mixture-of-Experts ---------------------------------------------------------------------------

ROUTER = "MoE router gate (routing stays in fp32)"
GROUPED_ALIGN = {"rowwise": 16, "mxfp8": 32}
"""torchao 0.18's grouped-GEMM recipes for 3D expert weights and the row multiple each token group
must have (torchao/prototype/moe_training: fp8_grouped_mm.py asserts dims % 16 and pads groups to 16,
TOKEN_GROUP_ALIGN_SIZE_M; mxfp8_grouped_mm.py pads to the 32-value scaling block; torchtitan
pad_multiple 16 / 32). `Float8TrainingOpConfig`'s grouped GEMM is rowwise only; NVFP4TrainingConfig
converts nn.Linear only (NVFP4Linear)."""
ROUTER_NAMES = ("*.router.gate", "*.mlp.gate", "*.block_sparse_moe.gate", "*.moe.gate")
"""Globs of the router gates of the builtin MoE and of Hugging Face MoE models (Qwen3-MoE's mlp.gate,
Mixtral's block_sparse_moe.gate)."""


def is_router(name: str) -> bool:
    """Whether the Linear named `name` scores experts: always kept in high precision (torchtitan
    computes it in fp32; FP8 noise there flips the top-k choice)."""
    return any(fnmatch.fnmatchcase(name, g) for g in ROUTER_NAMES)


def no_grouped_reason(recipe: str) -> str:
    if recipe == "nvfp4":
        return "torchao 0.18 has no NVFP4 grouped GEMM training (NVFP4TrainingConfig converts nn.Linear only)"
    return f"torchao 0.18 has no {recipe} grouped GEMM (Float8TrainingOpConfig is rowwise only)"


def choose_experts(name: str, dim: int, hidden: int, plan: Plan, block: int | None = None,
                   n_blocks: int = 0) -> tuple[str | None, str | None]:
    """(the grouped recipe a GroupedExperts module runs, None) or (None, why it stays in high precision):
    `[[precision.rules]]` first, then keep globs and kept blocks, then the recipe's grouped support and dims."""
    rule = matching_rule(name, plan)
    if rule is not None and rule.mode:
        return None, rule_reason(rule)
    if rule is not None:
        recipe = rule.recipe
    else:
        why = name_reason(name, plan, (), block, n_blocks)
        if why:
            return None, why
        recipe = default_recipe(plan)
    if not BACKENDS[plan.precision.backend].grouped_experts:
        return None, f"{plan.precision.backend} has no grouped-GEMM FP8 for 3D expert weights"
    if recipe not in GROUPED_ALIGN:
        return None, no_grouped_reason(recipe)
    align = GROUPED_ALIGN[recipe]
    if dim % align or hidden % align:
        return None, dims_reason(align)
    return recipe, None


REASONS = {
    SMALL: ("precision.torchao.skip_small", "set precision.torchao.skip_small = false (torchao's H100 size rule; off for a CPU smoke run)"),
    KEEP_FIRST_LAST: ("precision.keep_first_last", "set precision.keep_first_last = false"),
    KEEP_FIRST_BLOCKS: ("precision.keep_first_blocks", "lower precision.keep_first_blocks"),
    KEEP_LAST_BLOCKS: ("precision.keep_last_blocks", "lower precision.keep_last_blocks"),
    DIMS: (DIMS, "set precision.torchao.pad_inner_dim = true (torchao)"),
}
"""A kept layer's reason -> (the spec key it comes from, the change that would let the layer run in FP8)."""


def _reason(why: str) -> tuple[str, str | None]:
    if why in REASONS:
        return REASONS[why]
    if why.startswith("keep "):
        return f"precision.keep {why[5:]}", f"remove {why[5:]} from precision.keep"
    if why.startswith("rule "):
        match = why[5:].split(":")[0]
        return f"precision.rules {match}", f"change the mode of the precision.rules entry {match}"
    return why, None  # no key decides it (a router gate, a backend without grouped GEMMs)


def reason_key(why: str) -> str:
    """The spec key (or fact) a kept layer's reason comes from: `precision.torchao.skip_small`, `precision.keep 'x'`,
    `precision.rules 'x'`, or the reason itself where no key decides it (dims, a router gate)."""
    return _reason(why)[0]


def reason_fix(why: str) -> str | None:
    """The spec change that would let layers kept for `why` run in FP8; None where no key does."""
    return _reason(why)[1]


def reason(name: str, in_features: int, out_features: int, plan: Plan, first_last: Collection[str],
           block: int | None = None, n_blocks: int = 0) -> str | None:
    """None when the layer runs in FP8, else the first rule that keeps it in high precision."""
    return choose(name, in_features, out_features, plan, first_last, block, n_blocks)[1]
