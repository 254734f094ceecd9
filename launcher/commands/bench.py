"""`fp8launch bench`: a spec and its baseline twin, trained alternately in one invocation, compared.

Each variant runs `repeats` times, interleaved (A B A B ...) so that drift in the machine's load hits
both alike. A run's figures are medians over its steady steps (the first `warmup` steps, which carry
compilation and allocator warm-up, are left out); a variant's figure is the median over its runs.
Torch-free: the runs are real `fp8launch run` launches (torchrun), read back from metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import shutil

from launcher.commands import preflight
from launcher.commands.plan import Planned
from launcher.commands.runs import FIGURES, Variant, plan_variant, read_run, train, versions
from launcher.errors import LauncherError, TrainingFailed, UsageError
from launcher.planning.gpus import MFU_BASIS, MFU_NOTE
from launcher.planning.install import INSTALL
from launcher.targets.files import make_folder, output_error, save_atomic, write_atomic
from launcher.targets.runlock import LOCK_FILE, hold


def variants(spec: str, vs: str, overrides: list[str]) -> tuple[Variant, Variant]:
    """The spec and its baseline: `vs` is "bf16" (the same spec with precision.mode = bf16) or another spec."""
    if vs in ("bf16", "fp16", "fp32"):
        return Variant("spec", spec, list(overrides)), Variant(vs, spec, list(overrides) + [f"precision.mode={vs}"])
    if not os.path.isfile(vs):
        raise UsageError(f"--vs {vs!r} is neither bf16/fp16/fp32 nor a spec file")
    return Variant("spec", spec, list(overrides)), Variant("baseline", vs, list(overrides))


DEFAULT_MAX_LOSS_GAP = 0.02
"""The gate on the held-out loss: the spec's eval loss at most 2% above its baseline's (as tune's default)."""


def run_bench(spec: str, *, vs: str = "bf16", steps: int | None = None, repeats: int = 2, warmup: int = 2,
              out_dir: str | None = None, overrides: list[str] = (), max_loss_gap: float = DEFAULT_MAX_LOSS_GAP, profile: bool = False,
              profile_last: int = 0, echo=print) -> dict:
    """Train both variants `repeats` times, alternating; return the bench record (also bench.json in out_dir). With
    `profile`, each variant's first run profiles its measured steps (the ones after `warmup`) and the comparison goes
    to profile.json (record["profile"]); where a profiler failed, the runs go on, record["profile"] is None and
    record["profile_error"] says why. With `profile_last` N, each variant's first run profiles its last N steps
    instead, after the steps every run's figures are taken from (record["timed_steps"]): the profiler's own warm-up
    step and the N profiled ones are in no median, so one bench gives unprofiled figures and the profile."""
    a, b = variants(spec, vs, list(overrides))
    first = plan_variant(a, None, steps)
    preflight.check(first.plan, local=True)
    total = first.plan.train.steps
    timed_until = total - profile_last - 1 if profile_last else None  # the step after it is the profiler's warm-up
    if profile_last and timed_until - warmup < 1:
        raise UsageError(f"bench --profile-last {profile_last} leaves no measured step: train.steps = {total} holds the {warmup} "
                         f"warm-up steps, the profiler's own and the {profile_last} profiled; fix: --steps {warmup + profile_last + 2} "
                         "or more")
    profile = profile or bool(profile_last)
    profiled_steps = (profile_last, total - profile_last) if profile_last else (total - warmup, warmup) if profile else None
    if profile and not profile_last and (warmup < 2 or total - warmup < 1):
        raise UsageError(f"bench --profile needs --warmup >= 2 (the first step compiles, the second starts the profiler) and measured "
                         f"steps after it (train.steps = {total}, --warmup {warmup}); fix: --warmup 2 --steps 6 or more")
    out_dir = out_dir or os.path.join(os.path.dirname(first.plan.train.output_dir.rstrip("/")) or ".", f"{first.plan.name}-bench")
    check_out(out_dir)
    with hold(out_dir, key="bench --out", elsewhere="name another --out", make=make_folder):  # exit 3 at once where another holds it
        return _bench(spec, a, b, first, out_dir=out_dir, steps=steps, repeats=repeats, warmup=warmup, max_loss_gap=max_loss_gap,
                      profile=profile, profiled_steps=profiled_steps, timed_until=timed_until, echo=echo)


def _bench(spec: str, a: Variant, b: Variant, first: Planned, *, out_dir: str, steps: int | None, repeats: int, warmup: int,
           max_loss_gap: float, profile: bool, profiled_steps: tuple[int, int] | None, timed_until: int | None, echo) -> dict:
    prepare_out(out_dir, [f"{v.label}-{i + 1}" for i in range(repeats) for v in (a, b)])
    for i in range(repeats):
        for v in (a, b):
            run_dir = os.path.join(out_dir, f"{v.label}-{i + 1}")
            planned = plan_variant(v, run_dir, steps)
            echo(f"bench: {v.label} run {i + 1}/{repeats}: {planned.plan.name} ({_precision(planned)}) -> {run_dir}/train.log")
            code = train(planned, run_dir, label=f"{v.label} run {i + 1}", echo=echo, profile=profiled_steps if i == 0 else None)
            v.runs.append(read_run(run_dir, code, warmup, until=timed_until))
            if code != 0:
                raise TrainingFailed(f"bench: the {v.label} run exited with code {code}; see {run_dir}/train.log", code)
    record = _record(a, b, warmup=warmup, repeats=repeats, max_loss_gap=max_loss_gap)
    if timed_until is not None:
        record["timed_steps"] = [warmup + 1, timed_until]
        record["profile_last"] = profiled_steps[0]
    if profile:
        from launcher.commands.profile import bench_profile

        try:
            record["profile"] = bench_profile(first, os.path.join(out_dir, f"{a.label}-1"), os.path.join(out_dir, f"{b.label}-1"),
                                              device_name=record["environment"]["device_name"])
        except Exception as e:  # noqa: BLE001 -- a profile is a by-product: its failure is recorded, the figures stand
            record["profile"] = None
            record["profile_error"] = e.message if isinstance(e, LauncherError) else f"{type(e).__name__}: {e}"
            echo(f"bench: no profile: {record['profile_error']}; the runs' figures stand (bench.json: profile_error)")
        else:
            write_atomic(os.path.join(out_dir, "profile.json"), json.dumps(record["profile"], indent=2, sort_keys=True) + "\n")
    write_atomic(os.path.join(out_dir, "bench.json"), json.dumps(record, indent=2, sort_keys=True) + "\n")
    record["out_dir"] = out_dir
    return record


MARKER = ".fp8launch-bench"
"""Written first into a bench's --out folder: the entries this bench writes there, one a line."""
OWN_FILES = ("bench.json", "bench.png", "profile.json", "profile.png", MARKER)


def check_out(out_dir: str) -> None:
    """Refuse an `out_dir` that is not a folder, or a non-empty one that no bench wrote (before anything is written)."""
    if os.path.isdir(out_dir) and set(os.listdir(out_dir)) - {LOCK_FILE} and not os.path.isfile(os.path.join(out_dir, MARKER)):
        raise UsageError(f"bench --out {out_dir}: the folder is not empty and is not a bench's output, and bench "
                         "writes its runs there; fix: name a new or empty folder")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"bench --out {out_dir}: exists and is not a folder; fix: name a new or empty folder")


