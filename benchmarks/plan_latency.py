"""How long `fp8launch plan` takes, against `python -c "import torch"` measured in the same run.

Planning runs in pre-commit hooks and CI, so it must stay far below torch's import time.
Targets: one spec in under a quarter of torch's import time; 100 specs in under 2 s.

    python benchmarks/plan_latency.py [--repeats 7] [--out benchmarks/results/plan_latency.json]

With --baseline-src DIR (a folder holding another version's `launcher` package, e.g. from
`git archive REV launcher | tar -x -C DIR`), the same plan cases also run with that version,
interleaved, and the table shows this version's cost over it (how much a change costs `plan`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(REPO, "specs", "llama3-8b-torchao-fsdp2.toml")


def wall(cmd: list[str], cwd: str, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "plan_latency.json"))
    parser.add_argument("--baseline-src", help="a folder with another version's launcher package to compare against")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="fp8launch-bench-")
    specs = []
    text = open(SPEC, encoding="utf-8").read()
    for i in range(100):
        path = os.path.join(work, f"s{i:03d}.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace('name = "llama3-8b-torchao-fsdp2"', f'name = "bench-{i:03d}"'))
        specs.append(path)

    py = sys.executable
    cases = {
        "import torch": [py, "-c", "import torch"],
        "plan 1 spec": [py, "-m", "launcher", "plan", "--out", "out1", specs[0]],
        "plan 100 specs": [py, "-m", "launcher", "plan", "--out", "out100", *specs],
        "plan --check 100 specs": [py, "-m", "launcher", "plan", "--check", "--out", "out100", *specs],
    }
    envs = {name: None for name in cases}
    if args.baseline_src:
        baseline_env = {**os.environ, "PYTHONPATH": os.path.abspath(args.baseline_src)}
        for name in [n for n in cases if n.startswith("plan")]:
            cases[f"{name} (baseline)"] = [c.replace("out1", "base1").replace("out100", "base100") for c in cases[name]]
            envs[f"{name} (baseline)"] = baseline_env
    times: dict[str, list[float]] = {k: [] for k in cases}
    for name, cmd in cases.items():  # warm the page cache once
        subprocess.run(cmd, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=envs[name])
    for _ in range(args.repeats):  # interleave, so drift in machine load hits every case alike
        for name, cmd in cases.items():
            times[name].append(wall(cmd, work, envs[name]))
    shutil.rmtree(work)

    torch_s = statistics.median(times["import torch"])
    rows = []
    print(f"{'case':<24} {'median s':>9} {'vs import torch':>16}")
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"case": name, "median_s": round(med, 4), "ratio_to_import_torch": round(med / torch_s, 3),
                     "samples_s": [round(t, 4) for t in ts]})
        print(f"{name:<24} {med:>9.3f} {med / torch_s:>15.2f}x")
    one = statistics.median(times["plan 1 spec"])
    hundred = statistics.median(times["plan 100 specs"])
    verdict = {"one_spec_under_quarter_of_torch": one < torch_s / 4, "hundred_specs_under_2s": hundred < 2.0}
    if args.baseline_src:
        for name in [n for n in times if n.endswith("(baseline)")]:
            mine, base = statistics.median(times[name.removesuffix(" (baseline)")]), statistics.median(times[name])
            verdict[f"{name.removesuffix(' (baseline)')}: cost over baseline under 20%"] = mine / base - 1 < 0.20
            print(f"{name.removesuffix(' (baseline)')}: {mine / base - 1:+.1%} over the baseline version (target < +20%)")
    print(f"1 spec: {one / torch_s:.2f}x torch import (target < 0.25): {'ok' if verdict['one_spec_under_quarter_of_torch'] else 'MISSED'}")
    print(f"100 specs: {hundred:.2f} s (target < 2 s): {'ok' if verdict['hundred_specs_under_2s'] else 'MISSED'}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"python": sys.version.split()[0], "repeats": args.repeats, "cases": rows, "targets_met": verdict}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
