"""MS-AMP's levels natively on this CPU: does training with FP8 Adam moments, an FP8 gradient reduction and bf16 master
weights still converge, and how many bytes per parameter does each level keep and send, measured.

    python benchmarks/msamp_levels.py [--steps 200] [--out benchmarks/results]

Every run is a real `fp8launch run` (torchrun, 2 processes over gloo, DDP), the builtin debug Llama (4 blocks) in
torchao FP8 (tensorwise), the synthetic corpus, seq 64 x micro-batch 2 per rank, lr 3e-3 with 10 warm-up steps and
cosine decay, seed 0:
- convergence: fp32 moments (torch's AdamW) vs fp8 moments (torchao's AdamWFp8) vs fp8 moments + FP8 gradient
  reduction + bf16 master weights (MS-AMP's O2 natively), `--steps` steps each; the bound: the mean loss of the last
  20 steps within 5% of the fp32 run's;
- bytes: those runs' measured optimizer_state_bytes and grad_comm_bytes (metrics.jsonl), and short runs of the other
  levels (O1 natively under DDP, O3 natively under FSDP2 with float8 all-gather, the fp32 baseline under FSDP2).

Writes msamp_levels.json (every run: its spec keys, losses, measured bytes, bytes per parameter, times) and
msamp_levels.png (the loss curves and the bytes per parameter) under --out. ~9 min on 2 cores at the default steps;
each run with a torchao optimizer spends ~25-70 s of it compiling torchao's Adam step at its first step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from launcher.planning.levels import MSAMP_LEVELS  # noqa: E402
from launcher.planning.read import nested  # noqa: E402
from launcher.targets.toml_text import toml_text  # noqa: E402

BASE = {
    "version": 1,
    "precision.mode": "fp8", "precision.backend": "torchao", "precision.torchao.skip_small": False,
    "distributed.strategy": "ddp", "distributed.procs_per_node": 2,
    "launch.device": "cpu", "launch.env": {"OMP_NUM_THREADS": "1"},
    "train.model": "builtin:llama-debug", "train.seq_len": 64, "train.micro_batch_size": 2, "train.lr": 3e-3,
    "train.warmup_steps": 10, "train.log_every": 1, "train.checkpoint_at_end": False, "train.seed": 0,
}
CONVERGENCE = {
    "fp32 moments": {},
    "fp8 moments": {"precision.optimizer_states": "fp8"},
    "fp8 moments + fp8 reduce + bf16 master (O2 natively)": {k: v for k, v in MSAMP_LEVELS["O2"].items()},
}
"""The three runs compared over --steps (the default DDP reduction is fp32, gradients of fp32 weights)."""
SHORT = {
    "O1 natively (DDP)": dict(MSAMP_LEVELS["O1"]),
    "fp32 moments (FSDP2)": {"distributed.strategy": "fsdp2"},
    "O3 natively (FSDP2, float8 all-gather)": dict(MSAMP_LEVELS["O3"]),
}
"""The other levels, for their bytes: a few steps each."""
SHORT_STEPS = 6
TAIL = 20
BOUND = 0.05
"""The convergence bound: the last TAIL steps' mean loss within this fraction of the fp32 run's."""


def run(folder: Path, name: str, keys: dict, steps: int) -> dict:
    """One `fp8launch run`; its metrics.jsonl as a record."""
    flat = {**BASE, "name": name, "train.steps": steps, **keys}
    spec = folder / f"{name}.toml"
    spec.write_text(toml_text(nested(flat)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    fp8launch = Path(sys.executable).parent / "fp8launch"
    t0 = time.monotonic()
    done = subprocess.run([str(fp8launch), "run", str(spec)], cwd=folder, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lines = [json.loads(x) for x in (folder / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    start = next(x for x in lines if x["event"] == "start")
    steps_ = [x for x in lines if x["event"] == "step"]
    last = steps_[-1]
    params = start["parameters"]
    shards = 2 if flat["distributed.strategy"] == "fsdp2" else 1
    weight_bytes = 2 if start["effects"]["master_weights"] == "bf16" else 4
    print(f"{name}: {wall:.0f} s, final loss {last['loss']:.4f}, optimizer state {last['optimizer_state_bytes']:,} B, "
          f"gradient reduction {last['grad_comm_bytes']:,} B per step", flush=True)
    return {
        "keys": keys, "steps": len(steps_), "wall_s": round(wall, 1),
        "first_step_s": round(steps_[0]["step_time_s"], 2),
        "median_step_s": round(statistics.median(x["step_time_s"] for x in steps_[1:]), 4),
        "losses": [x["loss"] for x in steps_],
        "tail_loss": statistics.fmean(x["loss"] for x in steps_[-TAIL:]) if len(steps_) >= TAIL else None,
        "effects": {k: start["effects"][k] for k in ("optimizer", "optimizer_states", "grad_reduce", "master_weights", "all_gather_dtype")},
        "parameters": params,
        "optimizer_state_bytes": last["optimizer_state_bytes"], "grad_comm_bytes": last["grad_comm_bytes"],
        "bytes_per_param": {  # per parameter of the model; this rank holds 1 / shards of them under FSDP2
            "weights": weight_bytes, "optimizer_states": round(last["optimizer_state_bytes"] * shards / params, 4),
            "grad_comm_per_step": round(last["grad_comm_bytes"] / params, 4)},
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, r in result["convergence"].items():
        losses = r["losses"]
        smooth = [statistics.fmean(losses[max(0, i - 9):i + 1]) for i in range(len(losses))]
        a.plot(range(1, len(losses) + 1), smooth, label=f"{name}: last {TAIL} {r['tail_loss']:.3f}")
    a.set(xlabel="step", ylabel="loss (mean of 10 steps)", title="llama-debug, torchao FP8, DDP x 2 (CPU)")
    a.legend(fontsize=8)
    runs = {**result["convergence"], **result["short"]}
    names = list(runs)
    x = range(len(names))
    states = [runs[n]["bytes_per_param"]["optimizer_states"] for n in names]
    comm = [runs[n]["bytes_per_param"]["grad_comm_per_step"] for n in names]
    b.bar([i - 0.2 for i in x], states, width=0.4, label="optimizer state (measured)")
    b.bar([i + 0.2 for i in x], comm, width=0.4, label="gradient bytes sent per step (measured)")
    b.set_xticks(list(x), [n.replace(" (", "\n(").replace(" + ", "\n+ ") for n in names], fontsize=6)
    b.set(ylabel="bytes per parameter", title="measured bytes per parameter")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="msamp-levels-") as tmp:
        folder = Path(tmp)
        convergence = {name: run(folder, f"c{i}", keys, args.steps) for i, (name, keys) in enumerate(CONVERGENCE.items())}
        short = {name: run(folder, f"s{i}", keys, SHORT_STEPS) for i, (name, keys) in enumerate(SHORT.items())}
    base = convergence["fp32 moments"]
    gaps = {name: (r["tail_loss"] - base["tail_loss"]) / base["tail_loss"] for name, r in convergence.items()}
    result = {
        "what": __doc__.split("\n\n")[0],
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "base": BASE, "tail": TAIL, "bound": BOUND,
        "convergence": convergence, "short": short,
        "tail_loss_gap": {k: round(v, 5) for k, v in gaps.items()},
        "within_bound": all(abs(g) <= BOUND for g in gaps.values()),
        "seconds": round(time.monotonic() - t0, 1),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "msamp_levels.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out / "msamp_levels.png")
    print(json.dumps({"tail_loss_gap": result["tail_loss_gap"], "within_bound": result["within_bound"], "seconds": result["seconds"]}))


if __name__ == "__main__":
    main()