def prepare_out(out_dir: str, run_dirs: list[str]) -> None:
    """Make `out_dir` ready for a bench writing `run_dirs` (+ bench.json, bench.png) into it. A new or empty
    folder is used as it is; a previous bench's folder loses only what that bench wrote (its marker lists it);
    any other non-empty folder is refused: bench never deletes a file it did not write. The lock file
    (launcher/targets/runlock.py) is the lock's, never a bench's."""
    check_out(out_dir)
    marker = os.path.join(out_dir, MARKER)
    if os.path.isdir(out_dir) and set(os.listdir(out_dir)) - {LOCK_FILE}:
        with open(marker, encoding="utf-8") as f:
            previous = [line.strip() for line in f if line.strip()]
        for name in previous:
            path = os.path.join(out_dir, name)
            if os.path.basename(name) != name or name in ("", ".", "..", LOCK_FILE):
                continue  # a marker edited to name something outside the folder (or the lock): ignore that line
            if os.path.isdir(path) and not os.path.islink(path):
                with hold(path, key="bench --out", elsewhere="name another --out"):  # a run in it now: refused, not deleted
                    shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
    make_folder(out_dir, "--out")
    try:
        write_atomic(marker, "".join(f"{name}\n" for name in [*run_dirs, *OWN_FILES]))
    except OSError as e:
        raise output_error(out_dir, e, "--out", "write into") from e


