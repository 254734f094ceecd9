"""Which SEED gives the CPU support matrix that costs CI least, by the generator's own cost model.

    python benchmarks/matrix_seed.py [FIRST:LAST]     (default 0:80, ~12 s a seed on 2 cores; the JSON only for the default)

For each seed of launcher/planning/support_matrix.py's generator: the CPU and MoE matrices' trained runs, compiled
runs, distinct graph keys (each one compiles from an empty cache in CI) and modelled CPU seconds
(Matrix.modelled_cpu_s: EAGER_CPU_S / WARM_CPU_S / NEW_GRAPH_CPU_S as measured). Every matrix covers every pair: the
seed only changes how cheaply. A seed is eligible only where the CPU matrix keeps a compiled FP8 run with the monitor's
hooks (tests/test_support_matrix.py::test_the_cpu_matrix_trains_the_monitor_inside_compiled_fp8_blocks). Prints a table,
eligible and cheapest first, and writes benchmarks/results/matrix_seed.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import launcher.planning.support_matrix as sm

RESULTS = Path(__file__).resolve().parent / "results" / "matrix_seed.json"


def measure(seed: int) -> dict:
    sm.SEED = seed
    sm._generate.cache_clear()
    row = {"seed": seed}
    for kind, matrix in (("cpu", sm.generate()), ("moe", sm.generate(sm.MOE_OPTIONS, sm.MOE_BASE, "e"))):
        assert matrix.covered() == set(matrix.pairs)
        compiled = [r for r in matrix.trained if sm.graph_key(r.config) is not None]
        row[kind] = {"trained": len(matrix.trained), "compiled": len(compiled), "graph_keys": len(matrix.graph_keys()),
                     "modelled_cpu_s": round(matrix.modelled_cpu_s())}
        if kind == "cpu":
            row["eligible"] = any(r.config.get("compile.enabled") and r.config.get("monitor.fp8_stats_every")
                                  and r.config.get("precision.mode") == "fp8" for r in matrix.trained)
    row["modelled_cpu_s"] = row["cpu"]["modelled_cpu_s"] + row["moe"]["modelled_cpu_s"]
    return row


def main(argv: list[str]) -> int:
    first, last = map(int, (argv[0] if argv else "0:80").split(":"))
    committed = sm.SEED
    rows = []
    for seed in range(first, last):
        rows.append(measure(seed))
        print(f"seed {seed}: {rows[-1]['modelled_cpu_s']} CPU s", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: (not r["eligible"], r["modelled_cpu_s"], r["seed"]))
    print("| seed | eligible | CPU runs (compiled, graph keys) | MoE runs (compiled, graph keys) | modelled CPU s |")
    print("|---:|---|---|---|---:|")
    for r in rows[:15]:
        c, m = r["cpu"], r["moe"]
        mark = " (committed)" if r["seed"] == committed else ""
        cells = [f"{r['seed']}{mark}", "yes" if r["eligible"] else "no", f"{c['trained']} ({c['compiled']}, {c['graph_keys']})",
                 f"{m['trained']} ({m['compiled']}, {m['graph_keys']})", str(r["modelled_cpu_s"])]
        print("| " + " | ".join(cells) + " |")
    if argv:
        return 0
    RESULTS.write_text(json.dumps({"committed_seed": committed, "costs_cpu_s": {"eager": sm.EAGER_CPU_S, "warm_compiled": sm.WARM_CPU_S,
                                   "new_graph": sm.NEW_GRAPH_CPU_S}, "seeds": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
