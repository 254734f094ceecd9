"""Which layers run in FP8: precision.keep globs and [[precision.rules]] entries that match nothing or ask for what the
backend or engine cannot do, a plan that would convert no layer, and a run that converted none."""

from __future__ import annotations

from launcher.planning.backends import BACKENDS, backend_of
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import fp8
from launcher.planning.selection import reason_fix, reason_key, unmatched, unmatched_globs


def _counted(reasons) -> list[tuple[str, int]]:
    """(reason, how many) for each distinct reason, the most frequent first."""
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


def _bad_rule_recipe(f: Facts) -> str:
    """What is wrong with the first [[precision.rules]] recipe, or ""."""
    from launcher.planning.read import recipes

    p = f.plan.precision
    for r in p.rules:
        if r.recipe is None:
            continue
        b = BACKENDS[p.backend]
        if not b.mixes_recipes:
            return f"precision.rules entry {r.match!r} sets recipe {r.recipe!r}, and backend {p.backend} cannot mix recipes per module."
        if r.recipe not in recipes(b.name):
            return f"precision.rules entry {r.match!r} sets recipe {r.recipe!r}, which is not a torchao recipe."
    return ""


def _bad_rule_mode(f: Facts) -> str:
    p, strategy = f.plan.precision, f.plan.distributed.strategy
    for r in p.rules:
        if r.mode is None or r.mode == p.compute_dtype:
            continue
        if strategy == "deepspeed" or fp8(f) and backend_of(p).scaling_tensors:
            return (f"precision.rules entry {r.match!r} asks for {r.mode} in a {p.compute_dtype} run under "
                    f"{'DeepSpeed' if strategy == 'deepspeed' else 'MS-AMP'}, which keeps one dtype for every weight.")
        if r.mode == "fp16":
            return f"precision.rules entry {r.match!r} asks for fp16 in a {p.compute_dtype} run, which has no loss scaling."
    return ""


def _model_shape(f: Facts):
    """The model's shapes when planning knows them (builtin and hf: models), else None."""
    from launcher.planning.predict.shapes import model_shape

    return model_shape(f.plan.train.model, f.spec_folder or f.plan.spec_dir)[0]


def _layer_names(f: Facts) -> list[str] | None:
    """Every name precision.keep and [[precision.rules]] globs are matched against: each Linear, and each grouped-experts
    module of an MoE (`layers.N.moe.experts`); None when planning does not know the model's names."""
    shape = _model_shape(f)
    if shape is None:
        return None
    e = shape.experts
    experts = [e.name.format(i=i) for i in range(e.first_block, e.first_block + e.count)] if e else []
    return [s.name.format(i=i) for s in shape.linears for i in range(s.count)] + experts


def _unmatched_rules(f: Facts) -> list[str]:
    """The match globs of [[precision.rules]] that name no layer of the model (empty when the names are unknown)."""
    names = _layer_names(f) if f.plan.precision.rules else None
    return [] if names is None else unmatched(f.plan.precision.rules, names)


def _unmatched_keep(f: Facts) -> list[str]:
    """The precision.keep globs that name no layer of an FP8 plan's model (empty when the names are unknown)."""
    names = _layer_names(f) if fp8(f) and f.plan.precision.keep else None
    return [] if names is None else unmatched_globs(f.plan.precision.keep, names)


def _selection(f: Facts) -> tuple[int, dict[str, int]] | None:
    """(layers that run in FP8, {reason: layers kept}) for an FP8 plan whose model planning knows, else None."""
    from launcher.planning.predict import layer_selection

    shape = _model_shape(f) if fp8(f) else None
    return None if shape is None else layer_selection(f.plan, shape)


def _none_selected(f: Facts) -> bool:
    chosen = _selection(f)
    return chosen is not None and chosen[0] == 0 and bool(chosen[1])


def _none_selected_detail(f: Facts) -> str:
    _, kept = _selection(f)
    why = ", ".join(f"{n} by {reason_key(r)}" for r, n in sorted(kept.items(), key=lambda kv: -kv[1]))
    return (f"precision.mode = \"fp8\" but no layer of {f.plan.train.model} would run in FP8: all {sum(kept.values())} stay in "
            f"{f.plan.precision.high_precision} ({why}). The run would stop with FP8-NOT-APPLIED after torchrun starts.")


def _none_selected_fix(f: Facts) -> str:
    _, kept = _selection(f)
    fixes = [x for r in sorted(kept, key=lambda r: -kept[r]) if (x := reason_fix(r))]
    return "; or ".join(dict.fromkeys(fixes)) + '; or set precision.mode = "bf16"' if fixes else 'set precision.mode = "bf16"'


