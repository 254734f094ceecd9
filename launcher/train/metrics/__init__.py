"""What a run reports, on rank 0: a start record with the precision report (the honesty line),
one record per `log_every` steps, and a final summary. Each goes to the terminal as one
compact line and to `<output_dir>/metrics.jsonl` as one JSON object, and to the `[log]`
experiment trackers (launcher/train/metrics/trackers.py, docs/trackers.md).

Every record has an "event": "start" | "step" | "end". Step records carry the contract's
fields: step, loss, lr, tokens_per_s (global), tflops_per_device, mfu (null where the
device's peak is unknown, e.g. a CPU), peak_mem_gib, step_time_s; plus world_size and
grad_norm. The file is appended to, so a resumed run continues it after a new start record.

MFU is measured against the device's dense peak in the high-precision dtype (bf16 for an FP8 run;
launcher/planning/gpus.py says what that means, MFU_NOTE): FP8 speed-ups then show as a higher MFU. The
start record says so (`mfu_peak`: "bf16 dense"), and so does its line.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Sequence

from launcher.planning.gpus import MFU_NOTE
from launcher.targets import disk
from launcher.train.metrics import jsonl

if TYPE_CHECKING:  # torch is imported where it is used: trackers.py, beside this, is read by processes that load no torch
    import torch

STEP_FIELDS = ("step", "loss", "lr", "tokens_per_s", "tflops_per_device", "mfu", "peak_mem_gib", "step_time_s")
"""The field names of a step record (the contract); more fields may follow them."""

METRICS_FILE = "metrics.jsonl"
NUMBER_FIELDS = (*STEP_FIELDS, "grad_norm", "eval_loss", "eval_perplexity")
"""Keys whose value, where a record has one, is a number or null (drawn by `fp8launch report`, compared by bench)."""


def record_problem(record: dict[str, Any]) -> str | None:
    """Why a metrics.jsonl record is not one a reader can use (no event, a step record without a step number, a string
    where a number belongs), or None."""
    event = record.get("event")
    if not isinstance(event, str):
        return 'no "event"' if event is None else f'its "event" is {_shown(event)}, not a name'
    step = record.get("step")
    if event in ("step", "eval") and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        return f"a {event} record without a step number" if step is None else f'its "step" is {_shown(step)}, not a step number'
    for key in NUMBER_FIELDS:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f'its "{key}" is {_shown(value)}, not a number'
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_records(path: str) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The records of metrics.jsonl `path` a reader can use, in order, and (line, why) for each line that is not one
    (jsonl.read's, and `record_problem`'s)."""
    rows, problems = jsonl.read(path)
    records = []
    for number, record in rows:
        why = record_problem(record)
        if why is None:
            records.append(record)
        else:
            problems.append((number, why))
    return records, problems


@dataclass(frozen=True, kw_only=True, slots=True)
class Throughput:
    """What turns a step time into tokens/s, TFLOP/s and MFU."""

    tokens_per_step: int
    """Global tokens per optimizer step (global batch x seq_len). The global batch counts data-parallel
    ranks only: the ranks of a tensor-parallel group train on the same sequences, counted once."""
    world_size: int
    """Every rank (dp x tp): TFLOP/s per device divides the job's FLOP/s by it."""
    flops_per_token: float
    """Training FLOPs per token (forward + backward)."""
    peak_tflops: float | None
    """The device's dense peak; None where unknown (MFU is then null)."""

    def tokens_per_s(self, step_time_s: float) -> float:
        return self.tokens_per_step / step_time_s if step_time_s > 0 else 0.0

    def tflops_per_device(self, step_time_s: float) -> float:
        return self.flops_per_token * self.tokens_per_s(step_time_s) / self.world_size / 1e12

    def mfu(self, step_time_s: float) -> float | None:
        if not self.peak_tflops:
            return None
        return self.tflops_per_device(step_time_s) / self.peak_tflops


