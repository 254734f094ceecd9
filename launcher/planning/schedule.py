"""Precision phases (`[[precision.schedule]]`): which precision trains which steps. Torch-free: the run and
the planner ask the same function.

    for phase in phases(plan):               # phase 0 is the spec's precision, from step 1
        phase.first_step, phase.plan.precision
    plan_at(plan, step)                       # the plan whose precision trains `step`
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from launcher.planning.backends import BACKENDS

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan, PrecisionPhase


@dataclass(frozen=True, slots=True)
class Phase:
    index: int
    first_step: int
    """The first step trained in this precision (1 for the spec's own)."""
    plan: Plan
    """The plan with this phase's precision."""


def first_step(entry: PrecisionPhase, steps: int) -> int:
    """`at_step`, or the step after `at_fraction` x train.steps have been trained."""
    return entry.at_step if entry.at_step is not None else int(entry.at_fraction * steps) + 1


def apply(plan: Plan, entry: PrecisionPhase) -> Plan:
    """`plan` with the precision fields `entry` sets."""
    p = plan.precision
    changes: dict[str, typing.Any] = {}
    if entry.mode is not None:
        changes["mode"] = entry.mode
    if entry.keep_last_blocks is not None:
        changes["keep_last_blocks"] = entry.keep_last_blocks
    if entry.rules is not None:
        changes["rules"] = entry.rules
    p = dataclasses.replace(p, **changes)
    if entry.recipe is not None and BACKENDS[p.backend].has_recipes:  # an opt level (MS-AMP) is not a recipe
        p = BACKENDS[p.backend].with_recipe(p, entry.recipe)
    return dataclasses.replace(plan, precision=p)


def phases(plan: Plan) -> list[Phase]:
    """Phase 0 (the spec's precision, from step 1), then one per schedule entry in step order; each entry
    changes the phase before it."""
    out = [Phase(0, 1, plan)]
    entries = sorted(plan.precision.schedule, key=lambda e: first_step(e, plan.train.steps))
    for i, entry in enumerate(entries, 1):
        out.append(Phase(i, first_step(entry, plan.train.steps), apply(out[-1].plan, entry)))
    return out


def plan_at(plan: Plan, step: int) -> Phase:
    """The phase whose precision trains `step`."""
    return [p for p in phases(plan) if p.first_step <= step][-1]
