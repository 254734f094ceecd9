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
import math
import os
import shutil
import statistics
from dataclasses import dataclass, field

from launcher.commands import run as launch
from launcher.commands.bench import Variant, _plan, _read_run, _versions
from launcher.errors import EXIT_INTERRUPTED, LauncherError, SpecError, UsageError
from launcher.commands.run import execute, launch_command, write_plan
from launcher.planning.install import INSTALL
from launcher.planning.read import apply_overrides, read_spec, recipes
from launcher.targets.files import save_atomic, write_atomic
from launcher.targets.toml_text import toml_text

DEFAULT_MAX_LOSS_GAP = 0.02
"""Reject a candidate whose loss is on average more than 2% above bf16's over the same steps."""

BASELINE = "bf16"


class TuneInterrupted(LauncherError):
    """Ctrl-C during `tune`: what was measured is written; the exit code says it was cut short."""

    exit_code = EXIT_INTERRUPTED


@dataclass
class Candidate:
    label: str
    overrides: list[str]
    """Spec keys this candidate sets (on top of the user's --set)."""
    variant: Variant
    status: str = "pending"
    """pending | measured | rejected | failed | skipped | interrupted | winner | baseline"""
    note: str = ""
    losses: list[list[float]] = field(default_factory=list)


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
    for level in recipes("msamp"):
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


def run_tune(spec: str, *, steps: int | None = None, candidates: list[str] = (), out_dir: str | None = None, repeats: int = 2,
             warmup: int = 2, max_loss_gap: float = DEFAULT_MAX_LOSS_GAP, overrides: list[str] = (), echo=print,
             runs_here=None) -> dict:
    """Measure every candidate and the bf16 twin; write tune.json, the tuned spec (and return the record)."""
    overrides = list(overrides)
    probe = _plan(Variant("probe", spec, overrides), "probe", out_dir, steps)
    if runs_here is None:
        runs_here = _doctor(spec, overrides)
    wanted = [w.strip() for item in candidates for w in item.split(",") if w.strip()]
    chosen = select(candidate_overrides(probe.plan, runs_here, "compile" in wanted), wanted)
    if not chosen:
        raise UsageError("tune: no FP8 recipe runs on this machine (see `fp8launch doctor`)")
    out_dir = out_dir or os.path.join(os.path.dirname(probe.plan.train.output_dir.rstrip("/")) or ".", f"{probe.plan.name}-tune")
    runs = [Candidate(BASELINE, ['precision.mode="bf16"'], Variant(BASELINE, spec, overrides + ['precision.mode="bf16"']), status="baseline")]
    runs += [Candidate(label, sets, Variant(label, spec, overrides + sets)) for label, sets in chosen]
    run_dirs = {c.label: [os.path.join(out_dir, "runs", f"{c.label}-{i + 1}") for i in range(repeats)] for c in runs}
    _claim(out_dir, [d for ds in run_dirs.values() for d in ds])

    for c in runs[1:]:  # an invalid combination (e.g. FP8-DDP-COMPILE) is reported, not run
        try:
            _plan(c.variant, run_dirs[c.label][0], out_dir, steps)
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
                planned = _plan(c.variant, run_dir, out_dir, steps)
                write_plan(planned)
                echo(f"tune: {c.label} run {i + 1}/{repeats} -> {run_dir}/train.log")
                seen = len(launch.INTERRUPTS)
                code = execute(launch_command(planned), log=os.path.join(run_dir, "train.log"))
                stopped = len(launch.INTERRUPTS) > seen
                if code == 0 or not stopped:  # a run that finished before Ctrl-C counts
                    c.variant.runs.append(_read_run(run_dir, code, warmup))
                if stopped:
                    raise KeyboardInterrupt
                if code != 0:
                    c.status, c.note = "failed", f"exit code {code}; see {run_dir}/train.log"
                    if c.label == BASELINE:
                        raise UsageError(f"tune: the bf16 baseline run exited with code {code}; see {run_dir}/train.log")
    except KeyboardInterrupt:
        interrupted = True
        echo("tune: interrupted; writing what was measured")
    record = _record(probe.plan.name, runs, max_loss_gap=max_loss_gap, warmup=warmup, repeats=repeats, steps=steps,
                     interrupted=interrupted, user_overrides=overrides)
    os.makedirs(out_dir, exist_ok=True)
    if record["winner"] and not interrupted:
        tuned = os.path.join(out_dir, f"{probe.plan.name}-tuned.toml")
        write_atomic(tuned, tuned_spec(spec, overrides, record))
        record["tuned_spec"] = os.path.basename(tuned)
    write_atomic(os.path.join(out_dir, "tune.json"), json.dumps(record, indent=2, sort_keys=True) + "\n")
    record["out_dir"] = out_dir
    if interrupted:
        raise TuneInterrupted(f"tune interrupted; what was measured is in {os.path.join(out_dir, 'tune.json')}")
    return record


MACHINE_RULES = frozenset({"CPU-BACKEND", "FP8-HARDWARE", "TE-RECIPE-HARDWARE", "BACKEND-MISSING"})
"""Error rules that say this machine cannot run a candidate, rather than that the combination is invalid."""


