"""The adversarial corpus's record for docs/reliability.md: every case of tests/hostile (a command as a careless or hostile
user types it, tests/hostile/corpus.py) and the injection tests of tests/test_security.py, run by pytest with each
checked case written down (FP8LAUNCH_HOSTILE_RECORD), then counted: tried, ended in one line with the documented code,
tracebacks, hangs, files lost, leftovers, and the pytest outcome of every test (the property tests and the injection
walks included).

    python benchmarks/hostile_record.py [--out benchmarks/results/hostile_record.json]

Prints a table by command; exits 1 when any test failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = ["tests/hostile", "tests/test_security.py"]
IGNORED = ["tests/hostile/test_corpus_runner.py"]  # the runner's own tests break their cases on purpose


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "hostile_record.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        record, junit = Path(tmp) / "cases.jsonl", Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", *TESTS,
                   *[f"--ignore={p}" for p in IGNORED], f"--junitxml={junit}"]
        done = subprocess.run(command, cwd=REPO, env={**os.environ, "FP8LAUNCH_HOSTILE_RECORD": str(record)},
                              capture_output=True, text=True)
        rows = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
        suites = ET.parse(junit).getroot()
        tests = [case for suite in suites.iter("testsuite") for case in suite.iter("testcase")]
        failed = [c for c in tests if c.find("failure") is not None or c.find("error") is not None]
        skipped = [c for c in tests if c.find("skipped") is not None]
    by_command: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        c = by_command[r["command"]]
        c["tried"] += 1
        c["as documented"] += r["code"] == r["expected"] and not r["traceback"] and not r["hang"] and 0 < r["lines"] and not r["lost"]
        c["one-line error"] += r["code"] == r["expected"] != 0 and r["lines"] == 1
        c["exit 0"] += r["code"] == 0
        c["traceback"] += r["traceback"]
        c["hang"] += r["hang"]
        c["lost"] += bool(r["lost"])
        c["left"] += bool(r["left"])
    total: collections.Counter = sum(by_command.values(), collections.Counter())
    columns = ("tried", "as documented", "one-line error", "exit 0", "traceback", "hang", "lost", "left")
    print(f"{'command':<10}" + "".join(f"{c:>16}" for c in columns))
    for name in sorted(by_command) + ["all"]:
        c = total if name == "all" else by_command[name]
        print(f"{name:<10}" + "".join(f"{c[k]:>16}" for k in columns))
    print(f"pytest: {len(tests)} tests, {len(failed)} failed, {len(skipped)} skipped (exit {done.returncode})")
    out = {"benchmark": "hostile_record", "command": "python benchmarks/hostile_record.py", "tests": len(tests),
           "failed": [c.get("classname") + "::" + c.get("name") for c in failed],
           "skipped": [c.get("classname") + "::" + c.get("name") for c in skipped],
           "cases": {name: dict(c) for name, c in sorted(by_command.items())}, "all": dict(total),
           "codes": dict(sorted(collections.Counter(str(r["code"]) for r in rows).items()))}
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 1 if failed or done.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
