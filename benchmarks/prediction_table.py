"""The table of docs/prediction.md: every published point of tests/data/published_speedups.json with the
model's prediction and its error (tests/test_predict.py checks the doc against this model).

    python benchmarks/prediction_table.py [--out benchmarks/results/prediction_table.json]
    python benchmarks/prediction_table.py --fit     # the least-squares search that set cost.BLACKWELL_GEMM_SCALE
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "tests", "data")
POINTS = json.load(open(os.path.join(DATA, "published_speedups.json"), encoding="utf-8"))


def spec_folder(tmp: str) -> str:
    """published-base.toml with the model_configs the points name (hf:NAME) beside it."""
    folder = os.path.join(tmp, "published")
    if not os.path.isdir(folder):
        os.makedirs(folder)
        shutil.copy(os.path.join(DATA, "published-base.toml"), folder)
        for name, config in POINTS["model_configs"].items():
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                json.dump(config, f)
    return folder


def plan_point(sets: list[str], tmp: str):
    from launcher.commands.plan import plan_one

    return plan_one(os.path.join(spec_folder(tmp), "published-base.toml"), tmp, POINTS["base_spec"] + sets)


def predicted(point: dict, tmp: str) -> float:
    """FP8 over bf16, or over the point's `vs` setup where the source has no bf16 run."""
    got = plan_point(point["set"], tmp).prediction.fp8_vs_bf16
    return got / plan_point(point["vs"], tmp).prediction.fp8_vs_bf16 if "vs" in point else got


def describe(planned) -> str:
    """The setup in a few words: GPUs, model, tokens per micro-batch, recipe and what differs from the usual."""
    pr, plan = planned.prediction, planned.plan
    p, d, t = plan.precision, plan.distributed, plan.train
    recipe = pr.precision.removeprefix("fp8 torchao ").removeprefix("fp8 ")
    notes = [" + fp8 all-gather" if p.torchao.fsdp_float8_all_gather and p.backend == "torchao" else ""]
    notes.append(f", last {p.keep_last_blocks} blocks bf16" if p.keep_last_blocks else "")
    notes.append(f", {d.strategy}" if d.strategy != "fsdp2" else "")
    notes.append(f", accum {t.grad_accum_steps}" if t.grad_accum_steps > 1 else "")
    notes.append(", eager" if not plan.compile.enabled else "")
    notes.append(f", AC {plan.activation_checkpointing.mode}" if plan.activation_checkpointing.mode != "none" else "")
    model = t.model.split(":", 1)[1].removesuffix(".json")
    return f"{pr.gpus} x {pr.gpu}, {model}, {t.micro_batch_size} x {t.seq_len} tokens, {recipe}{''.join(notes)}"


def rows() -> list[dict]:
    from launcher.planning.predict import linear_speedup

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in POINTS["end_to_end"]:
            what = describe(plan_point(p["set"], tmp))
            if "vs" in p:
                what += " vs " + plan_point(p["vs"], tmp).prediction.precision.removeprefix("fp8 ")
            out.append({"id": p["id"], "kind": "end to end", "cite": p["cite"], "what": what + (" (setup guessed)" if p["guessed"] else ""),
                        "role": p["role"], "setup": p["setup"], "blackwell": 'launch.gpu="b200"' in p["set"], "measured": p["measured"],
                        "predicted": predicted(p, tmp), "max_error": p["max_error"]})
    for g in POINTS["gemm"]:
        out.append({"id": g["id"], "kind": "Float8Linear", "cite": g["cite"], "what": f"M, K, N = {g['m']}, {g['k']}, {g['n']}",
                    "role": g["role"], "setup": g["id"], "blackwell": False, "measured": g["measured"],
                    "predicted": linear_speedup("h100", g["m"], g["k"], g["n"]), "max_error": g["max_error"]})
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


GROUPS = (("end to end, Hopper / MI300X", lambda r: r["kind"] == "end to end" and not r["blackwell"]),
          ("end to end, Blackwell", lambda r: r["kind"] == "end to end" and r["blackwell"]),
          ("Float8Linear", lambda r: r["kind"] == "Float8Linear"))


def fit_blackwell_scale(lo: float = 0.60, hi: float = 0.85, step: float = 0.01) -> list[tuple[float, float]]:
    """(scale, sum of squared errors over the end-to-end points marked `fit`) for each BLACKWELL_GEMM_SCALE on the grid,
    best first. The model's BLACKWELL_GEMM_EFF is restored afterwards."""
    from launcher.planning.predict import cost

    fit = [p for p in POINTS["end_to_end"] if p["role"] == "fit"]
    saved = dict(cost.BLACKWELL_GEMM_EFF)
    out = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(round((hi - lo) / step) + 1):
                scale = round(lo + i * step, 2)
                cost.BLACKWELL_GEMM_EFF.update({d: e * scale for d, e in cost.GEMM_EFF.items()})
                out.append((scale, sum((predicted(p, tmp) - p["measured"]) ** 2 for p in fit)))
    finally:
        cost.BLACKWELL_GEMM_EFF.update(saved)
    return sorted(out, key=lambda x: x[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "prediction_table.json"))
    parser.add_argument("--fit", action="store_true",
                        help="search BLACKWELL_GEMM_SCALE on the fit points and print the best; write nothing")
    args = parser.parse_args()
    if args.fit:
        from launcher.planning.predict import cost

        ranked = fit_blackwell_scale()
        for scale, sse in ranked[:5]:
            print(f"BLACKWELL_GEMM_SCALE = {scale:.2f}: sum of squared errors {sse:.6f}")
        print(f"in the model: {cost.BLACKWELL_GEMM_SCALE}")
        return
    table = rows()
    print("| point | source | setup | published | predicted | error | role |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| `{r['id']}` | {r['cite']} | {r['kind']}: {r['what']} | {r['measured']:.2f} | {r['predicted']:.2f} | "
              f"{r['predicted'] - r['measured']:+.2f} | {r['role']} |")
    for name, member in GROUPS:
        rows_ = [r for r in table if member(r)]
        print(f"\n{name}: " + "; ".join(summary(rows_, role) for role in ("held-out", "fit")))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"rows": [{**r, "predicted": round(r["predicted"], 4)} for r in table]}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
