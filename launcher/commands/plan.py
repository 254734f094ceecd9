"""spec file -> validated -> Plan -> rules -> rendered files. The whole planning pipeline, torch-free."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Callable

from launcher.errors import Problem, SpecError
from launcher.planning.plan import Plan, resolve, spec_dir_from
from launcher.planning.predict import Prediction, predict
from launcher.planning.read import apply_overrides, check_builtin_model, read_spec, validate
from launcher.planning.rules import Facts, Finding, check
from launcher.targets.project import relative_to_root
from launcher.targets.render import render


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
    check_builtin_model(source)
    plan = resolve(source)
    folder = folder_of(plan) if folder_of else os.path.join(out_dir, plan.name)
    plan = dataclasses.replace(plan, spec_dir=spec_dir_from(path, folder))
    files = render(plan, plan_dir=relative_to_root(folder))
    spec_folder = os.path.dirname(os.path.abspath(path))
    prediction = predict(plan, spec_folder)
    findings = check(Facts(plan=plan, rendered=files, prediction=prediction, spec_folder=spec_folder), stage="plan")
    errors = [f for f in findings if f.is_error or strict]
    warnings = [f for f in findings if f not in errors]
    if errors:
        raise SpecError([Problem(path, _finding_text(f), rule=f.rule.id) for f in errors]
                        + [Problem(path, _finding_text(f), rule=f.rule.id, severity="warning") for f in warnings])
    return Planned(path, plan, folder, files, warnings, prediction)


def _finding_text(f: Finding) -> str:
    return f.text


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
            problems.append(Problem(r.spec_path, f"name {r.plan.name!r} is also the name of {seen[r.plan.name]}; "
                                    f"both would write {r.folder}/: give each spec its own name", path="$.name"))
        seen.setdefault(r.plan.name, r.spec_path)
    if problems:
        raise SpecError(problems)
    return results


def plan_record(planned: Planned, changes: list, params: int | None = None) -> dict:
    """What `plan --format json` prints for one spec: the plan, the memory estimate (`total_bytes_per_gpu` is the
    text table's total: model states and activations), the files (a file fp8launch did not write: `why`), the prediction,
    the warnings."""
    from launcher.commands.plan_text import phase_records
    from launcher.planning.init_cost import init_time
    from launcher.planning.memory import estimate, model_config, model_params

    spec_folder = os.path.dirname(os.path.abspath(planned.spec_path))
    n_params = params or model_params(planned.plan.train.model, spec_folder)
    memory = estimate(planned.plan, n_params, spec_folder) if n_params else None
    return {"spec": planned.spec_path, "name": planned.plan.name, "folder": planned.folder, "plan": json.loads(planned.files["plan.json"]),
            "memory": None if memory is None else {
                "params": n_params,
                "total_bytes_per_gpu": int(memory.peak_bytes),
                "model_states_bytes_per_gpu": int(memory.total_bytes),
                "activations_bytes_per_gpu": int(memory.activations.bytes) if memory.activations else None,
                "peak_bytes_per_gpu": int(memory.peak_bytes),
                "init_peak_bytes_per_rank": int(memory.init_peak.bytes) if memory.init_peak else None,
                "rows": [{"name": r.name, "dtype": r.dtype, "bytes_per_gpu": int(r.bytes_per_gpu(n_params)), "shards": r.shards,
                          "offloaded": r.offloaded} for r in memory.rows]},
            "init": init_time(planned.plan, n_params, model_config(planned.plan.train.model, spec_folder)).to_json() if n_params else None,
            "files": [{"path": c.path, "status": c.status, **({"why": c.why} if c.why else {})} for c in changes],
            "prediction": planned.prediction.to_json() if planned.prediction else None,
            "phases": phase_records(planned.plan, params) if planned.plan.precision.schedule else None,
            "warnings": [{"rule": f.rule.id, "message": f.message, "fix": f.fix or f.rule.fix} for f in planned.warnings]}
