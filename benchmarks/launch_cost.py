"""What one short `fp8launch run` costs in CPU seconds, all its processes together (the CLI, torchrun's agent, the
ranks), now against a baseline, alternating run by run in one process so that whatever else the machine does hits
both alike. On a 2-core machine running CI's tests two at a time, a test's CPU seconds, not its wall time, are what
it costs (benchmarks/results/ci_cpu.md): most of a 2-step CPU run is its processes starting.

The baseline: torchao's Triton-only Inductor patch applied in every rank, as before fp8launch skipped it off CUDA
(benchmarks/launch_cost/sitecustomize.py on PYTHONPATH). The runs: the support matrix's shape (2 processes, 2 blocks
of llama-debug, 32 tokens, 2 steps, eager), torchao FP8 tensorwise on FSDP2 and rowwise on DDP, and bf16 on FSDP2,
where nothing differs (the control). A launch's CPU seconds spread by ~10% on a shared 2-core machine, as much as the
difference measured, so the same difference is also measured where it happens alone: a new process that builds a
2-block llama-debug and converts it to torchao FP8 tensorwise on CPU, as a rank does (--conversions pairs of them).

    .venv/bin/python benchmarks/launch_cost.py [--pairs 3] [--conversions 8] [--out benchmarks/results/launch_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RUNS = {
    "fp8 tensorwise, fsdp2": {"precision.mode": "fp8", "distributed.strategy": "fsdp2"},
    "fp8 rowwise, ddp": {"precision.mode": "fp8", "precision.torchao.recipe": "rowwise", "distributed.strategy": "ddp"},
    "bf16, fsdp2 (control)": {"precision.mode": "bf16", "distributed.strategy": "fsdp2"},
}
VARIANTS = ("now", "baseline")


def _cpu_children() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def one_run(spec: Path, folder: Path, variant: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of `fp8launch run SPEC`: every process it started was waited for, so the children's
    rusage holds them all."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    if variant == "baseline":
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "benchmarks" / "launch_cost"), env.get("PYTHONPATH", "")])
    cpu, t0 = _cpu_children(), time.monotonic()
    r = subprocess.run([str(Path(sys.executable).parent / "fp8launch"), "run", str(spec)], cwd=folder, env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{spec.name} ({variant}) failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return _cpu_children() - cpu, time.monotonic() - t0


CONVERT = """
import sys, torch
import launcher.train.precision.torchao_fp8 as torchao_fp8
from launcher.train.precision import apply_precision
from tests.train._precision import TinyLlama, fp8_plan
if sys.argv[1] == "baseline":
    torchao_fp8.skips_triton_codegen_patch = lambda device: False
apply_precision(TinyLlama(), fp8_plan(torchao={"skip_small": False}), torch.device("cpu"))
"""


def one_conversion(variant: str) -> float:
    cpu = _cpu_children()
    subprocess.run([sys.executable, "-c", CONVERT, variant], cwd=REPO, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    return _cpu_children() - cpu


def alternating(pairs: int, measure) -> dict[str, list[float]]:
    """`measure(variant)` `pairs` times for each variant, the order flipped every pair."""
    cpu = {v: [] for v in VARIANTS}
    for i in range(pairs):
        for v in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
            cpu[v].append(measure(v))
    return cpu


def compared(label: str, cpu: dict[str, list[float]]) -> dict:
    """The medians and their ratio, printed as one line of the table."""
    now, base = statistics.median(cpu["now"]), statistics.median(cpu["baseline"])
    print(f"{label:24s} now {now:6.2f} CPU-s  baseline {base:6.2f}  ratio {now / base:.3f}  "
          f"(now {min(cpu['now']):.2f}-{max(cpu['now']):.2f}, baseline {min(cpu['baseline']):.2f}-{max(cpu['baseline']):.2f})")
    return {"cpu_s": cpu, "median_cpu_s": {"now": now, "baseline": base}, "ratio_now_to_baseline": now / base}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is no installed package
    from tools.support_matrix import spec_of

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--conversions", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "launch_cost.json"))
    args = parser.parse_args()

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for label, config in RUNS.items() if args.pairs else ():
            name = "r" + str(len(results))
            spec = folder / f"{name}.json"
            spec.write_text(json.dumps(spec_of(config, name), indent=1))
            results[label] = compared(label, alternating(args.pairs, lambda v: one_run(spec, folder, v)[0]))
    conversion = compared("conversion, one process", alternating(args.conversions, one_conversion))

    record = {
        "benchmark": "launch_cost",
        "what": "CPU seconds of one 2-process, 2-step eager `fp8launch run` (the CLI, torchrun, both ranks), now vs the baseline "
                "(torchao's Triton-only Inductor patch applied in every rank), alternating; medians and their ratio",
        "pairs": args.pairs,
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": _torch_version()},
        "runs": results,
        "conversion": {"what": "CPU seconds of a new process that builds a 2-block llama-debug and converts it to torchao FP8 "
                               "tensorwise on CPU, now vs the baseline, alternating", "pairs": args.conversions,
                       **conversion},
    }
    Path(args.out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


def _torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


if __name__ == "__main__":
    main()
