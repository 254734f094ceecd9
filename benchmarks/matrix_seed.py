"""Which SEED gives the CPU support matrix that costs CI least, by the generator's own cost model.

    python benchmarks/matrix_seed.py [FIRST:LAST]     (default 0:80, ~6 s a seed on 2 cores; the JSON only for the default)

For each seed of tools/support_matrix.py's generator (SEED shapes the CPU matrix only; the MoE and GPU
matrices keep 0): the CPU matrix's trained runs, compiled runs, distinct graph keys (each one compiles from an empty
cache in CI) and modelled CPU seconds
(Matrix.modelled_cpu_s: EAGER_CPU_S / WARM_CPU_S / NEW_GRAPH_CPU_S as measured). Every matrix covers every pair: the
seed only changes how cheaply. A seed is eligible only where the CPU matrix keeps a compiled FP8 run with the monitor's
hooks (Matrix.trains_the_monitor_in_compiled_fp8, which tests/test_support_matrix.py holds the committed matrix to). Prints a table,
eligible and cheapest first, and writes benchmarks/results/matrix_seed.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is no installed package

import tools.support_matrix as sm  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "matrix_seed.json"


def measure(seed: int) -> dict:
    sm.SEED = seed
    sm._generate.cache_clear()
    matrix = sm.generate()
    assert matrix.covered() == set(matrix.pairs)
    return {"seed": seed, "trained": len(matrix.trained), "compiled": sum(sm.graph_key(r.config) is not None for r in matrix.trained),
            "graph_keys": len(matrix.graph_keys()), "modelled_cpu_s": round(matrix.modelled_cpu_s()),
            "eligible": matrix.trains_the_monitor_in_compiled_fp8()}


def main(argv: list[str]) -> int:
    first, last = map(int, (argv[0] if argv else "0:80").split(":"))
    committed = sm.SEED
    rows = []
    for seed in range(first, last):
        rows.append(measure(seed))
        print(f"seed {seed}: {rows[-1]['modelled_cpu_s']} CPU s", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: (not r["eligible"], r["modelled_cpu_s"], r["seed"]))
    print("| seed | eligible | CPU runs (compiled, graph keys) | modelled CPU s |")
    print("|---:|---|---|---:|")
    for r in rows[:15]:
        mark = " (committed)" if r["seed"] == committed else ""
        cells = [f"{r['seed']}{mark}", "yes" if r["eligible"] else "no", f"{r['trained']} ({r['compiled']}, {r['graph_keys']})",
                 str(r["modelled_cpu_s"])]
        print("| " + " | ".join(cells) + " |")
    if argv:
        return 0
    RESULTS.write_text(json.dumps({"committed_seed": committed, "costs_cpu_s": {"eager": sm.EAGER_CPU_S, "warm_compiled": sm.WARM_CPU_S,
                                   "new_graph": sm.NEW_GRAPH_CPU_S}, "seeds": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
