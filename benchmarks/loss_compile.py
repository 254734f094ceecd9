"""The training loss eager vs compiled (launcher/train/loop.py `loss_function`), forward + backward on bf16 logits:
time and peak memory allocated by torch, measured in the same run, alternating.

    python benchmarks/loss_compile.py [--tokens 2048] [--vocab 32000] [--repeats 10]

Writes benchmarks/results/loss_compile.json. On a CPU this measures Inductor's C++ kernels; the memory saved (the
fp32 copy of the logits and its softmax never written) is what a GPU saves too, in proportion to tokens x vocab.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launcher.train.loss import cross_entropy  # noqa: E402


def peak_bytes(fn, logits, targets) -> int:
    """Peak bytes torch allocated during one forward + backward (the profiler's memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = fn(logits, targets)
        loss.backward()
    peak = now = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        if e.cpu_memory_usage:
            now += e.cpu_memory_usage
            peak = max(peak, now)
    logits.grad = None
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "loss_compile.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    logits = torch.randn(1, args.tokens, args.vocab, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, args.vocab, (1, args.tokens))
    compiled = torch.compile(cross_entropy, fullgraph=True)
    variants = {"eager": cross_entropy, "compiled": compiled}
    for fn in variants.values():  # warm-up (compiles)
        for _ in range(2):
            fn(logits, targets).backward()
            logits.grad = None
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn(logits, targets).backward()
            times[name].append(time.perf_counter() - t0)
            logits.grad = None
    peaks = {name: peak_bytes(fn, logits, targets) for name, fn in variants.items()}
    loss_e, loss_c = cross_entropy(logits, targets).item(), compiled(logits, targets).item()
    rows = {name: {"median_ms": 1e3 * statistics.median(t), "peak_mib": peaks[name] / 2**20} for name, t in times.items()}
    record = {"tokens": args.tokens, "vocab": args.vocab, "repeats": args.repeats, "rows": rows,
              "time_ratio_compiled_over_eager": rows["compiled"]["median_ms"] / rows["eager"]["median_ms"],
              "memory_ratio_compiled_over_eager": rows["compiled"]["peak_mib"] / rows["eager"]["peak_mib"],
              "loss_eager": loss_e, "loss_compiled": loss_c, "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(),
              "threads": torch.get_num_threads(), "command": "python benchmarks/loss_compile.py " + " ".join(sys.argv[1:])}
    print(f"{'loss':<10} {'median ms':>10} {'peak MiB':>10}")
    for name, row in rows.items():
        print(f"{name:<10} {row['median_ms']:>10.1f} {row['peak_mib']:>10.1f}")
    print(f"compiled / eager: time {record['time_ratio_compiled_over_eager']:.2f}x, peak memory "
          f"{record['memory_ratio_compiled_over_eager']:.2f}x; losses {loss_e:.6f} / {loss_c:.6f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
