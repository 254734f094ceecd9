"""[[precision.schedule]]: phases that start where the run has steps, move layers between FP8 and the run's high
precision without changing it, and only on runs the in-place switch handles (launcher/planning/schedule.py)."""

from __future__ import annotations

from launcher.planning.backends import backend_of
from launcher.planning.hardware import BLOCK_RECIPES
from launcher.planning.rules.core import Facts, Rule


def _schedule_steps(f: Facts) -> str:
    from launcher.planning.schedule import first_step

    steps = f.plan.train.steps
    starts = [first_step(e, steps) for e in f.plan.precision.schedule]
    bad = [s for s in starts if s < 2 or s > steps]
    if bad:
        return f"precision.schedule starts a phase at step {bad[0]}, outside 2 .. train.steps = {steps}."
    if len(set(starts)) != len(starts):
        return f"precision.schedule starts two phases at step {sorted(s for s in starts if starts.count(s) > 1)[0]}."
    return ""


def _own_dtype_rules(p) -> set:
    """The `[[precision.rules]]` entries that give layers a dtype of their own (a mode other than the run's high precision)."""
    return {r for r in p.rules if r.mode is not None and r.mode != p.compute_dtype}


def _schedule_direction(f: Facts) -> str:
    from launcher.planning.schedule import phases

    for before, after in zip(phases(f.plan), phases(f.plan)[1:]):
        a, b = before.plan.precision, after.plan.precision
        at = f"the phase from step {after.first_step}"
        if b.mode != a.mode and {a.mode, b.mode} != {"fp8", a.compute_dtype}:
            return (f"{at} sets mode {b.mode!r} after {a.mode!r}; a switch moves layers between fp8 and the run's high precision "
                    f"({a.compute_dtype}), it does not change the high precision itself (autocast, loss scaling).")
        if b.high_precision != a.high_precision:
            return f"{at} changes precision.high_precision; the autocast dtype and loss scaling stay those of the run."
        if _own_dtype_rules(a) != _own_dtype_rules(b):
            return (f"{at} changes the rules that give layers a dtype of their own (mode other than {a.compute_dtype}); those "
                    "layers are FSDP units of their own with that dtype, fixed when the run starts.")
    return ""


def _schedule_unsupported(f: Facts) -> list[str]:
    from launcher.planning.schedule import phases

    p, d = f.plan.precision, f.plan.distributed
    if not p.schedule:
        return []
    out = []
    for phase in phases(f.plan):
        q = phase.plan.precision
        b = backend_of(q)
        if b is not None and not b.schedules:
            out.append(f"backend {b.name}")
        recipes = ({b.recipe(q)} if b is not None and b.schedules else set()) | {r.recipe for r in q.rules if r.recipe}
        out += [f"torchao recipe {r}" for r in sorted(recipes & set(BLOCK_RECIPES))]
        if b is not None and b.setting(q, "fsdp_float8_all_gather"):
            out.append(f"precision.{b.section}.fsdp_float8_all_gather")
    if d.strategy == "deepspeed":
        out.append("strategy deepspeed")
    if d.tensor_parallel > 1:
        out.append("distributed.tensor_parallel > 1")
    if f.plan.monitor.fp8_stats_every > 0:
        out.append("the FP8 monitor")
    return list(dict.fromkeys(out))


RULES: tuple[Rule, ...] = (
    Rule(id="SCHEDULE-STEPS", severity="error", stage="plan",
         when="a [[precision.schedule]] entry starting at step 1, after train.steps, or at the same step as another",
         why="each phase needs steps of its own: phase 0 (the spec's precision) trains from step 1, each entry from its first step on.",
         fix="set each entry's at_step (2 .. train.steps) or at_fraction so that no two start at the same step",
         condition=lambda f: bool(_schedule_steps(f)),
         detail=lambda f: _schedule_steps(f)),
    Rule(id="SCHEDULE-DIRECTION", severity="error", stage="plan",
         when="a [[precision.schedule]] phase that changes the run's high precision, or the rules that give layers a dtype of their own",
         why="the run converts the live model in place at the switch: each Linear moves between FP8 recipes and the run's high "
             "precision, keeping its Parameters and optimizer state. The high precision itself (autocast dtype, loss scaling) and "
             "the layers with a dtype of their own (their own FSDP units) are fixed when the run starts.",
         fix='give later phases mode = "fp8" or precision.high_precision (e.g. "bf16"), another torchao recipe, keep_last_blocks or '
             "rules, and keep the rules with another mode (fp32, fp16) the same in every phase",
         condition=lambda f: bool(_schedule_direction(f)),
         detail=lambda f: _schedule_direction(f)),
    Rule(id="SCHEDULE-SUPPORT", severity="error", stage="plan",
         when="[[precision.schedule]] with something the in-place switch does not handle",
         why="the switch turns nn.Linear and torchao Float8Linear layers into each other (and re-configures a Float8Linear's recipe) "
             "under DDP or FSDP2; float8 all-gather wraps the sharded weights, tensor parallel wraps them in float8 TP styles, DeepSpeed "
             "flattens them, MX / NVFP4 and Transformer Engine / MS-AMP hold them in their own classes, and the FP8 monitor hooks the "
             "layers: none of these is switched yet.",
         fix='use precision.backend = "torchao" with tensorwise / rowwise / rowwise_with_gw_hp under ddp or fsdp2, without '
             'fsdp_float8_all_gather, tensor_parallel or the monitor; or remove precision.schedule',
         condition=lambda f: bool(_schedule_unsupported(f)),
         detail=lambda f: "precision.schedule cannot switch a run with " + ", ".join(_schedule_unsupported(f)) + "."),
)