def _precision(planned: Planned) -> str:
    p = planned.plan.precision
    return f"fp8 {p.backend}" if p.fp8 else p.mode


def loss_gate(a: Variant, b: Variant, max_loss_gap: float) -> dict:
    """The spec's loss against its baseline's: (spec - baseline) / baseline of the held-out eval loss where both
    evaluated ([eval]; the gate then applies), else of the final training loss (one batch: reported, not gated)."""
    basis = "eval_loss" if a.figure("eval_loss") is not None and b.figure("eval_loss") is not None else "final_loss"
    x, y = a.figure(basis), b.figure(basis)
    gap = (x - y) / y if x is not None and y else None
    gated = basis == "eval_loss" and gap is not None
    return {"basis": basis, "gap": gap, "max_loss_gap": max_loss_gap, "gated": gated,
            "passed": (gap <= max_loss_gap) if gated else None}


def _record(a: Variant, b: Variant, *, warmup: int, repeats: int, max_loss_gap: float = DEFAULT_MAX_LOSS_GAP) -> dict:
    def side(v: Variant) -> dict:
        start = v.runs[0]["start"] if v.runs else {}
        return {"label": v.label, "spec": v.spec, "overrides": v.overrides, "precision": start.get("precision"),
                "fp8_layers": start.get("fp8_layers"), "total_linear": start.get("total_linear"),
                "figures": {k: v.figure(k) for k in FIGURES}, "runs": v.runs}

    ratios = {}
    for k in FIGURES:
        x, y = a.figure(k), b.figure(k)
        ratios[k] = (x / y) if x is not None and y not in (None, 0) else None
    start = a.runs[0]["start"] if a.runs else {}
    environment = {"device_name": start.get("device_name"), "world_size": start.get("world_size"),
                   "mfu_peak": start.get("mfu_peak"), "peak_tflops": start.get("peak_tflops"),
                   "torch": start.get("torch_version"), **versions("torchao", "deepspeed", "transformer_engine", "fp8launch")}
    return {"warmup_steps_excluded": warmup, "repeats": repeats, "environment": environment,
            "mfu_peak": f"MFU of both variants is measured against the device's {start.get('mfu_peak') or MFU_BASIS} peak: {MFU_NOTE}",
            "spec": side(a), "baseline": side(b), "ratios": ratios, "loss_gate": loss_gate(a, b, max_loss_gap)}


def _peak_name(record: dict) -> str:
    return (record.get("environment", {}).get("mfu_peak") or MFU_BASIS)


