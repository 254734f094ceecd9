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
            out.append({"id": p["id"], "kind": "end to end", "what": what + (" (setup guessed)" if p["guessed"] else ""),
                        "role": p["role"], "setup": p["setup"], "measured": p["measured"], "predicted": pr.fp8_vs_bf16})
    for g in points["gemm"]:
        out.append({"id": g["id"], "kind": "Float8Linear", "what": f"M, K, N = {g['m']}, {g['k']}, {g['n']}", "role": g["role"],
                    "setup": g["id"], "measured": g["measured"], "predicted": linear_speedup("h100", g["m"], g["k"], g["n"])})
    return out


def summary(table: list[dict], role: str) -> str:
    """Mean and max |error| over distinct setups (a setup measured twice counts once, with its mean error)."""
    by_setup: dict[str, list[float]] = {}
    for r in table:
        if r["role"] == role:
            by_setup.setdefault(r["setup"], []).append(r["predicted"] - r["measured"])
    errors = [abs(sum(e) / len(e)) for e in by_setup.values()]
    points = sum(len(e) for e in by_setup.values())
    if not errors:
        return f"{role}: none"
    return (f"{role}: {len(errors)} setups ({points} points), mean |error| {sum(errors) / len(errors):.3f}, "
            f"max {max(errors):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "prediction_table.json"))
    args = parser.parse_args()
    table = rows()
    print("| point | role | setup | measured | predicted | error |")
    print("|---|---|---|---|---|---|")
    for r in table:
        print(f"| `{r['id']}` | {r['role']} | {r['kind']}: {r['what']} | {r['measured']:.2f} | {r['predicted']:.2f} | "
              f"{r['predicted'] - r['measured']:+.2f} |")
    for kind in ("end to end", "Float8Linear"):
        rows_ = [r for r in table if r["kind"] == kind]
        print(f"\n{kind}: " + "; ".join(summary(rows_, role) for role in ("held-out", "fit")))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"rows": [{**r, "predicted": round(r["predicted"], 4)} for r in table]}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
