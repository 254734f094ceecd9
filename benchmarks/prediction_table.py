"""The table of docs/prediction.md: every published point of tests/data/published_speedups.json with the
model's prediction and its error (tests/test_predict.py checks the doc against this model).

    python benchmarks/prediction_table.py [--out benchmarks/results/prediction_table.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "tests", "data")


def rows() -> list[dict]:
    from launcher.commands.plan import plan_one
    from launcher.planning.predict import linear_speedup

    points = json.load(open(os.path.join(DATA, "published_speedups.json"), encoding="utf-8"))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in points["end_to_end"]:
            planned = plan_one(os.path.join(DATA, "published-base.toml"), tmp, points["base_spec"] + p["set"])
            pr, plan = planned.prediction, planned.plan
            what = (f"{pr.gpus} x {pr.gpu}, {plan.train.model.split(':', 1)[1]}, {plan.train.micro_batch_size} x {plan.train.seq_len} tokens, "
                    f"{pr.precision.removeprefix('fp8 torchao ')}{' + fp8 all-gather' if plan.precision.torchao.fsdp_float8_all_gather else ''}"
                    f"{', AC ' + plan.activation_checkpointing.mode if plan.activation_checkpointing.mode != 'none' else ''}")
            out.append({"id": p["id"], "kind": "end to end", "what": what,
                        "measured": p["measured"], "predicted": pr.fp8_vs_bf16})
    for g in points["gemm"]:
        out.append({"id": g["id"], "kind": "Float8Linear", "what": f"M, K, N = {g['m']}, {g['k']}, {g['n']}",
                    "measured": g["measured"], "predicted": linear_speedup("h100", g["m"], g["k"], g["n"])})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "prediction_table.json"))
    args = parser.parse_args()
    table = rows()
    print("| point | setup | measured | predicted | error |")
    print("|---|---|---|---|---|")
    for r in table:
        print(f"| `{r['id']}` | {r['kind']}: {r['what']} | {r['measured']:.2f} | {r['predicted']:.2f} | {r['predicted'] - r['measured']:+.2f} |")
    e2e = [abs(r["predicted"] - r["measured"]) for r in table if r["kind"] == "end to end"]
    print(f"\nend to end: mean |error| {sum(e2e) / len(e2e):.3f}, max {max(e2e):.3f} over {len(e2e)} points")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"rows": [{**r, "predicted": round(r["predicted"], 4)} for r in table]}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