def _doctor(spec: str, overrides: list[str]):
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
    foreign = [d for d in run_dirs if os.path.exists(d) and os.path.normpath(d) not in previous]
    if foreign:
        raise UsageError(f"--out {out_dir}: {foreign[0]} exists and was not written by an earlier tune; "
                         "fix: choose another --out, or move it away")
    for d in run_dirs:
        if os.path.exists(d):
            shutil.rmtree(d)


def _median_losses(variant: Variant) -> dict[int, float]:
    by_step: dict[int, list[float]] = {}
    for run in variant.runs:
        if run["exit_code"] == 0:
            for step, loss in run["losses"]:
                by_step.setdefault(step, []).append(loss)
    return {s: statistics.median(v) for s, v in sorted(by_step.items())}


def loss_gap(candidate: dict[int, float], baseline: dict[int, float]) -> float | None:
    """Mean over the common steps of (loss - bf16 loss) / bf16 loss; positive = worse than bf16."""
    steps = [s for s in candidate if s in baseline and baseline[s]]
    finite = [s for s in steps if math.isfinite(candidate[s])]
    if not steps:
        return None
    if len(finite) < len(steps):
        return math.inf
    return statistics.fmean((candidate[s] - baseline[s]) / baseline[s] for s in steps)


def _record(name: str, runs: list[Candidate], *, max_loss_gap: float, warmup: int, repeats: int, steps: int | None,
            interrupted: bool, user_overrides: list[str]) -> dict:
    base = runs[0]
    base_losses = _median_losses(base.variant)
    base_tps = base.variant.figure("tokens_per_s")
    rows = []
    for c in runs:
        ok_runs = [r for r in c.variant.runs if r["exit_code"] == 0]
        if c.status == "pending":
            c.status = "measured" if ok_runs else ("interrupted" if interrupted else "failed")
        losses = _median_losses(c.variant)
        gap = 0.0 if c is base else loss_gap(losses, base_losses)
        if c.status == "measured" and gap is not None and gap > max_loss_gap:
            c.status, c.note = "rejected", f"loss gap {gap:+.2%} > {max_loss_gap:.2%}"
        tps = statistics.median([r["figures"]["tokens_per_s"] for r in ok_runs if r["figures"]["tokens_per_s"] is not None]) if any(
            r["figures"]["tokens_per_s"] is not None for r in ok_runs) else None
        start = c.variant.runs[0]["start"] if c.variant.runs else {}
        rows.append({
            "name": c.label, "status": c.status, "note": c.note, "overrides": c.overrides,
            "precision": start.get("precision"), "fp8_layers": start.get("fp8_layers"), "total_linear": start.get("total_linear"),
            "tokens_per_s": tps, "step_time_s": c.variant.figure("step_time_s") if ok_runs else None,
            "peak_mem_gib": c.variant.figure("peak_mem_gib") if ok_runs else None,
            "final_loss": c.variant.figure("final_loss") if ok_runs else None,
            "loss_gap": gap if gap is None or math.isfinite(gap) else "inf",
            "vs_bf16": (tps / base_tps) if tps is not None and base_tps else None,
            "losses": [[s, v] for s, v in losses.items()],
            "runs": [{"dir": os.path.relpath(r["dir"], os.path.dirname(os.path.dirname(r["dir"]))), "exit_code": r["exit_code"],
                      "figures": r["figures"]} for r in c.variant.runs],
            "run_dirs": [os.path.join("runs", os.path.basename(r["dir"])) for r in c.variant.runs],
        })
    ranked = sorted((r for r in rows if r["status"] in ("measured", "baseline") and r["tokens_per_s"] is not None),
                    key=lambda r: -r["tokens_per_s"])
    for i, r in enumerate(ranked):
        r["rank"] = i + 1
    winner = ranked[0]["name"] if ranked and not interrupted else None
    for r in rows:
        if r["name"] == winner and r["status"] == "measured":
            r["status"] = "winner"
    start = next((c.variant.runs[0]["start"] for c in runs if c.variant.runs), {})
    return {"name": name, "candidates": rows, "winner": winner, "ranking": [r["name"] for r in ranked],
            "max_loss_gap": max_loss_gap, "warmup_steps_excluded": warmup, "repeats": repeats, "steps": steps,
            "interrupted": interrupted, "overrides": user_overrides,
            "environment": {"device_name": start.get("device_name"), "world_size": start.get("world_size"), "torch": start.get("torch_version"),
                            **_versions("torchao", "transformer_engine", "deepspeed", "fp8launch")}}


# --- the winner as a spec -----------------------------------------------------------------------------


