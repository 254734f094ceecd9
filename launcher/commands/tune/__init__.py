"""`fp8launch tune`: try every FP8 recipe that runs on this machine against the spec's bf16 twin,
with real runs, and write the winner as a spec.

Candidates: every recipe of every FP8 backend the doctor says runs here (launcher/commands/doctor.py
`assess_plan`, asked with this spec), torchao's tensorwise with and without float8 all-gather
where FSDP2 is the engine, compile as the spec has it (toggled too with `--candidates compile`);
plus the bf16 twin, the baseline. Each is a real `fp8launch run` through bench's machinery
(launcher/commands/bench.py: same data, same seed, same steps), all of them one after the other and the
whole round repeated, so that drift in the machine's load hits every candidate alike.

Per candidate: tokens/s (median over runs of each run's steady-state median), peak memory and
the loss gap to bf16: the mean over the steps of (loss - bf16 loss) / bf16 loss, each step's
loss the median over runs. A candidate whose gap exceeds `max_loss_gap` is rejected; the rest,
bf16 included, are ranked by tokens/s and the fastest wins. Ctrl-C stops after the current run
and keeps what was measured (exit 130).

Writes into DIR: runs/<candidate>-<i>/ (each run's plan, train.log, metrics.jsonl), tune.json,
tune.png and <name>-tuned.toml. It deletes nothing it did not write (run folders of an earlier
tune, listed in its tune.json, are replaced).
"""

from __future__ import annotations

import json
import os
import shutil

from launcher.commands import preflight
from launcher.commands import run as launch
from launcher.commands.runs import Variant, plan_variant, read_run, train
from launcher.commands.tune.candidates import BASELINE, candidate_overrides, doctor_says, select
from launcher.commands.tune.record import DEFAULT_MAX_LOSS_GAP, Candidate, tune_record, tuned_spec
from launcher.errors import EXIT_INTERRUPTED, EnvironmentProblem, LauncherError, TrainingFailed, UsageError
from launcher.targets.files import make_folder, write_atomic
from launcher.targets.runlock import hold


