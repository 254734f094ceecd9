"""The spread behind tests/e2e/test_context_parallel.py's bounds: its bf16 and FP8 runs (cp 2 on 2 processes against one
process on the same batches) at seeds 0-2, through `fp8launch run`. Prints one line a seed and writes
benchmarks/results/context_parallel_bounds.json.

    .venv/bin/python benchmarks/context_parallel_bounds.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.e2e.helpers import records, run_named  # noqa: E402
from tests.e2e.test_context_parallel import BF16, COMMON, CP2, EVAL, ONE, TAO  # noqa: E402
from tests.e2e.test_resume import metrics  # noqa: E402


def _rel(a: float, b: float) -> float:
    return abs(b - a) / a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix=f"cp-bounds-{seed}-") as tmp:
            f, k = Path(tmp), dict(COMMON, train__seed=seed)
            one, cp = (records(run_named(f, n, **k, **w, **BF16, **EVAL, train__steps=3))
                       for n, w in (("one-bf16", ONE), ("cp2-bf16", CP2)))
            held_out = [next(r["eval_loss"] for r in metrics(f / "runs" / n) if r["event"] == "eval") for n in ("one-bf16", "cp2-bf16")]
            one8, cp8 = (records(run_named(f, n, **k, **w, **TAO, train__steps=20)) for n, w in (("one-fp8", ONE), ("cp2-fp8", CP2)))
        mean = lambda r: sum(r.losses) / len(r.losses)  # noqa: E731
        rows.append({"seed": seed,
                     "bf16_step1_loss": _rel(one.steps[0]["loss"], cp.steps[0]["loss"]),
                     "bf16_step1_grad_norm": _rel(one.steps[0]["grad_norm"], cp.steps[0]["grad_norm"]),
                     "bf16_steps23_loss_max": max(_rel(a["loss"], b["loss"]) for a, b in zip(one.steps[1:], cp.steps[1:])),
                     "bf16_eval_loss": _rel(*held_out),
                     "fp8_mean_gap": _rel(mean(one8), mean(cp8)), "fp8_last_gap": _rel(one8.losses[-1], cp8.losses[-1])})
        print(json.dumps(rows[-1]), flush=True)
    out = REPO / "benchmarks" / "results" / "context_parallel_bounds.json"
    out.write_text(json.dumps({"command": "python benchmarks/context_parallel_bounds.py", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