def table(record: dict) -> str:
    """The comparison table: both variants' figures and spec/baseline ratios."""
    s, b, r = record["spec"]["figures"], record["baseline"]["figures"], record["ratios"]
    rows = [("tokens/s", "tokens_per_s", "{:,.0f}"), ("step time (s)", "step_time_s", "{:.4f}"),
            ("TFLOP/s per device", "tflops_per_device", "{:.3g}"), (f"MFU vs {_peak_name(record)}", "mfu", "{:.1%}"),
            ("peak memory (GiB)", "peak_mem_gib", "{:.2f}"), ("final loss", "final_loss", "{:.4f}")]
    if s.get("eval_loss") is not None or b.get("eval_loss") is not None:
        rows.append(("eval loss (held out)", "eval_loss", "{:.4f}"))
    if s.get("optimizer_state_bytes") is not None or b.get("optimizer_state_bytes") is not None:  # precision.optimizer_states
        rows.append(("optimizer state (MiB)", "optimizer_state_bytes", "MiB"))
    if s.get("grad_comm_bytes") or b.get("grad_comm_bytes"):  # precision.grad_reduce; 0 on one rank
        rows.append(("gradient MiB sent/step", "grad_comm_bytes", "MiB"))
    name_a, name_b = record["spec"]["label"], record["baseline"]["label"]
    width = max(20, len(f"MFU vs {_peak_name(record)}"))
    lines = [f"{'':<{width}} {name_a:>14} {name_b:>14} {'ratio':>8}"]
    for title, key, fmt in rows:
        cell = lambda v: "n/a" if v is None else f"{v / 2**20:,.2f}" if fmt == "MiB" else fmt.format(v)  # noqa: E731
        ratio = "n/a" if r.get(key) is None else f"{r[key]:.3f}"
        lines.append(f"{title:<{width}} {cell(s[key]):>14} {cell(b[key]):>14} {ratio:>8}")
    gate = record.get("loss_gate")
    if gate and gate["gap"] is not None:
        lines.append(gate_line(gate))
    if record.get("profile"):
        from launcher.profiling.compare import table_lines

        lines += table_lines(record["profile"])
    elif record.get("profile_error"):
        lines.append(f"profile: failed ({record['profile_error']})")
    env = record.get("environment", {})
    lines.append(f"(medians over {record['repeats']} alternating runs each; "
                 f"first {record['warmup_steps_excluded']} steps of each run excluded; "
                 f"{env.get('device_name')} x {env.get('world_size')}, torch {env.get('torch')}, torchao {env.get('torchao')})")
    return "\n".join(lines)


def gate_line(gate: dict) -> str:
    if not gate["gated"]:
        return (f"loss gap {gate['gap']:+.2%} on the final training loss (one batch; not gated: add [eval] for a "
                "held-out loss that bench gates on)")
    verdict = "within" if gate["passed"] else "OVER"
    return f"loss gap {gate['gap']:+.2%} on the held-out eval loss: {verdict} the {gate['max_loss_gap']:.1%} gate"


def plot(record: dict, path: str) -> str:
    """Loss curves of both variants and throughput bars, as a PNG (needs matplotlib)."""
    try:
        import matplotlib
    except ImportError as e:
        raise UsageError(f"the plot needs matplotlib: {INSTALL['matplotlib']}") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_tps) = plt.subplots(1, 2, figsize=(11, 4))
    for side, color in (("spec", "tab:red"), ("baseline", "tab:blue")):
        for i, run in enumerate(record[side]["runs"]):
            steps, losses = zip(*run["losses"]) if run["losses"] else ((), ())
            short = (record[side]["precision"] or "").removeprefix("precision: ").split(",")[0]
            ax_loss.plot(steps, losses, color=color, alpha=1.0 if i == 0 else 0.4,
                         label=f"{record[side]['label']}: {short}" if i == 0 else None)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("loss")
    ax_loss.legend(fontsize=8)
    labels = [record["spec"]["label"], record["baseline"]["label"]]
    values = [record["spec"]["figures"]["tokens_per_s"] or 0, record["baseline"]["figures"]["tokens_per_s"] or 0]
    bars = ax_tps.bar(labels, values, color=["tab:red", "tab:blue"])
    for bar, v in zip(bars, values):
        ax_tps.annotate(f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=9)
    ratio = record["ratios"]["tokens_per_s"]
    ax_tps.set_title(f"tokens/s (ratio {ratio:.3f})" if ratio else "tokens/s")
    fig.tight_layout()
    save_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    return path