def peak_memory_gib(device: torch.device) -> float:
    """CUDA: the most memory torch allocated on `device`; CPU: this process's peak resident set (Linux: VmHWM, the
    high-water mark of this process's own memory; getrusage's ru_maxrss keeps the parent's across exec, so a rank started
    by a large process would report that process's peak)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux and the BSDs
    return kib / 2**20


def step_record(*, step: int, loss: float, lr: float, step_time_s: float, throughput: Throughput,
                peak_mem_gib: float, grad_norm: float | None = None) -> dict[str, Any]:
    """One step record: the contract's fields in order, then the extras."""
    return {
        "event": "step",
        "step": step,
        "loss": loss,
        "lr": lr,
        "tokens_per_s": throughput.tokens_per_s(step_time_s),
        "tflops_per_device": throughput.tflops_per_device(step_time_s),
        "mfu": throughput.mfu(step_time_s),
        "peak_mem_gib": peak_mem_gib,
        "step_time_s": step_time_s,
        "world_size": throughput.world_size,
        "grad_norm": grad_norm,
    }


def step_line(record: dict[str, Any], total_steps: int) -> str:
    """The compact terminal line of a step record."""
    mfu = "n/a" if record["mfu"] is None else f"{100 * record['mfu']:.1f}%"
    return (f"step {record['step']}/{total_steps} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
            f"{record['tokens_per_s']:,.0f} tok/s | {record['tflops_per_device']:.3g} TFLOP/s/dev | MFU {mfu} | "
            f"mem {record['peak_mem_gib']:.2f} GiB | {record['step_time_s']:.3f} s/step")


def end_line(record: dict[str, Any]) -> str:
    if not record["steps_run"]:
        return f"done: nothing to train, already at step {record['final_step']}"
    return (f"done: {record['steps_run']} steps in {record['elapsed_s']:.1f} s, loss {record['first_loss']:.4f} -> "
            f"{record['final_loss']:.4f}, median {record['median_tokens_per_s']:,.0f} tok/s, "
            f"peak mem {record['peak_mem_gib']:.2f} GiB" + (f", {record['skipped_steps']} steps skipped" if record["skipped_steps"] else "")
            + (f", eval loss {record['eval_loss']:.4f} (after step {record['eval_step']})" if record.get("eval_loss") is not None else ""))


