"""Helpers for the end-to-end runs: write a spec, run `fp8launch run` as a user would (a real
subprocess, real torchrun, real processes on this CPU), and read metrics.jsonl back."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support import write_toml_spec

FP8LAUNCH = str(Path(sys.executable).parent / "fp8launch")
RUN_TIMEOUT_S = 900
"""A guard against a run that hangs, not a speed check: the slowest run (compiled MXFP8 experts under expert parallel, from
an empty Inductor cache) took 194 s on an AMX Xeon of this machine kind and over 300 s on an AMD EPYC one (2026-11-27,
whose `import torch` is 2.4x slower), with the other pytest worker's runs beside it."""

FP8_LAYERS, TOTAL_LINEAR = 27, 29
"""llama-debug under torchao FP8 with skip_small = false: every Linear but the first (keep_first_last) and the head."""

BASE = {
    "version": 1,
    "launch.device": "cpu",
    "train.model": "builtin:llama-debug",
    "train.seq_len": 64,
    "train.micro_batch_size": 2,
    "train.steps": 12,
    "train.lr": 3e-3,
    "train.log_every": 1,
    "distributed.procs_per_node": 2,
}

FP8 = {
    "precision.mode": "fp8",
    "precision.backend": "torchao",
    "precision.torchao.recipe": "tensorwise",
    "precision.torchao.skip_small": False,  # llama-debug's GEMMs are all "small" for torchao's H100 heuristic
}


def write_spec(folder: Path, name: str, **keys) -> Path:
    """A spec of BASE + `keys` (dotted keys; in keyword form "__" stands for ".") in folder/NAME.toml."""
    values = {**BASE, "name": name, **{k.replace("__", "."): v for k, v in keys.items()}}
    return write_toml_spec(folder / f"{name}.toml", values)


def env() -> dict[str, str]:
    """The runs' environment: one OpenMP thread per process (2 cores here), and DeepSpeed's
    JIT-built CPU ops cached per Python environment: sessions sharing HOME with another
    torch/DeepSpeed install otherwise rebuild them in turn (~1-2 min each time)."""
    prefix = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser(f"~/.cache/torch_extensions/fp8launch-{prefix}")
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TORCH_EXTENSIONS_DIR": extensions}


def run(cwd: Path, *args: str, timeout: float = RUN_TIMEOUT_S, extra_env: dict[str, str] | None = None
        ) -> tuple[subprocess.CompletedProcess, float]:
    """`fp8launch ARGS` in `cwd` (with `extra_env` on top of the runs' environment); returns the result and its wall time."""
    t0 = time.monotonic()
    r = subprocess.run([FP8LAUNCH, *args], cwd=cwd, env={**env(), **(extra_env or {})}, capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t0


def native_crash(output_dir: Path) -> str | None:
    """The first failure torchrun reports for a run whose rank died of a segmentation fault or an abort (its log's "Root
    Cause"), else None. A Python error in a rank exits 1 and is not one."""
    log = output_dir / "logs" / "torchrun.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    cause = text.split("Root Cause (first observed failure):", 1)[-1] if "Root Cause" in text else ""
    return " ".join(cause.split())[:300] if "(SIGSEGV)" in cause or "(SIGABRT)" in cause else None


def run_named(folder: Path, name: str, *extra: str, **keys) -> Path:
    """`fp8launch run` of the spec `name` (BASE + `keys`, output in folder/runs/NAME, `extra` arguments after it), which
    must succeed; its stdout kept in folder/NAME.stdout. Returns its output folder.

    A run one of whose ranks dies natively (segmentation fault, abort) runs once more (its folder kept as NAME.crashed):
    torch 2.13's gloo runs of 4-process tensor-parallel jobs on 2 loaded cores have crashed a rank twice in this project
    (heap corruption in a TP resume run; SIGSEGV of rank 3 in backward of pp 2 x tp 2 in a cold CI measurement,
    2026-11-27), never twice in a row; a second crash, or any other failure, fails the test."""
    spec = write_spec(folder, name, **{"train__output_dir": f"runs/{name}", **keys})
    r, seconds = run(folder, "run", str(spec), *extra)
    crash = native_crash(folder / "runs" / name) if r.returncode != 0 else None
    if crash is not None:
        print(f"{name}: a rank crashed natively ({crash}); running it once more")
        (folder / "runs" / name).rename(folder / "runs" / f"{name}.crashed")
        r, seconds = run(folder, "run", str(spec), *extra)
    assert r.returncode == 0, output_of(r)
    print(f"{name}: {seconds:.1f} s")
    (folder / f"{name}.stdout").write_text(r.stdout)
    return folder / "runs" / name


def start(cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([FP8LAUNCH, *args], cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@dataclass(frozen=True)
class Records:
    start: dict
    steps: list[dict]
    end: dict

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.steps]

    def tail_loss(self, n: int = 3) -> float:
        """Mean loss of the last n steps (a single micro-batch loss is noisy)."""
        return sum(self.losses[-n:]) / n


def records(output_dir: Path) -> Records:
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    starts = [r for r in lines if r["event"] == "start"]
    ends = [r for r in lines if r["event"] == "end"]
    assert len(starts) == 1 and len(ends) == 1 and lines[0] is starts[0] and lines[-1] is ends[0], lines
    return Records(start=starts[0], steps=[r for r in lines if r["event"] == "step"], end=ends[0])


def check_run(recs: Records, *, world_size: int, steps: int, strategy: str) -> None:
    """What every run must show: its shape, every step logged once, sane numbers."""
    assert recs.start["world_size"] == world_size and recs.start["strategy"] == strategy and recs.start["device"] == "cpu"
    assert [r["step"] for r in recs.steps] == list(range(1, steps + 1))
    for r in recs.steps:
        assert r["world_size"] == world_size and r["mfu"] is None  # CPU: no known peak
        assert r["loss"] > 0 and r["tokens_per_s"] > 0 and r["tflops_per_device"] > 0 and r["step_time_s"] > 0
        assert 0.1 < r["peak_mem_gib"] < 8
    assert recs.end["steps_run"] == steps and recs.end["final_loss"] == recs.steps[-1]["loss"]
    assert recs.end["tokens_seen"] == steps * recs.start["tokens_per_step"]


def output_of(r: subprocess.CompletedProcess) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-6000:]}"


def one_process_fp8_spec(name: str, out: Path, steps: int, *, eval_steps: int = 0) -> str:
    """The TOML of a one-process DDP run of llama-debug (2 blocks, 64 tokens) in torchao FP8 on the CPU, into
    out/runs/NAME, with `eval_steps` synthetic evaluation steps (0: no [eval]): what bench and tune measure."""
    text = f"""
version = 1
name = "{name}"
[precision]
mode = "fp8"
[precision.torchao]
skip_small = false
[distributed]
strategy = "ddp"
procs_per_node = 1
[launch]
device = "cpu"
env = {{ OMP_NUM_THREADS = "1" }}
[train]
model = "builtin:llama-debug?layers=2"
seq_len = 64
micro_batch_size = 2
steps = {steps}
lr = 3e-3
output_dir = "{out}/runs/{{name}}"
"""
    return text + (f'[eval]\ndata = "synthetic"\nsteps = {eval_steps}\n' if eval_steps else "")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: a test finds its own run's processes, never any by name)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4, after the parenthesised command name
                found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """`pid`'s children, theirs, and so on."""
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out