def tuned_spec(spec: str, user_overrides: list[str], record: dict) -> str:
    """The spec with the winner's keys (and the user's --set) applied, renamed <name>-tuned, with a header saying why."""
    rows = {r["name"]: r for r in record["candidates"]}
    win = rows[record["winner"]]
    source = apply_overrides(read_spec(spec), list(user_overrides) + list(win["overrides"]))
    data = json.loads(json.dumps(source.data))
    data["name"] = f"{record['name'][:58]}-tuned"
    precision = data.get("precision", {})
    used = precision.get("backend", "torchao") if precision.get("mode") == "fp8" else None
    for section in ("torchao", "te", "msamp"):  # a section the winner never reads would only warn (SECTION-UNUSED)
        if section != used:
            precision.pop(section, None)
    env = record["environment"]
    header = [f"Chosen by `fp8launch tune {os.path.basename(spec)}` on {env.get('device_name')} x {env.get('world_size')}: "
              f"{win['name']} at {_tps(win)} tokens/s ({_ratio(win)} bf16), loss gap {_gap(win)} "
              f"(median of {record['repeats']} alternating runs of {record['steps'] or 'train.steps'} steps each).",
              "Chosen over:"]
    for other in record["candidates"]:
        if other["name"] == win["name"]:
            continue
        if other["status"] in ("measured", "baseline"):
            slower = 1 - other["tokens_per_s"] / win["tokens_per_s"] if win["tokens_per_s"] else 0
            header.append(f"  {other['name']}: {_tps(other)} tokens/s, {slower:.1%} slower ({_ratio(other)} bf16), loss gap {_gap(other)}")
        else:
            header.append(f"  {other['name']}: {other['status']}{': ' + other['note'] if other['note'] else ''}")
    return "".join(f"# {line}\n" for line in header) + "\n" + toml_text(data)


def _tps(row: dict) -> str:
    return "n/a" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:,.0f}"


def _ratio(row: dict) -> str:
    return "n/a" if row["vs_bf16"] is None else f"{row['vs_bf16']:.3f}x"


def _gap(row: dict) -> str:
    g = row["loss_gap"]
    return "n/a" if g is None else ("inf" if g == "inf" else f"{g:+.2%}")


# --- what a person reads --------------------------------------------------------------------------------


def table(record: dict) -> str:
    lines = [f"{'rank':>4}  {'candidate':<34} {'status':<11} {'tokens/s':>10} {'vs bf16':>8} {'peak GiB':>9} {'loss gap':>9}"]
    for r in sorted(record["candidates"], key=lambda r: r.get("rank", 10**6)):
        mem = "n/a" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.2f}"
        lines.append(f"{r.get('rank', '-'):>4}  {r['name']:<34} {r['status']:<11} {_tps(r):>10} {_ratio(r):>8} {mem:>9} {_gap(r):>9}"
                     + (f"  {r['note']}" if r["note"] else ""))
    env = record["environment"]
    lines.append(f"(medians over {record['repeats']} alternating runs each; first {record['warmup_steps_excluded']} steps of each run "
                 f"excluded; rejected when the loss gap to bf16 exceeds {record['max_loss_gap']:.1%}; {env.get('device_name')} x "
                 f"{env.get('world_size')}, torch {env.get('torch')}, torchao {env.get('torchao')})")
    lines.append(f"winner: {record['winner']}" if record["winner"] else "winner: none (interrupted or nothing measured)")
    return "\n".join(lines)


def plot(record: dict, path: str) -> str:
    """tokens/s bars (winner highlighted, rejected hatched) and each candidate's loss curve, as a PNG."""
    try:
        import matplotlib
    except ImportError as e:
        raise UsageError(f"the plot needs matplotlib: {INSTALL['matplotlib']}") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in record["candidates"] if r["tokens_per_s"] is not None]
    colors = {"winner": "tab:green", "baseline": "tab:blue", "measured": "tab:gray", "rejected": "tab:red"}
    fig, (ax_tps, ax_loss) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.1, 1]})
    names = [r["name"] for r in rows]
    values = [r["tokens_per_s"] for r in rows]
    bars = ax_tps.barh(names, values, color=[colors.get(r["status"], "tab:gray") for r in rows],
                       hatch=None)
    for bar, r in zip(bars, rows):
        if r["status"] == "rejected":
            bar.set_hatch("//")
        label = f"{r['tokens_per_s']:,.0f}" + (f"  ({r['vs_bf16']:.2f}x)" if r["vs_bf16"] else "") + ("  rejected" if r["status"] == "rejected" else "")
        ax_tps.annotate(label, (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=8)
    ax_tps.invert_yaxis()
    ax_tps.set_xlim(0, max(values, default=1) * 1.35)
    ax_tps.set_xlabel("tokens/s (median)")
    ax_tps.set_title(f"throughput; winner: {record['winner']}")
    others = iter(["tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"] * 4)
    for r in record["candidates"]:
        if r["losses"]:
            steps, losses = zip(*r["losses"])
            ax_loss.plot(steps, losses, label=f"{r['name']} ({r['status']})",
                         color=colors[r["status"]] if r["status"] in ("winner", "baseline") else next(others),
                         linewidth=2.2 if r["status"] in ("winner", "baseline") else 1.0,
                         linestyle="--" if r["status"] == "rejected" else "-")
    ax_loss.xaxis.get_major_locator().set_params(integer=True)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (median over runs)")
    ax_loss.set_title(f"loss; rejected above a {record['max_loss_gap']:.1%} gap to bf16")
    ax_loss.legend(fontsize=7)
    fig.tight_layout()
    save_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    return path
