"""The spread of `fp8launch export --quant`'s logit gap to the bf16 export, over seeds: the bound
tests/test_export.py holds each format to (QUANT_GAP) comes from here.

    python benchmarks/export_quant_gap.py [--seeds 0 1 2 3 4] [--out benchmarks/results/export_quant_gap.json]

For each seed: the tests' FP8 run (builtin:llama-debug?layers=2, torchao tensorwise, FSDP2, 2 steps at seq_len 16,
trained in this process as tests/test_export.py trains it, train.seed = SEED), exported with each --quant; the gap the
export measures (max |logits - bf16 export's logits| over 128 tokens, fp32 on the CPU) divided by the bf16 logits'
standard deviation. Prints a table and writes the JSON: per format the ratios, their mean, sd and max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "export_quant_gap.json")
QUANTS = ("fp8-block", "fp8-channel", "mxfp8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args()
    from click.testing import CliRunner

    from launcher.cli import main as cli
    from tests.test_export import FP8_RUN, train_run

    ratios: dict[str, list[float]] = {q: [] for q in QUANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            run = train_run(Path(tmp), f"seed{seed}", **FP8_RUN, **{"train.seed": seed})
            for q in QUANTS:
                out = run / "export" / q
                r = CliRunner().invoke(cli, ["export", str(run), "--quant", q, "--out", str(out)], catch_exceptions=False)
                assert r.exit_code == 0, r.output
                gap = json.loads((out / "fp8launch-export.json").read_text())["quant"]["logit_gap"]
                ratios[q].append(gap["max_abs"] / gap["logit_std"])
                print(f"seed {seed} {q:12} max |gap| {gap['max_abs']:.4f} / logit sd {gap['logit_std']:.4f} = {ratios[q][-1]:.4f}")
    rows = {q: {"ratios": [round(x, 5) for x in v], "mean": round(statistics.fmean(v), 5),
                "sd": round(statistics.stdev(v), 5) if len(v) > 1 else 0.0, "max": round(max(v), 5)} for q, v in ratios.items()}
    print(f"{'format':12} {'mean':>8} {'sd':>8} {'max':>8}  (max |logit gap| / sd of the bf16 logits, seeds {args.seeds})")
    for q, r in rows.items():
        print(f"{q:12} {r['mean']:8.4f} {r['sd']:8.4f} {r['max']:8.4f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"seeds": args.seeds, "formats": rows}, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