class TuneInterrupted(LauncherError):
    """Ctrl-C during `tune`: what was measured is written (in `out_dir`); the exit code says it was cut short."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, out_dir: str):
        super().__init__(message)
        self.out_dir = out_dir


def run_tune(spec: str, *, steps: int | None = None, candidates: list[str] = (), out_dir: str | None = None, repeats: int = 2,
             warmup: int = 2, max_loss_gap: float = DEFAULT_MAX_LOSS_GAP, overrides: list[str] = (), echo=print,
             runs_here=None) -> dict:
    """Measure every candidate and the bf16 twin; write tune.json, the tuned spec (and return the record). The tune
    holds `out_dir` for its whole life, as a run holds its folder (exit 3 at once where another tune or run does)."""
    overrides = list(overrides)
    probe = plan_variant(Variant("probe", spec, overrides), None, steps)
    preflight.check(probe.plan, local=True)  # as bench and run do: one line, exit 3, before any run
    out_dir = out_dir or os.path.join(os.path.dirname(probe.plan.train.output_dir.rstrip("/")) or ".", f"{probe.plan.name}-tune")
    with hold(out_dir, key="tune --out", elsewhere="name another --out", make=make_folder):
        return _tune(spec, probe, out_dir, steps=steps, candidates=candidates, repeats=repeats, warmup=warmup,
                     max_loss_gap=max_loss_gap, overrides=overrides, echo=echo, runs_here=runs_here)


def _tune(spec: str, probe, out_dir: str, *, steps: int | None, candidates: list[str], repeats: int, warmup: int,
          max_loss_gap: float, overrides: list[str], echo, runs_here) -> dict:
    if runs_here is None:
        runs_here = doctor_says(spec, overrides)
    wanted = [w.strip() for item in candidates for w in item.split(",") if w.strip()]
    chosen = select(candidate_overrides(probe.plan, runs_here, "compile" in wanted), wanted)
    if not chosen:
        raise EnvironmentProblem("tune: no FP8 recipe runs on this machine (`fp8launch doctor` says why); fix: run tune where an "
                                 "FP8 backend runs, or name the candidates to try with --candidates")
    bf16 = ['precision.mode="bf16"']
    runs = [Candidate(BASELINE, bf16, Variant(BASELINE, spec, overrides + bf16), status="baseline")]
    runs += [Candidate(label, sets, Variant(label, spec, overrides + sets)) for label, sets in chosen]
    run_dirs = {c.label: [os.path.join(out_dir, "runs", f"{c.label}-{i + 1}") for i in range(repeats)] for c in runs}
    _claim(out_dir, [d for ds in run_dirs.values() for d in ds])

    for c in runs[1:]:  # an invalid combination (e.g. FP8-DDP-COMPILE) is reported, not run
        try:
            plan_variant(c.variant, run_dirs[c.label][0], steps)
        except LauncherError as e:
            c.status, c.note = "skipped", str(e).strip().splitlines()[0]
    live = [c for c in runs if c.status in ("baseline", "pending")]
    interrupted = False
    try:
        for i in range(repeats):
            for c in live:
                if c.status == "failed":
                    continue
                run_dir = run_dirs[c.label][i]
                planned = plan_variant(c.variant, run_dir, steps)
                echo(f"tune: {c.label} run {i + 1}/{repeats} -> {run_dir}/train.log")
                seen = len(launch.INTERRUPTS)
                code = train(planned, run_dir, label=f"{c.label} run {i + 1}", echo=echo)
                stopped = len(launch.INTERRUPTS) > seen
                if code == 0 or not stopped:  # a run that finished before Ctrl-C counts
                    c.variant.runs.append(read_run(run_dir, code, warmup))
                if stopped:
                    raise KeyboardInterrupt
                if code != 0:
                    c.status, c.note = "failed", f"exit code {code}; see {run_dir}/train.log"
                    if c.label == BASELINE:
                        raise TrainingFailed(f"tune: the bf16 baseline run exited with code {code}; see {run_dir}/train.log", code)
    except KeyboardInterrupt:
        interrupted = True
        echo("tune: interrupted; writing what was measured")
    record = tune_record(probe.plan.name, runs, max_loss_gap=max_loss_gap, warmup=warmup, repeats=repeats, steps=steps,
                     interrupted=interrupted, user_overrides=overrides)
    os.makedirs(out_dir, exist_ok=True)
    if record["winner"] and not interrupted:
        tuned = os.path.join(out_dir, f"{probe.plan.name}-tuned.toml")
        write_atomic(tuned, tuned_spec(spec, overrides, record))
        record["tuned_spec"] = os.path.basename(tuned)
    write_atomic(os.path.join(out_dir, "tune.json"), json.dumps(record, indent=2, sort_keys=True) + "\n")
    record["out_dir"] = out_dir
    if interrupted:
        raise TuneInterrupted(f"tune interrupted; what was measured is in {os.path.join(out_dir, 'tune.json')}", out_dir)
    return record


def _claim(out_dir: str, run_dirs: list[str]) -> None:
    """Make room for this tune's run folders: replace those an earlier tune wrote (listed in its tune.json);
    refuse to touch anything else."""
    previous = set()
    try:
        with open(os.path.join(out_dir, "tune.json"), encoding="utf-8") as f:
            for c in json.load(f).get("candidates", []):
                previous.update(os.path.normpath(os.path.join(out_dir, r)) for r in c.get("run_dirs", []))
    except (OSError, ValueError, AttributeError):
        pass
    links = [p for p in {os.path.dirname(d) for d in run_dirs} | set(run_dirs) if os.path.islink(p)]
    if links:
        raise UsageError(f"--out {out_dir}: {sorted(links)[0]} is a symbolic link, and tune writes into no folder through a link; "
                         "fix: remove the link, or choose another --out")
    foreign = [d for d in run_dirs if os.path.lexists(d) and os.path.normpath(d) not in previous]
    if foreign:
        raise UsageError(f"--out {out_dir}: {foreign[0]} exists and was not written by an earlier tune; "
                         "fix: choose another --out, or move it away")
    make_folder(out_dir, "--out")
    for d in run_dirs:
        if os.path.exists(d):
            shutil.rmtree(d)