RULES: tuple[Rule, ...] = (
    Rule(id="FP8-NOT-APPLIED", severity="error", stage="run",
         when="fp8 requested but zero Linear layers were converted",
         why="a run that asks for FP8 and trains in high precision is a silent fallback (LlamaFactory #9500).",
         fix="check precision.keep, precision.keep_first_last and precision.torchao.skip_small (or use a model whose Linear dims are "
             "multiples of 16)",
         condition=lambda f: fp8(f) and f.fp8_layers == 0,
         detail=lambda f: ("a run that asks for FP8 and trains in high precision is a silent fallback (LlamaFactory #9500)."
                           + (f" The model's matrix layers are {', '.join(f.foreign_matmuls)}, not nn.Linear: no FP8 backend converts "
                              "that module type (transformers' Conv1D is converted for you); write the model with nn.Linear"
                              if f.foreign_matmuls else "")
                           + (f" All {len(f.kept)} layers were kept: "
                              + ", ".join(f"{n} by {reason_key(r)}" for r, n in _counted(f.kept)) + "." if f.kept else "")),
         fix_for=lambda f: "; or ".join(dict.fromkeys(x for r, _ in _counted(f.kept) if (x := reason_fix(r))))),
    Rule(id="PRECISION-RULE-RECIPE", severity="error", stage="plan",
         when="a [[precision.rules]] recipe with backend te or msamp, or one that is not a recipe of torchao",
         why="Transformer Engine applies one recipe to every swapped module (te.autocast(recipe=...)) and MS-AMP one opt level to the "
             "model; torchao converts each Linear on its own, so only torchao can mix recipes per module.",
         fix='set precision.backend = "torchao" with a torchao recipe (tensorwise, rowwise, rowwise_with_gw_hp, mxfp8, nvfp4), or give '
             'the entry `mode` instead of `recipe`',
         condition=lambda f: bool(_bad_rule_recipe(f)),
         detail=lambda f: _bad_rule_recipe(f)),
    Rule(id="PRECISION-RULE-MODE", severity="error", stage="plan",
         when="a [[precision.rules]] mode other than the run's high precision under DeepSpeed or MS-AMP, or fp16 outside an fp16 run",
         why="a rule's own dtype runs its Linears outside autocast in that dtype, in an FSDP2 unit of their own (DDP keeps fp32 "
             "weights anyway); DeepSpeed keeps every weight in its one dtype and MS-AMP wraps the model, so the mode would be "
             "silently ignored there, and an fp16 module in a run without loss scaling would underflow its gradients.",
         fix='set the entry\'s mode to precision.high_precision, use strategy ddp or fsdp2 with backend torchao or te, or mode = "fp32"',
         condition=lambda f: bool(_bad_rule_mode(f)),
         detail=lambda f: _bad_rule_mode(f)),
    Rule(id="FP8-NONE-SELECTED", severity="error", stage="plan",
         when="fp8 with a model planning knows (builtin, hf:) whose every Linear and expert group the layer selection keeps in high "
              "precision",
         why="the run would convert nothing and stop with FP8-NOT-APPLIED after torchrun started: say so, with the keys that keep each "
             "layer, before anything launches.",
         fix='set precision.mode = "bf16", or relax what keeps the layers (precision.torchao.skip_small, precision.keep_first_last, '
             'precision.keep)',
         condition=_none_selected, detail=_none_selected_detail, fix_for=_none_selected_fix),
    Rule(id="PRECISION-KEEP-UNMATCHED", severity="warning", stage="plan",
         when="a precision.keep glob that names no layer of the model (builtin and hf: models, whose names are known)",
         why="a keep glob that matches nothing keeps nothing: usually a typo, or a substring written without wildcards "
             "(torchtitan's filter_fqns match substrings; a glob matches the whole name).",
         fix='correct the precision.keep glob, e.g. "*attention.wk*" for the substring attention.wk (`fp8launch plan --format json` lists '
             "the layers under prediction.layers), or remove it",
         condition=lambda f: bool(_unmatched_keep(f)),
         detail=lambda f: "precision.keep " + ", ".join(repr(m) for m in _unmatched_keep(f)) + f" match no layer of {f.plan.train.model}."),
    Rule(id="PRECISION-RULE-UNMATCHED", severity="warning", stage="plan",
         when="a [[precision.rules]] match glob that names no Linear of the model (builtin and hf: models, whose names are known)",
         why="a rule that matches nothing changes nothing: usually a typo in the module name.",
         fix="correct the entry's precision.rules match glob (`fp8launch plan --format json` lists the layers under prediction.layers), or "
             "remove it",
         condition=lambda f: bool(_unmatched_rules(f)),
         detail=lambda f: "precision.rules " + ", ".join(repr(m) for m in _unmatched_rules(f)) + " match no layer of "
             + f"{f.plan.train.model}."),
)
