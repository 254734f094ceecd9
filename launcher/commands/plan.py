"""spec file -> validated -> Plan -> rules -> rendered files. The whole planning pipeline, torch-free."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Callable

from launcher.errors import Problem, SpecError
from launcher.planning.plan import Plan, resolve, spec_dir_from
from launcher.targets.project import relative_to_root
from launcher.planning.predict import Prediction, predict
from launcher.targets.render import render
from launcher.planning.rules import Facts, Finding, check
from launcher.planning.read import apply_overrides, read_spec, validate


@dataclass(frozen=True, slots=True)
class Planned:
    """One spec, planned: its Plan, the files to write into `folder`, and the warnings."""

    spec_path: str
    plan: Plan
    folder: str
    files: dict[str, str]
    warnings: list[Finding]
    prediction: Prediction | None = None
    """The speed prediction on launch.gpu (launcher/planning/predict), made once per plan."""


def plan_one(path: str, out_dir: str, overrides: list[str] = (), strict: bool = False, *,
             folder_of: Callable[[Plan], str] | None = None) -> Planned:
    """Plan one spec into `out_dir/<name>/` (or into `folder_of(plan)`, e.g. a run's own folder);
    raise SpecError with every problem found."""
    source = read_spec(path)
    if overrides:
        source = apply_overrides(source, list(overrides))
    validate(source)
    _check_builtin_model(source)
    plan = resolve(source)
    folder = folder_of(plan) if folder_of else os.path.join(out_dir, plan.name)
    plan = dataclasses.replace(plan, spec_dir=spec_dir_from(path, folder))
    files = render(plan, plan_dir=relative_to_root(folder))
    prediction = predict(plan, os.path.dirname(os.path.abspath(path)))
    findings = check(Facts(plan=plan, rendered=files, prediction=prediction), stage="plan")
    errors = [f for f in findings if f.is_error or strict]
    warnings = [f for f in findings if f not in errors]
    if errors:
        raise SpecError([Problem(path, _finding_text(f), rule=f.rule.id) for f in errors]
                        + [Problem(path, _finding_text(f), rule=f.rule.id, severity="warning") for f in warnings])
    return Planned(path, plan, folder, files, warnings, prediction)


def _check_builtin_model(source) -> None:
    """A builtin model name is known without torch: catch a typo at plan time, with did-you-mean."""
    from launcher.errors import InputError
    from launcher.planning.models import parse_builtin

    model = source.data.get("train", {}).get("model", "")
    if model.startswith("builtin:"):
        try:
            parse_builtin(model)
        except InputError as e:
            line = source.line(("train", "model"))
            raise SpecError([Problem(source.path, f"{e.detail}; fix: {e.fix}", path="$.train.model", line=line)]) from None


def _finding_text(f: Finding) -> str:
    return f"{f.message} fix: {f.rule.fix}"


def warning_lines(planned: Planned) -> list[str]:
    return [str(Problem(planned.spec_path, _finding_text(f), rule=f.rule.id, severity="warning")) for f in planned.warnings]


def plan_many(paths: list[str], out_dir: str, overrides: list[str] = (), strict: bool = False) -> list[Planned]:
    """Plan every spec; collect the problems of all of them before raising, so nothing is half-done."""
    results, problems = [], []
    for path in paths:
        try:
            results.append(plan_one(path, out_dir, overrides, strict))
        except SpecError as e:
            problems.extend(e.problems)
    seen: dict[str, str] = {}
    for r in results:
        if r.plan.name in seen:
            problems.append(Problem(r.spec_path, f"name {r.plan.name!r} is also the name of {seen[r.plan.name]}; both would write {r.folder}/: give each spec its own name", path="$.name"))
        seen.setdefault(r.plan.name, r.spec_path)
    if problems:
        raise SpecError(problems)
    return results
