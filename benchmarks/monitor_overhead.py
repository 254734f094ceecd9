"""What the FP8 numerics monitor costs per step, on CPU: monitor.fp8_stats_every = 10 vs off.

One training run in ONE process (`launcher.train.main.build_run`, the code `python -m
launcher.train` runs: a gloo group of one, builtin:llama-debug with torchao FP8 tensorwise,
every Linear but the first and the head in FP8), alternating blocks of `every` steps with the
monitor's callback in the loop and blocks without it (then nothing is hooked). Each "on" block
holds exactly one sampled step (hooks on every FP8 layer for its forward and backward, the
rank reduction, the JSONL records), so its time over the adjacent "off" block's time is the
monitor's overhead averaged over its sampling period. Same model, same data stream, same
process: whatever else the machine does hits both alike.

Reported: median block time of each, three estimates of the overhead (target <= 1.05): the ratio
of the median block times, the median of adjacent block ratios (robust to load that drifts: the
headline figure), and 1 + (median sampled step - median unsampled step) / median "off" block;
and the per-step times behind them. On a shared machine the first is the noisiest.

    .venv/bin/python benchmarks/monitor_overhead.py [--every 10] [--pairs 12] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SPEC = """\
version = 1
name = "monitor-overhead"
[precision]
mode = "fp8"
backend = "torchao"
[precision.torchao]
recipe = "{recipe}"
skip_small = false
[distributed]
strategy = "ddp"
procs_per_node = 1
[launch]
device = "cpu"
[train]
model = "builtin:llama-debug"
data = "synthetic"
seq_len = {seq_len}
micro_batch_size = {micro}
steps = {total}
lr = 3e-4
log_every = 1
output_dir = "{out}"
[monitor]
fp8_stats_every = {every}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=10, help="monitor.fp8_stats_every (and the block length)")
    parser.add_argument("--pairs", type=int, default=12, help="measured (off, on) block pairs")
    parser.add_argument("--warmup-blocks", type=int, default=1, help="block pairs run first and left out")
    parser.add_argument("--recipe", default="tensorwise", choices=["tensorwise", "rowwise"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the e2e runs use OMP_NUM_THREADS=1)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "monitor_overhead.json"))
    args = parser.parse_args()

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    import torch

    torch.set_num_threads(args.threads)
    from launcher.commands.plan import plan_one
    from launcher.targets.files import write
    from launcher.train.main import build_run
    from launcher.train.monitor import FP8Monitor
    from launcher.train.parallel import distributed

    pairs = args.warmup_blocks + args.pairs
    total = 2 * pairs * args.every
    blocks = {"off": [], "on": []}
    sampled_step_s, unsampled_on_s, records = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(SPEC.format(recipe=args.recipe, seq_len=args.seq_len, micro=args.micro_batch, total=total,
                                    every=args.every, out=os.path.join(tmp, "run")))
        planned = plan_one(str(spec), os.path.join(tmp, "gen"))
        write(planned.folder, planned.files)
        with open(os.devnull, "w") as devnull:
            trainer, logger = build_run(os.path.join(planned.folder, "plan.json"), stream=devnull)
            monitor = next(c for c in trainer.callbacks if isinstance(c, FP8Monitor))
            monitor.stream = devnull
            others = [c for c in trainer.callbacks if c is not monitor]
            fp8_layers = len(monitor.targets)
            for pair in range(pairs):
                # alternate which goes first; an "on" block always starts right after a multiple of `every`
                for mode in (("off", "on") if pair % 2 == 0 else ("on", "off")):
                    trainer.callbacks = others + ([monitor] if mode == "on" else [])
                    t_block = 0.0
                    for _ in range(args.every):
                        t0 = time.perf_counter()
                        trainer.step_and_log()
                        dt = time.perf_counter() - t0
                        t_block += dt
                        if mode == "on" and pair >= args.warmup_blocks:
                            (sampled_step_s if trainer.state.step % args.every == 0 else unsampled_on_s).append(dt)
                    if pair >= args.warmup_blocks:
                        blocks[mode].append(t_block)
            monitor.finish()
            logger.close()
            records = sum(1 for _ in open(monitor.path)) if os.path.exists(monitor.path) else 0
        distributed.destroy()

    med = {k: statistics.median(v) for k, v in blocks.items()}
    ratio = med["on"] / med["off"]
    pair_ratio = statistics.median(on / off for on, off in zip(blocks["on"], blocks["off"]))
    # the sampled step's extra time over an unsampled step of the same blocks, spread over the period
    extra = statistics.median(sampled_step_s) - statistics.median(unsampled_on_s)
    step_ratio = 1 + extra / med["off"]
    result = {
        "benchmark": "monitor_overhead",
        "what": (f"median time of {args.every}-step blocks, monitor.fp8_stats_every = {args.every} (one sampled step per block) "
                 "vs monitor off (nothing hooked), one process, alternating blocks"),
        "model": "builtin:llama-debug", "precision": f"fp8 torchao {args.recipe}", "fp8_layers": fp8_layers,
        "strategy": "ddp", "world_size": 1, "seq_len": args.seq_len, "micro_batch_size": args.micro_batch,
        "every": args.every, "warmup_block_pairs": args.warmup_blocks, "measured_block_pairs": args.pairs,
        "median_block_s": med, "ratio": ratio, "median_pair_ratio": pair_ratio, "sampled_step_ratio": step_ratio,
        "target_ratio": 1.05,
        "median_step_s": {"off": med["off"] / args.every, "on_unsampled": statistics.median(unsampled_on_s),
                          "on_sampled": statistics.median(sampled_step_s)},
        "records_written": records,
        "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": args.threads,
                    "python": platform.python_version()},
    }
    print(f"{'monitor':<26} {'median s/block':>14} {'median s/step':>14}")
    print(f"{'off':<26} {med['off']:>14.4f} {med['off'] / args.every:>14.4f}")
    print(f"{f'fp8_stats_every = {args.every}':<26} {med['on']:>14.4f} {med['on'] / args.every:>14.4f}")
    print(f"{'  of which a sampled step':<26} {'':>14} {result['median_step_s']['on_sampled']:>14.4f}")
    print(f"{'  an unsampled step':<26} {'':>14} {result['median_step_s']['on_unsampled']:>14.4f}")
    print(f"ratio on / off: {ratio:.3f} of medians, {pair_ratio:.3f} median of adjacent block pairs, {step_ratio:.3f} from the "
          f"sampled step's extra time over an unsampled one (target <= 1.05; "
          f"fp8 torchao {args.recipe}, {fp8_layers} FP8 layers, seq {args.seq_len} x micro {args.micro_batch}, "
          f"{args.threads} thread(s), {args.pairs} block pairs of {args.every} steps after {args.warmup_blocks} warm-up)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
