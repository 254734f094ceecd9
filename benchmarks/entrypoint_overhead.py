"""What the shared entrypoint costs per step over a minimal hand-written loop, on CPU.

Both train the same model (builtin:llama-debug, fp32, same seed), on the same kind of data
(the synthetic token stream), with the same batch, in ONE process, alternating step by step
so that whatever else the machine does hits both alike:

- entrypoint: `launcher.train.main.build_run` (the very code `python -m launcher.train` runs:
  a gloo process group of one, as torchrun with one process gives, the precision backend,
  the engine from the plan, the data stream, the metrics logger writing metrics.jsonl every
  step), then `Trainer.step_and_log()` per step: accumulation loop, fp32 cross entropy,
  backward, gradient-norm clipping, the loss all-reduce and finiteness check, optimizer
  step, lr schedule, metrics record and line (the line goes to /dev/null).
- minimal: model, AdamW, cross entropy, backward, step. No wrapper, no clipping, no logging.

Reported: the median per-step wall time of each after warm-up, and their ratio.

    .venv/bin/python benchmarks/entrypoint_overhead.py [--strategy ddp|fsdp2] [--steps 40] [--out PATH]
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
name = "overhead"
[precision]
mode = "fp32"
[distributed]
strategy = "{strategy}"
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
max_grad_norm = {clip}
log_every = 1
output_dir = "{out}"
"""


def minimal_loop(seed: int, seq_len: int, micro: int, lr: float):
    """The hand-written baseline: returns a `step()` that trains one batch."""
    import torch
    import torch.nn.functional as F

    from launcher.train.data import build_data
    from launcher.train.models import build_model

    torch.manual_seed(seed)
    model = build_model("builtin:llama-debug", ".")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = build_data("synthetic", seq_len=seq_len, micro_batch_size=micro, vocab_size=model.vocab_size,
                      rank=0, world_size=1, seed=seed, spec_dir=".")

    def step() -> float:
        tokens = next(data)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    parser.add_argument("--steps", type=int, default=40, help="measured steps of each (after warm-up)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--clip", type=float, default=1.0, help="entrypoint max_grad_norm (0: no clipping, like the minimal loop)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the e2e runs use OMP_NUM_THREADS=1)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "entrypoint_overhead.json"))
    args = parser.parse_args()

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    import torch

    torch.set_num_threads(args.threads)
    from launcher.commands.plan import plan_one
    from launcher.targets.files import write
    from launcher.train.main import build_run
    from launcher.train.parallel import distributed

    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.toml"
        spec.write_text(SPEC.format(strategy=args.strategy, seq_len=args.seq_len, micro=args.micro_batch, total=total,
                                    clip=args.clip, out=os.path.join(tmp, "run")))
        planned = plan_one(str(spec), os.path.join(tmp, "gen"))
        write(planned.folder, planned.files)
        with open(os.devnull, "w") as devnull:
            trainer, logger = build_run(os.path.join(planned.folder, "plan.json"), stream=devnull)
            minimal = minimal_loop(0, args.seq_len, args.micro_batch, 3e-4)
            times = {"entrypoint": [], "minimal": []}
            losses = {"entrypoint": [], "minimal": []}
            for i in range(total):
                order = [("entrypoint", trainer.step_and_log), ("minimal", minimal)]
                for name, fn in order if i % 2 == 0 else reversed(order):  # alternate who goes first
                    t0 = time.perf_counter()
                    out = fn()
                    times[name].append(time.perf_counter() - t0)
                    losses[name].append(out.loss if name == "entrypoint" else out)
            logger.close()
        distributed.destroy()

    med = {k: statistics.median(v[args.warmup:]) for k, v in times.items()}
    ratio = med["entrypoint"] / med["minimal"]
    # Each step's entrypoint time over the minimal step run right next to it: robust to load that drifts.
    pair_ratio = statistics.median(e / m for e, m in zip(times["entrypoint"][args.warmup:], times["minimal"][args.warmup:]))
    result = {
        "benchmark": "entrypoint_overhead",
        "what": "median per-step wall time, entrypoint (build_run + Trainer.step_and_log) vs a minimal loop, same process, alternating",
        "model": "builtin:llama-debug", "precision": "fp32", "strategy": args.strategy, "world_size": 1,
        "seq_len": args.seq_len, "micro_batch_size": args.micro_batch, "max_grad_norm": args.clip,
        "warmup_steps": args.warmup, "measured_steps": args.steps,
        "median_step_s": med, "ratio": ratio, "median_pair_ratio": pair_ratio,
        "p10_p90_step_s": {k: [_pct(v[args.warmup:], 10), _pct(v[args.warmup:], 90)] for k, v in times.items()},
        "final_loss": {k: v[-1] for k, v in losses.items()},
        "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": args.threads,
                    "python": platform.python_version()},
    }
    print(f"{'loop':<12} {'median s/step':>14} {'p10':>8} {'p90':>8} {'final loss':>11}")
    for k in ("entrypoint", "minimal"):
        p10, p90 = result["p10_p90_step_s"][k]
        print(f"{k:<12} {med[k]:>14.4f} {p10:>8.4f} {p90:>8.4f} {result['final_loss'][k]:>11.4f}")
    print(f"ratio entrypoint / minimal: {ratio:.3f} of medians, {pair_ratio:.3f} median of adjacent pairs "
          f"({args.strategy}, world size 1, max_grad_norm {args.clip}, "
          f"seq {args.seq_len} x micro {args.micro_batch}, {args.threads} thread(s), {args.steps} steps after {args.warmup} warm-up)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}")


def _pct(values: list[float], p: int) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
