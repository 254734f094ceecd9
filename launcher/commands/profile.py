"""What `fp8launch run --profile N` and `bench --profile` say and write of a profile (the training writes each run's
own profile.json; launcher/profiling classifies the trace). Torch-free."""

from __future__ import annotations

import json
import os

from launcher.commands.plan import Planned
from launcher.profiling.parts import PARTS


def read_run(run_dir: str) -> dict | None:
    """A run's profile record (profile.json's "run"), or None when the run wrote none."""
    path = os.path.join(run_dir, "profile.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)["run"]


def run_failure(run_dir: str) -> str | None:
    """Why a run's profiler failed, as its end record in metrics.jsonl keeps it (profile_error); None if it did not."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "end":
            return record.get("profile_error")
    return None


def summary_lines(run_dir: str) -> list[str]:
    """The lines `run --profile` prints: where a step went, and the heaviest items."""
    run = read_run(run_dir)
    if run is None:
        failure = run_failure(run_dir)
        if failure:
            return [f"profile: failed ({failure}); the training went on and its figures stand (metrics.jsonl's end record: profile_error)"]
        return [f"profile: no {os.path.join(run_dir, 'profile.json')} (rank 0 writes it after the profiled steps)"]
    t = run["step_time_s"] or 1.0
    parts = ", ".join(f"{p} {run['parts'][p] / t:.0%}" for p in PARTS if run["parts"][p] / t >= 0.005)
    lines = [f"profile: {run['steps']} steps of {run['step_time_s']:.4f} s: {parts}; FP8 GEMM FLOP share {run['fp8_gemm_flop_share']:.0%}"]
    lines += [f"  {x['s'] / t:6.1%}  {x['name']}" for x in run["top"][:6]]
    lines.append(f"wrote {os.path.join(run_dir, 'profile.json')} (trace: {os.path.join(run_dir, run.get('trace', ''))})")
    return lines


def _plan_facts(planned: Planned) -> dict:
    p = planned.plan
    return {"precision": {"high_precision": p.precision.high_precision,
                          "torchao": {"precompute_scale": p.precision.torchao.precompute_scale}},
            "compile": {"enabled": p.compile.enabled}}


def bench_profile(planned: Planned, spec_dir: str, baseline_dir: str, *, device_name: str | None) -> dict:
    """The spec's first run against the baseline's: launcher/profiling/compare.py's record, with the prediction beside."""
    from launcher.planning.gpus import PLAN_GPUS
    from launcher.profiling.compare import compare

    spec, baseline = read_run(spec_dir), read_run(baseline_dir)
    if spec is None or baseline is None:
        from launcher.errors import LauncherError

        missing = [d for d, run in ((spec_dir, spec), (baseline_dir, baseline)) if run is None]
        raise LauncherError("bench --profile: " + "; ".join(f"{d} has no profile.json ({run_failure(d) or 'see its train.log'})"
                                                             for d in missing))
    prediction = planned.prediction.to_json() if planned.prediction is not None else None
    gpu = PLAN_GPUS.get((prediction or {}).get("gpu", ""), PLAN_GPUS["h100"]).name
    return compare(spec, baseline, device_name=device_name, prediction=prediction, plan_gpu=gpu, plan=_plan_facts(planned))
