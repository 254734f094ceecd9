"""The candidates `fp8launch tune` tries: every recipe of every FP8 backend the doctor says runs here (asked
with this spec: launcher/commands/doctor.py `assess_plan`), torchao's tensorwise with and without float8
all-gather where FSDP2 is the engine, compile as the spec has it (toggled too with `--candidates compile`),
plus the bf16 twin, the baseline. MS-AMP's levels are candidates where MS-AMP's own stack runs: elsewhere a
`backend = "msamp"` spec plans as torchao with fp8launch's native levels (launcher/planning/msamp_levels.py),
which are memory and communication settings of a torchao run, not another FP8 backend to time."""

from __future__ import annotations

from launcher.errors import LauncherError, SpecError, UsageError
from launcher.planning import stack
from launcher.planning.read import recipes

BASELINE = "bf16"


def candidate_overrides(spec_plan, runs_here, toggle_compile: bool = False) -> list[tuple[str, list[str]]]:
    """(label, overrides) of every FP8 candidate for `spec_plan`; `runs_here(overrides)` answers the doctor's question."""
    out: list[tuple[str, list[str]]] = []
    fsdp2 = spec_plan.distributed.strategy == "fsdp2"
    for recipe in recipes("torchao"):
        base = ['precision.mode="fp8"', 'precision.backend="torchao"', f'precision.torchao.recipe="{recipe}"']
        if recipe == "tensorwise" and fsdp2:
            out.append((f"torchao-{recipe}", base + ["precision.torchao.fsdp_float8_all_gather=false"]))
            out.append((f"torchao-{recipe}-fp8-allgather", base + ["precision.torchao.fsdp_float8_all_gather=true"]))
        else:
            out.append((f"torchao-{recipe}", base + ["precision.torchao.fsdp_float8_all_gather=false"]))
    for recipe in recipes("te"):
        out.append((f"te-{recipe}", ['precision.mode="fp8"', 'precision.backend="te"', f'precision.te.recipe="{recipe}"']))
    for level in recipes("msamp") if stack.msamp_runs(spec_plan.distributed.strategy) else ():  # else torchao's levels: not a backend
        out.append((f"msamp-{level}", ['precision.mode="fp8"', 'precision.backend="msamp"', f'precision.msamp.opt_level="{level}"']))
    if toggle_compile:
        flip = not spec_plan.compile.enabled
        out += [(f"{label}{'+compile' if flip else '-compile'}", sets + [f"compile.enabled={str(flip).lower()}"]) for label, sets in out]
    return [(label, sets) for label, sets in out if runs_here(sets)]


def select(available: list[tuple[str, list[str]]], wanted: list[str]) -> list[tuple[str, list[str]]]:
    """The candidates `--candidates` names (all when it names none); an unknown name is a usage error."""
    names = [w for w in wanted if w not in ("all", "compile")]
    if not names:
        return available
    known = {label: sets for label, sets in available}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--candidates: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a candidate here; "
                         f"candidates that run on this machine: {', '.join(known) or '(none)'} (and 'compile' to toggle compile)")
    return [(n, known[n]) for n in names]


MACHINE_RULES = frozenset({"CPU-BACKEND", "FP8-HARDWARE", "TE-RECIPE-HARDWARE", "BACKEND-MISSING", "MOE-ROWWISE-CPU",
                           "MOE-ROWWISE-HARDWARE"})
"""Error rules that say this machine cannot run a candidate, rather than that the combination is invalid."""


def doctor_says(spec: str, overrides: list[str]):
    """`runs_here(sets)`: whether the doctor says the spec with these --set overrides runs on this machine."""
    from launcher.commands.doctor import assess_plan, gather
    from launcher.commands.run import plan_for_run

    machine = gather()

    def runs_here(sets: list[str]) -> bool:
        try:
            return assess_plan(machine, plan_for_run(spec, overrides + sets).plan).supported
        except SpecError as e:
            # A rule about this machine (TE or MS-AMP on a CPU, ...) means the doctor's "no"; another error rule is
            # an invalid combination: kept, and reported as skipped with the rule.
            return not any(p.rule in MACHINE_RULES for p in e.problems)
        except LauncherError:
            return True

    return runs_here
