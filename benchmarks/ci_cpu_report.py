"""Where a test run's CPU seconds went, by process kind and by test: the records benchmarks/ci_cpu.sh collects.

    python benchmarks/ci_cpu_report.py RECORDS_DIR [OUT.json] [--top N]

On a CPU-bound run (CI's two workers keep both cores busy) the CPU seconds, not the tests' wall times, say what a
change saves: a test's wall time grows with whatever runs beside it. Kinds: rank (a training process), agent (torchrun),
cli (fp8launch itself), compile-worker (Inductor's compile pool), pytest (the workers, with every in-process test), other
Python, native (the C++ compiler: Inductor's kernels, DeepSpeed's JIT ops)."""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def kind(argv: list[str]) -> str:
    line = " ".join(argv)
    if "fp8launch-train" in line or "launcher.train" in line:
        return "rank"
    if "torchrun" in line or "torch.distributed.run" in line:
        return "agent"
    if "compile_worker" in line:
        return "compile-worker"
    if "pytest" in line or line.startswith("-c"):
        return "pytest"
    if line.split(" ", 1)[0].endswith("fp8launch"):
        return "cli"
    return "other"


def load(records: Path) -> list[dict]:
    """One row per process: kind, test, cpu_s; one per compiler call (kind native)."""
    rows = []
    for path in sorted(records.glob("*.json")):
        r = json.loads(path.read_text(encoding="utf-8"))
        rows.append({"kind": kind(r["argv"]), "test": r["test"], "cpu_s": r["cpu_s"]})
    native = records / "native.log"
    if native.exists():
        for line in native.read_text(encoding="utf-8").splitlines():
            seconds, _, test = line.partition("\t")
            user, system = (float(x) for x in seconds.split())
            rows.append({"kind": "native", "test": test, "cpu_s": user + system})
    return rows


NO_TEST = "(no test: the pytest workers, with the in-process tests)"


def summary(rows: list[dict]) -> dict:
    kinds = collections.Counter()
    count = collections.Counter()
    tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    launches = collections.Counter()  # a torchrun agent a launch
    for r in rows:
        name = r["test"] or NO_TEST
        kinds[r["kind"]] += r["cpu_s"]
        count[r["kind"]] += 1
        tests[name][r["kind"]] += r["cpu_s"]
        launches[name] += r["kind"] == "agent"
    return {
        "cpu_s": round(sum(kinds.values()), 1),
        "kinds": {k: {"cpu_s": round(v, 1), "processes": count[k]} for k, v in kinds.most_common()},
        "tests": sorted(({"test": t, "cpu_s": round(sum(c.values()), 1), "launches": launches[t], **{k: round(v, 1) for k, v in c.items()}}
                         for t, c in tests.items()), key=lambda t: -t["cpu_s"]),
    }


def table(s: dict, top: int) -> str:
    lines = [f"{s['cpu_s']:.0f} CPU-s in all", "", "| kind | CPU-s | processes |", "|---|---:|---:|"]
    lines += [f"| {k} | {v['cpu_s']:.0f} | {v['processes']} |" for k, v in s["kinds"].items()]
    lines += ["", "| CPU-s | launches | ranks | agents | native | test |", "|---:|---:|---:|---:|---:|---|"]
    for t in s["tests"][:top]:
        lines.append(f"| {t['cpu_s']:.1f} | {t['launches']} | {t.get('rank', 0):.1f} | {t.get('agent', 0):.1f} | "
                     f"{t.get('native', 0):.1f} | `{t['test']}` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    s = summary(load(args.records))
    print(table(s, args.top))
    if args.out:
        args.out.write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
