"""The long fuzz of what users hand fp8launch: real specs and real configs of other tools, broken at random
(tests/hostile/mutate.py), through `fp8launch plan` and `fp8launch import` as a user runs them (in-process, Click's
runner, a working folder of their own). Counts, per target, how each ended: planned / imported (exit 0), refused in
one line a problem (exit 2 or 3, every stderr line an error line), a traceback (an exception of Python's own escaping
the command), a hang (no end within --hang-s). The fast tier runs the same mutations for seconds
(tests/hostile/test_import_fuzz.py); this is the long search.

    python benchmarks/fuzz_inputs.py [--examples 2000] [--seed 0] [--out benchmarks/results/fuzz_inputs.json]

Prints a table; writes JSON with every failure's first example (its target, source, stderr's last line or the
exception, and the mutated file's text) so that it can be reproduced.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from click.testing import CliRunner  # noqa: E402

from launcher.cli import main  # noqa: E402
from tests.hostile.mutate import DATA, SOURCES, SPEC_SOURCES, mutated, mutated_spec  # noqa: E402

ERROR_LINE = re.compile(r"^(\S.*: )?(error|warning)(\[[A-Z0-9-]+\])?: |^\d+ problems found\.$|^(note|interrupted)")


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang


def one(target: str, rng: random.Random, hang_s: float) -> dict:
    choose = rng.randrange
    steps = rng.randint(1, 4)
    with tempfile.TemporaryDirectory() as folder:
        if target == "plan":
            source = rng.choice(SPEC_SOURCES)
            path = mutated_spec(source, choose, steps, Path(folder))
            argv = ["plan", str(path), "--out", os.path.join(folder, "out")]
        else:
            source = str(DATA / rng.choice(SOURCES))
            path = mutated(os.path.relpath(source, DATA), choose, steps, Path(folder))
            argv = ["import", str(path), "--out", os.path.join(folder, "spec.toml")]
        text = path.read_text(encoding="utf-8")
        old = os.getcwd()
        os.chdir(folder)
        signal.alarm(int(hang_s))
        t0 = time.perf_counter()
        try:
            result = CliRunner().invoke(main, argv, catch_exceptions=True)
            seconds = time.perf_counter() - t0
        except Hang:
            return {"outcome": "hang", "source": os.path.relpath(source, REPO), "detail": f"no end within {hang_s} s", "text": text}
        finally:
            signal.alarm(0)
            os.chdir(old)
    record = {"source": os.path.relpath(source, REPO), "seconds": seconds, "text": text}
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        if isinstance(result.exception, Hang):
            return {**record, "outcome": "hang", "detail": f"no end within {hang_s} s"}
        frame = traceback.extract_tb(result.exception.__traceback__)[-1]
        where = f"{os.path.relpath(frame.filename, REPO) if frame.filename.startswith(str(REPO)) else frame.filename}:{frame.lineno}"
        return {**record, "outcome": "traceback", "detail": f"{type(result.exception).__name__} at {where}: {result.exception}"[:300]}
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.exit_code == 0:
        return {**record, "outcome": "ok"}
    if result.exit_code in (2, 3) and lines and all(ERROR_LINE.match(line) for line in lines):
        return {**record, "outcome": "refused", "detail": lines[-1][:300]}
    return {**record, "outcome": "other", "detail": f"exit {result.exit_code}: {lines[-1][:300] if lines else '(no stderr)'}"}


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="examples per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-s", type=float, default=10.0)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fuzz_inputs.json"))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, _alarm)
    rows, failures = [], {}
    t_all = time.perf_counter()
    for target in ("plan", "import"):
        rng = random.Random(f"{args.seed}-{target}")
        counts: collections.Counter = collections.Counter()
        slowest = 0.0
        for _ in range(args.examples):
            r = one(target, rng, args.hang_s)
            counts[r["outcome"]] += 1
            slowest = max(slowest, r.get("seconds", args.hang_s))
            if r["outcome"] in ("traceback", "hang", "other"):
                key = f"{target}: {r['outcome']}: {r['detail'].split(':')[0] if r['outcome'] != 'other' else r['detail'][:80]}"
                failures.setdefault(key, {"target": target, **{k: r[k] for k in ("outcome", "source", "detail", "text")}, "count": 0})
                failures[key]["count"] += 1
        rows.append({"target": target, "tried": args.examples, **{k: counts[k] for k in ("ok", "refused", "traceback", "hang", "other")},
                     "slowest_s": round(slowest, 3)})
    print(f"{'target':<8} {'tried':>6} {'ok':>6} {'refused':>8} {'traceback':>10} {'hang':>5} {'other':>6} {'slowest s':>10}")
    for r in rows:
        print(f"{r['target']:<8} {r['tried']:>6} {r['ok']:>6} {r['refused']:>8} {r['traceback']:>10} {r['hang']:>5} {r['other']:>6} "
              f"{r['slowest_s']:>10}")
    for key, f in sorted(failures.items()):
        print(f"  {f['count']:>4}x {key[:160]}")
    import launcher

    record = {"benchmark": "fuzz_inputs", "fp8launch_version": launcher.__version__, "python": sys.version.split()[0],
              "examples_per_target": args.examples, "seed": args.seed, "hang_s": args.hang_s,
              "seconds": round(time.perf_counter() - t_all, 1), "rows": rows, "failures": list(failures.values()),
              "command": f"python benchmarks/fuzz_inputs.py --examples {args.examples} --seed {args.seed}"}
    Path(args.out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main_())
