"""Where a test phase's two workers spent their time: reads the JSON lines FP8LAUNCH_TEST_TIMELINE=PATH makes each test
append (tests/conftest.py: test, xdist worker, start and end, wall clock) and prints each worker's busy seconds, how
long it stood idle at the end while the other worker finished (the tail), and the longest tests by file.

    FP8LAUNCH_TEST_TIMELINE=/tmp/slow.jsonl .venv/bin/python -m pytest -m slow ... -n 2 --dist loadgroup
    .venv/bin/python benchmarks/ci_timeline.py /tmp/slow.jsonl [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def summary(lines: list[dict]) -> dict:
    start, end = min(x["start"] for x in lines), max(x["end"] for x in lines)
    workers = collections.defaultdict(list)
    for x in lines:
        workers[x["worker"]].append(x)
    per_worker = {w: {"busy_s": round(sum(x["end"] - x["start"] for x in xs), 1), "tests": len(xs),
                      "idle_at_end_s": round(end - max(x["end"] for x in xs), 1)} for w, xs in sorted(workers.items())}
    files = collections.Counter()
    for x in lines:
        files[x["test"].split("::")[0]] += x["end"] - x["start"]
    return {"wall_s": round(end - start, 1), "workers": per_worker,
            "by_file_s": {f: round(s, 1) for f, s in files.most_common()},
            "tests": sorted(({"test": x["test"], "worker": x["worker"], "seconds": round(x["end"] - x["start"], 1),
                              "starts_at_s": round(x["start"] - start, 1)} for x in lines), key=lambda t: -t["seconds"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    s = summary([json.loads(x) for x in args.timeline.read_text().splitlines() if x.strip()])
    print(f"wall {s['wall_s']:.0f} s")
    for w, v in s["workers"].items():
        print(f"  {w}: busy {v['busy_s']:.0f} s over {v['tests']} tests, idle at the end {v['idle_at_end_s']:.0f} s")
    print("\n| seconds | file |\n|---:|---|")
    for f, sec in s["by_file_s"].items():
        print(f"| {sec:.0f} | {f} |")
    print("\n| seconds | starts at | worker | test |\n|---:|---:|---|---|")
    for t in s["tests"][:args.top]:
        print(f"| {t['seconds']:.0f} | {t['starts_at_s']:.0f} | {t['worker']} | `{t['test']}` |")


if __name__ == "__main__":
    main()
