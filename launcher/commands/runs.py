"""Training runs that bench and tune start and read back: one variant of a spec (its --set overrides), planned
into a run folder, trained through `fp8launch run`'s own launch (torchrun) with its output in train.log while
the progress shows here, then its metrics.jsonl turned into figures.

    v = Variant("spec", "spec.toml", ["train.steps=20"])
    run = train(v, "out/spec-1", steps=None, warmup=2, echo=print)   # {"dir", "exit_code", "figures", ...}
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from launcher.commands.plan import Planned
from launcher.commands.run import execute, launch_command, plan_for_run, write_plan
from launcher.targets.runlock import hold
from launcher.train.metrics import read_records

PROGRESS_EVERY_S = 5.0
"""At most one progress line per run this often (the last step is always shown)."""

FIGURES = ("tokens_per_s", "step_time_s", "tflops_per_device", "mfu", "peak_mem_gib", "final_loss", "eval_loss",
           "optimizer_state_bytes", "grad_comm_bytes")
"""optimizer_state_bytes: rank 0's at the last step; grad_comm_bytes: what rank 0 sent for gradient reduction, the
median over the steady steps (precision.optimizer_states / grad_reduce compared by bench)."""


@dataclass
class Variant:
    label: str
    spec: str
    overrides: list[str]
    runs: list[dict] = field(default_factory=list)
    """One entry per run: {"dir", "exit_code", "steps": [step records], "start": start record, "figures": {...}}."""

    def figure(self, name: str) -> float | None:
        values = [r["figures"][name] for r in self.runs if r["figures"].get(name) is not None]
        return statistics.median(values) if values else None


def plan_variant(v: Variant, run_dir: str | None, steps: int | None) -> Planned:
    """The variant planned for a measured run in `run_dir` (None: planning only): every step logged, no
    checkpoint, never resuming, no experiment tracker ([log]: each trial would become a tracked run of its own;
    bench.json / tune.json hold what they measure)."""
    sets = list(v.overrides) + ["train.log_every=1", "train.resume=never", "train.checkpoint_at_end=false", "train.checkpoint_every=0",
                                "log.tensorboard=false", "log.wandb=false", "log.mlflow=false"]
    if steps:
        sets.append(f"train.steps={steps}")
    if run_dir is not None:
        sets.append(f"train.output_dir={run_dir}")
    return plan_for_run(v.spec, sets)


def train(planned: Planned, run_dir: str, *, label: str, echo: Callable[[str], None], profile: tuple[int, int] | None = None) -> int:
    """Write the plan, train it with its output in `run_dir`/train.log, and show its progress through `echo`
    (step i/N, tokens/s, time left); returns the training's exit code. `profile` = (steps, warmup): profile those
    steps (launcher/train/profiling.py writes `run_dir`/profile.json). The run holds `run_dir` as `fp8launch run`
    holds its folder (exit 3 where another run does)."""
    command = launch_command(planned)
    if profile is not None:
        from launcher.commands.run import profiled

        command = profiled(command, planned.plan, *profile)
    with hold(run_dir) as lock:
        write_plan(planned)
        total = planned.plan.train.steps
        done = threading.Event()
        watcher = threading.Thread(target=_progress, args=(os.path.join(run_dir, "metrics.jsonl"), total, label, echo, done), daemon=True)
        watcher.start()
        try:
            return execute(command, log=os.path.join(run_dir, "train.log"), lock=lock)
        finally:
            done.set()
            watcher.join()


def _progress(path: str, total: int, label: str, echo: Callable[[str], None], done: threading.Event) -> None:
    seen, shown_at, times = 0, float("-inf"), []  # the first step shows at once (monotonic time may start near 0)
    while True:
        finished = done.wait(0.5)
        steps = [r for r in _records(path) if r.get("event") == "step"]
        for r in steps[seen:]:
            times.append(r["step_time_s"])
            now = time.monotonic()
            if now - shown_at >= PROGRESS_EVERY_S or r["step"] >= total:
                left = (total - r["step"]) * statistics.median(times[-10:])
                echo(f"  {label}: step {r['step']}/{total}, {r['tokens_per_s']:,.0f} tokens/s, {left:.0f} s left")
                shown_at = now
        seen = len(steps)
        if finished:
            return


def _records(path: str) -> list[dict]:
    """The records of a metrics.jsonl being written: its lines that are not records (the last one while rank 0 writes it,
    one a killed run cut short) are skipped."""
    try:
        return read_records(path)[0]
    except OSError:
        return []


def read_run(run_dir: str, code: int, warmup: int, until: int | None = None) -> dict:
    """A finished run's figures: medians over its steady steps (the first `warmup` left out, and those after step
    `until` where given: a run that profiles its last steps), peak memory, final loss, the last held-out eval loss
    where the spec has [eval], and why its profile failed where it did (profile_error)."""
    records = _records(os.path.join(run_dir, "metrics.jsonl"))
    steps = [r for r in records if r.get("event") == "step"]
    start = next((r for r in records if r.get("event") == "start"), {})
    end = next((r for r in records if r.get("event") == "end"), {})
    steady = steps[warmup:] if len(steps) > warmup else steps[-1:]
    if until is not None:
        steady = [r for r in steady if r.get("step", 0) <= until]
    figures = {}
    for name in ("tokens_per_s", "step_time_s", "tflops_per_device", "mfu"):
        values = [r[name] for r in steady if r.get(name) is not None]
        figures[name] = statistics.median(values) if values else None
    figures["optimizer_state_bytes"] = next(
        (r["optimizer_state_bytes"] for r in reversed(steps) if r.get("optimizer_state_bytes") is not None), None)
    sent = [r["grad_comm_bytes"] for r in steady if r.get("grad_comm_bytes") is not None]
    figures["grad_comm_bytes"] = statistics.median(sent) if sent else None
    figures["peak_mem_gib"] = max((r["peak_mem_gib"] for r in steps if r.get("peak_mem_gib") is not None), default=None)
    figures["final_loss"] = steps[-1]["loss"] if steps else None
    evals = {r["step"]: r["eval_loss"] for r in records if r.get("event") == "eval" and r.get("eval_loss") is not None}
    figures["eval_loss"] = evals[max(evals)] if evals else None  # the held-out loss after the last step ([eval])
    return {"dir": run_dir, "exit_code": code, "start": start, "figures": figures,
            "losses": [[r["step"], r["loss"]] for r in steps], "evals": [[s, evals[s]] for s in sorted(evals)],
            "step_times": [r["step_time_s"] for r in steps], "profile_error": end.get("profile_error")}


def versions(*packages: str) -> dict[str, str | None]:
    """The installed version of each package (None where it is not installed)."""
    from importlib import metadata

    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