class MetricsLogger:
    """Prints and writes the records on rank 0, and passes each to the experiment trackers
    (launcher/train/metrics/trackers.py); does nothing on the other ranks.

    `trackers` (not yet open) are opened by `start`, before the start record is written, continuing the
    tracked runs whose ids `tracker_ids` holds (a resumed run's, from its checkpoint); `close` closes them."""

    def __init__(self, *, output_dir: str, enabled: bool, total_steps: int, start_step: int = 0,
                 stream: IO[str] | None = None, progress: bool | None = None, trackers: Sequence = (),
                 tracker_ids: dict[str, str] | None = None):
        self.enabled = enabled
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self._file = None
        self._bar = None
        self.repaired: str | None = None
        """What was done to a partial last line an earlier run left (None: nothing); `start` says it."""
        self.trackers = list(trackers) if enabled else []
        self._resume_ids = dict(tracker_ids or {})
        if not enabled:
            return
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, METRICS_FILE)
        self.repaired = jsonl.repair(self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        if progress is None:
            progress = sys.stderr.isatty()
        if progress:
            self._bar = _progress_bar(total_steps, start_step)

    def start(self, record: dict[str, Any], line: str) -> None:
        """The start record (precision report, shapes) and its line, with what MFU is measured against.
        Opens the trackers first: one that cannot start raises EnvironmentProblem, with nothing written."""
        if record.get("mfu_peak"):
            peak = record.get("peak_tflops")
            line += (f"\nMFU is measured against the device's {record['mfu_peak']} peak"
                     + (f" ({peak:g} TFLOP/s)" if peak else " (unknown here: MFU n/a)")
                     + (f": {MFU_NOTE}" if record.get("backend") else ""))
        if self.trackers:
            from launcher.train.metrics.trackers import open_trackers, trackers_line

            try:
                where = open_trackers(self.trackers, {"event": "start", **record}, self._resume_ids)
            except BaseException:
                self.close()
                raise
            record = {**record, "trackers": where}
            line += "\n" + trackers_line(where)
        if self.repaired:
            line = f"note: {self.repaired}\n{line}"
        self._emit({"event": "start", **record}, line)

    def track(self, record: dict[str, Any]) -> None:
        """A record for the trackers only (the FP8 monitor's per-sample summary: fp8_stats.jsonl has the details)."""
        if self.enabled:
            for tracker in self.trackers:
                tracker.log(record)

    def tracker_ids(self) -> dict[str, str]:
        """The tracked runs' ids (wandb, mlflow) for the checkpoint, over those the run resumed with."""
        ids = dict(self._resume_ids)
        for tracker in self.trackers:
            ids.update(tracker.ids())
        return ids

    def step(self, record: dict[str, Any]) -> None:
        self._emit(record, step_line(record, self.total_steps))

    def event(self, record: dict[str, Any], line: str) -> None:
        """A record of something that happened between steps (e.g. a precision switch), and its line."""
        self._emit(record, line)

    def advance(self, steps: int = 1) -> None:
        """Move the progress bar (every step, logged or not)."""
        if self._bar is not None:
            self._bar.update(steps)

    def end(self, record: dict[str, Any]) -> None:
        self._emit({"event": "end", **record}, end_line(record))

    def close(self) -> None:
        if self.trackers:  # each closes once; their ids stay readable
            from launcher.train.metrics.trackers import close_trackers

            close_trackers(self.trackers)
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError as e:  # what a failed write left in the buffer: `_emit` has raised DiskFull for it already
                if not disk.full(e, self.path):
                    raise

    def _emit(self, record: dict[str, Any], line: str) -> None:
        if not self.enabled:
            return
        try:
            self._file.write(json.dumps(_finite(record), allow_nan=False) + "\n")
            self._file.flush()
        except OSError as e:
            if not disk.full(e, self.path):
                raise
            raise disk.DiskFull(self.path) from e
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)
        for tracker in self.trackers:
            tracker.log(record)


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinity become null: JSON has no literal for them."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def _progress_bar(total: int, initial: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, file=sys.stderr, unit="step", dynamic_ncols=True, leave=False)


class StepTimer:
    """Wall time of each step; synchronises CUDA so that queued kernels are counted."""

    def __init__(self, device: torch.device):
        self.device = device
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self._t0


def throughput_for(plan, env, flops_per_token: float) -> Throughput:
    """The run's Throughput: tokens per step from the plan, the peak of this device in the compute dtype."""
    import torch

    from launcher.planning.gpus import peak_tflops

    name = torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu"
    return Throughput(tokens_per_step=plan.tokens_per_step, world_size=env.world_size,
                      flops_per_token=flops_per_token, peak_tflops=peak_tflops(name, plan.precision.compute_dtype))


def start_record(plan, env, report, throughput: Throughput, *, parameters: int, start_step: int) -> dict[str, Any]:
    """What the start record says: the precision report (what really runs in FP8), the job's shape, the model's size."""
    import torch

    return {
        "name": plan.name,
        "precision": report.line(),
        "backend": report.backend,
        "recipe": report.recipe,
        "fp8_layers": report.fp8_layers,
        "total_linear": report.total_linear,
        "fp8_flop_share": report.fp8_flop_share,
        "strategy": plan.distributed.strategy,
        "world_size": env.world_size,
        "device": str(env.device.type),
        "device_name": torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu",
        "torch_version": torch.__version__,
        "compile": plan.compile.enabled,
        "activation_checkpointing": plan.activation_checkpointing.mode,
        "parameters": parameters,
        "flops_per_token": throughput.flops_per_token,
        "peak_tflops": throughput.peak_tflops,
        "mfu_peak": f"{plan.precision.compute_dtype} dense",
        "tokens_per_step": throughput.tokens_per_step,
        "steps": plan.train.steps,
        "start_step": start_step,
    }
