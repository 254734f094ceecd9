"""Turn bench.json files into benchmarks/results/<date>-<device>.json and a markdown table.

    python benchmarks/summarize_bench.py OUT/8b-slice/bench.json OUT/1b/bench.json --results benchmarks/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re


def summarize(record: dict, command: str) -> dict:
    s, b, r = record["spec"], record["baseline"], record["ratios"]
    return {
        "spec": s["spec"], "baseline": b["spec"] if b["label"] == "baseline" else f"{s['spec']} with precision.mode={b['label']}",
        "command": command, "fp8_layers": f"{s['fp8_layers']} of {s['total_linear']}",
        "tokens_per_s": {"fp8": s["figures"]["tokens_per_s"], "baseline": b["figures"]["tokens_per_s"], "ratio": r["tokens_per_s"]},
        "mfu": {"fp8": s["figures"]["mfu"], "baseline": b["figures"]["mfu"]},
        "peak_mem_gib": {"fp8": s["figures"]["peak_mem_gib"], "baseline": b["figures"]["peak_mem_gib"]},
        "final_loss": {"fp8": s["figures"]["final_loss"], "baseline": b["figures"]["final_loss"]},
        "steps": len(s["runs"][0]["losses"]) if s["runs"] else 0,
    }


def markdown(env: dict, rows: list[dict]) -> str:
    pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    lines = [f"# FP8 vs bf16 on {env['device_name']}", "",
             f"torch {env['torch']}, torchao {env['torchao']}, fp8launch {env['fp8launch']}; medians over alternating runs.", "",
             "| spec | FP8 layers | tokens/s bf16 | tokens/s FP8 | ratio | MFU bf16 | MFU FP8 | peak mem bf16 / FP8 (GiB) "
             "| loss bf16 / FP8 (steps) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        t, m, mem, loss = row["tokens_per_s"], row["mfu"], row["peak_mem_gib"], row["final_loss"]
        lines.append(f"| {os.path.basename(row['spec'])} | {row['fp8_layers']} | {t['baseline']:,.0f} | {t['fp8']:,.0f} | "
                     f"{t['ratio']:.3f} | "
                     f"{pct(m['baseline'])} | {pct(m['fp8'])} | {mem['baseline']:.1f} / {mem['fp8']:.1f} | "
                     f"{loss['baseline']:.3f} / {loss['fp8']:.3f} ({row['steps']}) |")
    lines += ["", "Commands:", ""] + [f"    {row['command']}" for row in rows]
    return "\n".join(lines) + "\n"


def _command(rec: dict) -> str:
    """The bench command that measured `rec`."""
    baseline = rec["baseline"]
    vs = baseline["spec"] if baseline["label"] == "baseline" else baseline["label"]
    return f"fp8launch bench {rec['spec']['spec']} --vs {vs}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", nargs="+")
    parser.add_argument("--results", default="benchmarks/results")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    args = parser.parse_args()
    records = [json.load(open(p, encoding="utf-8")) for p in args.bench_json]
    env = records[0]["environment"]
    rows = [summarize(rec, _command(rec)) for rec in records]
    device = re.sub(r"[^a-z0-9]+", "-", (env["device_name"] or "unknown").lower()).strip("-")
    stem = os.path.join(args.results, f"{args.date}-{device}")
    os.makedirs(args.results, exist_ok=True)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump({"environment": env, "results": rows}, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(env, rows))
    print(open(stem + ".md", encoding="utf-8").read())


if __name__ == "__main__":
    main()
