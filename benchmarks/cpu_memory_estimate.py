"""The plan's memory estimate per rank against the peak resident memory a real CPU run reaches, for the margin of
the CPU-MEMORY preflight refusal (launcher/commands/preflight.py): a run is refused when procs_per_node x the
estimate exceeds MemAvailable, so the estimate must never be above what a run really takes.

Each variant is `fp8launch run` of a small spec (CPU, seq 64, micro-batch 2, 3 steps, no checkpoint); the measured
figure is rank 0's VmHWM (metrics.jsonl's peak_mem_gib, the most of its step records); the estimate is the larger of
launcher/planning/memory.py's peak (model states + activations) and initialisation peak. The ratio is estimate /
measured; the baseline beside it is the same measure of an empty torch process (`import torch`, one tiny matmul).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_memory_estimate.py [--out benchmarks/results/cpu_memory_estimate.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30
VARIANTS = {
    "debug-ddp-2": ["train.model=builtin:llama-debug", "distributed.strategy=ddp", "distributed.procs_per_node=2"],
    "small-ddp-1": ["train.model=builtin:llama-small", "distributed.strategy=ddp", "distributed.procs_per_node=1"],
    "small-ddp-1-fp32": ["train.model=builtin:llama-small", "distributed.strategy=ddp", "distributed.procs_per_node=1",
                         "precision.mode=fp32"],
    "small-fsdp2-2": ["train.model=builtin:llama-small", "distributed.strategy=fsdp2", "distributed.procs_per_node=2"],
    "small-fsdp2-2-fp8": ["train.model=builtin:llama-small", "distributed.strategy=fsdp2", "distributed.procs_per_node=2",
                          "precision.mode=fp8", "precision.backend=torchao", "precision.torchao.skip_small=false"],
    "small-zero2-2": ["train.model=builtin:llama-small", "distributed.strategy=deepspeed", "distributed.procs_per_node=2"],
    "small-ddp-1-seq1024": ["train.model=builtin:llama-small", "distributed.strategy=ddp", "distributed.procs_per_node=1",
                            "train.seq_len=1024", "train.micro_batch_size=4"],
    "small-ddp-1-seq1024-ac": ["train.model=builtin:llama-small", "distributed.strategy=ddp", "distributed.procs_per_node=1",
                               "train.seq_len=1024", "train.micro_batch_size=4", "activation_checkpointing.mode=full"],
    "1b2-ddp-1": ["train.model=builtin:llama3-1b?layers=2&vocab=8192", "distributed.strategy=ddp", "distributed.procs_per_node=1"],
}
SPEC = """\
version = 1
name = "mem"
[launch]
device = "cpu"
[precision]
mode = "bf16"
[train]
model = "builtin:llama-debug"
seq_len = 64
micro_batch_size = 2
steps = 3
log_every = 1
checkpoint_at_end = false
resume = "never"
"""


def estimate(spec: Path, sets: list[str]) -> dict:
    from launcher.commands.run import plan_for_run
    from launcher.planning.memory import estimate, model_params

    plan = plan_for_run(str(spec), sets).plan
    est = estimate(plan, model_params(plan.train.model))
    return {"params": est.params, "peak_gib": est.peak_bytes / GIB, "init_gib": est.init_peak.bytes / GIB,
            "per_rank_gib": max(est.peak_bytes, est.init_peak.bytes) / GIB}


def measure(spec: Path, sets: list[str], out: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    args = [str(Path(sys.executable).parent / "fp8launch"), "run", str(spec), *[a for s in sets for a in ("--set", s)],
            "--set", f"train.output_dir={out}"]
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=spec.parent)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}")
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return max(s["peak_mem_gib"] for s in steps if s.get("event") == "step")


def torch_alone() -> float:
    code = ("import torch; torch.ones(8, 8) @ torch.ones(8, 8); "
            "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')) / 2**20)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return float(r.stdout.strip())


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.machine()
    return f"{name}, {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "cpu_memory_estimate.json"))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "mem.toml"
        spec.write_text(SPEC)
        for name in args.variants:
            e = estimate(spec, VARIANTS[name])
            measured = measure(spec, VARIANTS[name], Path(tmp) / name)
            rows.append({"variant": name, "sets": VARIANTS[name], **e, "measured_gib": measured,
                         "ratio": e["per_rank_gib"] / measured})
            print(f"{name:<20} params {e['params'] / 1e6:7.1f}M  estimate {e['per_rank_gib']:.3f} GiB  "
                  f"measured {measured:.3f} GiB  ratio {rows[-1]['ratio']:.3f}", flush=True)
    result = {"machine": _cpu(), "python": platform.python_version(),
              "torch_alone_gib": torch_alone(), "rows": rows, "max_ratio": max(r["ratio"] for r in rows)}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"torch alone {result['torch_alone_gib']:.3f} GiB; largest estimate / measured: {result['max_ratio']:.3f}")


if __name__ == "__main__":
    main()
