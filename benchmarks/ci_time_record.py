"""benchmarks/results/ci_time.{json,md} from one `.ci/run` that benchmarks/ci_time.sh timed: its phases (the JSON lines
.ci/phase appended to CI_TIMES) and the slowest tests each pytest phase printed (`--durations`) in its log.

    python benchmarks/ci_time_record.py PHASES.jsonl CI.log TOTAL_S EXIT COMMIT OUT_DIR [TIMELINE_DIR [PYTHON]]

With PYTHON (the clone's venv), the machine's speed beside its minutes: the CPU seconds of `import torch` (median of 5),
which is most of what a run's processes spend starting and so moves CI's minutes with it. This machine kind has been an
AMX Xeon and an AMD EPYC on different days; the same commit's cold run takes longer on the slower one.

With TIMELINE_DIR (.ci/phase's CI_TIMELINE_DIR), each pytest phase's two workers are summed too: busy seconds, and how
long each stood idle at the end while the other finished (benchmarks/ci_timeline.py).
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys

PHASE_LINE = re.compile(r"^ci-phase: (\S+) ([\d.]+) s exit (\d+)$")
DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)$")
TOP = 8


def phases_of(log: str) -> list[dict]:
    """The phases in the order CI ran them, from the log's `ci-phase:` lines: only .ci/run's own (a test that runs
    `.ci/phase` in a subprocess prints into its captured output, not the log's lines)."""
    return [{"phase": m[1], "seconds": float(m[2]), "exit": int(m[3])} for m in map(PHASE_LINE.match, log.splitlines()) if m]


def slowest(log: str) -> dict[str, list[dict]]:
    """Per pytest phase, its slowest tests: the `--durations` block printed before that phase's `ci-phase:` line."""
    out, block = {}, []
    for line in log.splitlines():
        if m := DURATION.match(line):
            block.append({"seconds": float(m[1]), "when": m[2], "test": m[3]})
        elif m := PHASE_LINE.match(line):
            if block:
                out[m[1]] = block[:TOP]
            block = []
    return out


def workers(timeline_dir: str | None) -> dict[str, dict]:
    """Per pytest phase with a timeline file: each worker's busy seconds, tests and idle tail (ci_timeline.summary)."""
    if not timeline_dir or not os.path.isdir(timeline_dir):
        return {}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ci_timeline import summary

    out = {}
    for name in sorted(os.listdir(timeline_dir)):
        lines = [json.loads(x) for x in open(os.path.join(timeline_dir, name), encoding="utf-8") if x.strip()]
        if name.endswith(".jsonl") and lines:
            s = summary(lines)
            out[name[:-len(".jsonl")]] = {"wall_s": s["wall_s"], "workers": s["workers"],
                                          "by_file_s": dict(list(s["by_file_s"].items())[:TOP])}
    return out


def import_torch_cpu_s(python: str, times: int = 5) -> float:
    """The median CPU seconds of `PYTHON -c "import torch"`, each run a new process (bytecode already written)."""
    cpu = []
    for _ in range(times):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([python, "-c", "import torch"], check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return round(statistics.median(cpu), 2)


def cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main(phases_path: str, log_path: str, total: str, rc: str, commit: str, out: str, timeline_dir: str | None = None,
         python: str | None = None) -> None:
    log = open(log_path, encoding="utf-8", errors="replace").read()
    phases = phases_of(log) or [json.loads(line) for line in open(phases_path) if line.strip()]
    flags = []
    try:
        flags = next(line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    total_s = int(total)
    record = {
        "what": ".ci/run on a fresh clone with empty pip, Inductor (TORCHINDUCTOR_CACHE_DIR) and torch-extension "
                "(TORCH_EXTENSIONS_DIR) caches: benchmarks/ci_time.sh",
        "commit": commit, "exit": int(rc), "total_s": total_s, "total_min": round(total_s / 60, 1),
        "phases": phases, "slowest": slowest(log), "workers": workers(timeline_dir),
        "machine": {"cpus": os.cpu_count(), "model": cpu_model(), "python": platform.python_version(),
                    "amx": any(f.startswith("amx") for f in flags), "avx512": "avx512f" in flags,
                    "import_torch_cpu_s": import_torch_cpu_s(python) if python and os.path.exists(python) else None},
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ci_time.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    lines = ["# CI time from a cold machine", "",
             f"`bash benchmarks/ci_time.sh` at {commit}: `.ci/run` on a fresh clone, empty pip / Inductor / torch-extension "
             f"caches, {record['machine']['cpus']} CPUs ({record['machine']['model']}, AMX: {record['machine']['amx']}). Exit {rc}, "
             f"**{record['total_min']} min** in all (CI's limit is 90, the budget 35).", "",
             f"The machine's speed: `import torch` takes {record['machine']['import_torch_cpu_s']} CPU-s here (median of 5; 1.2-1.3 "
             "on the AMX Xeon that measured 37-48 min for earlier commits, 2026-11-26/27). Most of a run's CPU seconds are its "
             "processes starting (benchmarks/results/ci_cpu.md), so the minutes scale with it.", "",
             "| phase | minutes | exit |", "|---|---:|---:|"]
    lines += [f"| {p['phase']} | {p['seconds'] / 60:.1f} | {p['exit']} |" for p in phases]
    lines += ["", "Phases: setup (venv and packages from nothing), lint (`ruff check`), fast (`make test-fast`), slow (the "
              "multi-process tests but the support matrix, the SLURM cluster's install included), matrix "
              "(tests/e2e/test_support_matrix.py's runs), plan-check and matrix-check (the committed configs and support matrix "
              "are current). fast, slow and matrix run two tests at a time (`-n 2`).", ""]
    for phase, w in record["workers"].items():
        busy = ", ".join(f"{k} busy {v['busy_s'] / 60:.1f} min ({v['tests']} tests), idle at the end {v['idle_at_end_s']:.0f} s"
                         for k, v in w["workers"].items())
        lines += [f"Workers in {phase} ({w['wall_s'] / 60:.1f} min from the first test's start to the last one's end): {busy}.", ""]
    for phase, tests in record["slowest"].items():
        lines += [f"Slowest in {phase}:", "", "| seconds | test |", "|---:|---|"]
        lines += [f"| {t['seconds']:.0f} | `{t['test']}`{' (setup)' if t['when'] == 'setup' else ''} |" for t in tests]
        lines.append("")
    with open(os.path.join(out, "ci_time.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:])
