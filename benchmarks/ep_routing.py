"""What the expert-parallel routing indices cost per MoE layer, on CPU: the vectorised `_routing`
(launcher/train/parallel/expert_parallel.py) vs the per-row Python walk it replaced (issue 28, item 5; the old
code is kept as `routing_reference` in tests/train/test_expert_parallel.py, which checks that the two
agree on random count matrices).

The case: 64 experts, expert_parallel = 2, 16384 rows routed by each rank (e.g. 2048 tokens x top-8),
the expert of each row drawn from a multinomial over the experts (probabilities from a softmax of
Gaussian logits: unequal loads, each EP rank's experts 1 / ep of the rows). Rank 0 holds experts 0..31,
so it receives a (2, 32) count matrix whose entries sum to ~16384. Timed, old and new alternating in
one process, for align 32 (a GroupedExperts that is not fp8launch's: dispatch pads each group for
MXFP8) and align 1 (fp8launch's own experts):

  - `_routing` alone;
  - the local part of dispatch + combine, without process groups: the two split lists (.tolist()),
    `_routing`, the padded expert input `cat([rows, zero row])[gather]` and the combine's
    `out[place]`, with the received rows standing in for the all-to-all's output (R x dim).

Reported: median ms of each, the speed-up as the ratio of the medians and the median of the ratios of
adjacent (old, new) pairs; figures from one run only, so the ratios compare like with like.

    .venv/bin/python benchmarks/ep_routing.py [--repeats 50] [--threads 1] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def received_counts(torch, experts: int, ep: int, rows: int, seed: int):
    """(counts each rank sends (ep, experts), the (ep, experts / ep) matrix rank 0 receives). Each EP
    rank's experts get 1 / ep of the traffic (so rank 0 receives ~rows), unequally among themselves."""
    gen = torch.Generator().manual_seed(seed)
    sent = []
    for _ in range(ep):
        probs = torch.randn(ep, experts // ep, generator=gen).mul(0.5).softmax(1).div(ep).reshape(-1)
        picks = torch.multinomial(probs, rows, replacement=True, generator=gen)
        sent.append(torch.bincount(picks, minlength=experts))
    sent = torch.stack(sent)
    return sent, sent[:, : experts // ep].contiguous()


def local_dispatch_combine(torch, route, sent, received, rows, ep: int, align: int):
    """dispatch_tokens and combine_tokens less their all-to-alls (rows: what the all-to-all received)."""
    input_splits = sent.view(ep, -1).sum(dim=1).tolist()
    output_splits = received.sum(dim=1).tolist()
    local_counts, gather, place = route(received, ep, align)
    padded = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])[gather]
    back = padded[place]  # the experts' output would be here
    return input_splits, output_splits, local_counts, padded, back


def ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def compare(old, new, warmup: int, repeats: int) -> dict:
    """Old and new alternating, one call each per round (load on the machine hits both alike)."""
    for _ in range(warmup):
        old(), new()
    t_old, t_new = [], []
    for _ in range(repeats):
        t_old.append(ms(old))
        t_new.append(ms(new))
    m_old, m_new = statistics.median(t_old), statistics.median(t_new)
    return {"median_ms_old": m_old, "median_ms_new": m_new, "speedup": m_old / m_new,
            "speedup_median_pair": statistics.median(o / n for o, n in zip(t_old, t_new)),
            "min_ms_old": min(t_old), "min_ms_new": min(t_new)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--ep", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16384, help="rows each rank routes (tokens x top-k)")
    parser.add_argument("--aligns", type=int, nargs="+", default=[32, 1])
    parser.add_argument("--dim", type=int, default=1024, help="hidden size of the rows (local dispatch + combine)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the e2e runs use OMP_NUM_THREADS=1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ep_routing.json"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from launcher.train.parallel.expert_parallel import _routing
    from tests.train.test_expert_parallel import routing_reference

    sent, received = received_counts(torch, args.experts, args.ep, args.rows, args.seed)
    total = int(received.sum())
    rows = torch.randn(total, args.dim).to(getattr(torch, args.dtype))
    results = []
    for align in args.aligns:
        old_idx, new_idx = routing_reference(received, args.ep, align), _routing(received, args.ep, align)
        if not all(torch.equal(o, n) for o, n in zip(old_idx, new_idx)):
            raise SystemExit(f"_routing and routing_reference disagree for align {align}: fix before timing")
        back = local_dispatch_combine(torch, _routing, sent, received, rows, args.ep, align)[-1]
        if not torch.equal(back, rows):
            raise SystemExit("the local dispatch + combine did not return every row to its place")
        results.append({"what": "_routing", "align": align, **compare(
            lambda: routing_reference(received, args.ep, align), lambda: _routing(received, args.ep, align),
            args.warmup, args.repeats)})
        results.append({"what": "local dispatch + combine", "align": align, **compare(
            lambda: local_dispatch_combine(torch, routing_reference, sent, received, rows, args.ep, align),
            lambda: local_dispatch_combine(torch, _routing, sent, received, rows, args.ep, align),
            args.warmup, args.repeats)})

    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/" + Path(__file__).name, *sys.argv[1:]])
    table = [f"{'what':<26}{'align':>6}{'median ms old':>15}{'median ms new':>15}{'speed-up':>10}{'median pair':>13}"]
    for r in results:
        table.append(f"{r['what']:<26}{r['align']:>6}{r['median_ms_old']:>15.3f}{r['median_ms_new']:>15.3f}"
                     f"{r['speedup']:>9.1f}x{r['speedup_median_pair']:>12.1f}x")
    setting = (f"{args.experts} experts, EP {args.ep}, {args.rows} rows routed per rank; rank 0 receives a "
               f"{tuple(received.shape)} count matrix of {total} rows (per expert {int(received.sum(0).min())}.."
               f"{int(received.sum(0).max())}); rows {args.dim} x {args.dtype}; {args.threads} thread(s), "
               f"{args.repeats} alternating repeats after {args.warmup} warm-up")
    print("\n".join(table))
    print(setting)

    machine = {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
               "torch": torch.__version__, "threads": args.threads}
    result = {
        "benchmark": "ep_routing",
        "what": "median ms of the old (per-row Python walk) and new (tensor ops) expert-parallel _routing, alone and "
                "with the local part of dispatch + combine (no collectives), old and new alternating in one run",
        "command": command,
        "date": datetime.date.today().isoformat(),
        "machine": machine,
        "experts": args.experts, "expert_parallel": args.ep, "rows_routed_per_rank": args.rows,
        "received_counts": received.tolist(), "received_rows": total, "dim": args.dim, "dtype": args.dtype,
        "repeats": args.repeats, "warmup": args.warmup, "seed": args.seed,
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    md = [f"# Expert-parallel routing indices: Python walk vs tensor ops (CPU, {result['date']})", "",
          f"`{command}` on {machine['cpu_model']} ({machine['cpu_count']} cores), "
          f"torch {machine['torch']}, Python {machine['python']}. {setting}. `_routing` alone, and the local part "
          "of dispatch + combine (split lists, `_routing`, the padded expert input and the combine's `out[place]`, "
          "no all-to-all). Speed-up: ratio of the medians, and the median of adjacent (old, new) pair ratios; all "
          f"from this one run. JSON: [{out.name}]({out.name}).", "",
          "| what | align | median ms old | median ms new | speed-up | median pair ratio |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['what']} | {r['align']} | {r['median_ms_old']:.3f} | {r['median_ms_new']:.3f} | {r['speedup']:.1f}x | "
           f"{r['speedup_median_pair']:.1f}x |" for r in results]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
