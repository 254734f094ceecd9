"""The FP8 numerics monitor as a training-loop callback.

    monitor = build_monitor(plan, precision, model, is_main=env.is_main)   # None when monitor.fp8_stats_every = 0
    Trainer(..., callbacks=[monitor, ...])                                 # called after every step

Every `fp8_stats_every` steps (steps k*N, 1-based) it measures every FP8 cast of that step:
the callback after step k*N-1 arms the hooks, the one after step k*N reduces what they
measured across ranks (two collectives, every rank), writes one record per (step, layer,
operand) to <output_dir>/fp8_stats.jsonl on rank 0, prints the warnings, and removes the
hooks again. `finish()` at the end of the run prints the worst layers.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import typing
from typing import IO, Any, Callable

from torch import nn

from launcher.targets import disk
from launcher.train.metrics import jsonl
from launcher.train.parallel.distributed import all_reduce_max, all_reduce_sum

from .alerts import Warner
from .hooks import Collector, Target
from .records import record, reduce_rows, sample_summary

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.train.precision import Precision

STATS_FILE = "fp8_stats.jsonl"


class FP8Monitor:
    def __init__(self, targets: list[Target], *, every: int, total_steps: int, output_dir: str, is_main: bool,
                 underflow_warn: float, overflow_warn: float, backend: str = "", recipe: str = "",
                 start_step: int = 0, stream: IO[str] | None = None):
        if every < 1:
            raise ValueError("fp8_stats_every must be >= 1 for a monitor (0 means: build none)")
        self.collector = Collector(targets)
        self.every = every
        self.total_steps = total_steps
        self.is_main = is_main
        self.path = os.path.join(output_dir, STATS_FILE)
        self.stream = stream or sys.stderr
        self.warner = Warner(underflow_warn=underflow_warn, overflow_warn=overflow_warn, backend=backend, recipe=recipe)
        self._scaling = {(t.layer, op): s for t in targets for op, s in t.operands.items()}
        self._file = None
        self.sink: Callable[[dict[str, Any]], None] | None = None
        """Gets each sample's summary record on rank 0 (the experiment trackers: `MetricsLogger.track`)."""
        self._prepare(start_step + 1)

    @property
    def targets(self) -> list[Target]:
        return self.collector.targets

    def sampled(self, step: int) -> bool:
        return step % self.every == 0 and step <= self.total_steps

    def __call__(self, state) -> None:
        """After each step (the loop's callback): write the sample of this step if it was one,
        then arm the hooks if the next step is one."""
        if self.collector.armed:
            self.collector.disarm()
            self.write_sample(state.step)
        self._prepare(state.step + 1)

    @contextlib.contextmanager
    def paused(self):
        """No hook measures inside this block (an evaluation's forward passes are not training numerics)."""
        armed = self.collector.armed
        self.collector.disarm()
        try:
            yield
        finally:
            if armed:
                self.collector.arm()

    def _prepare(self, step: int) -> None:
        if self.targets and self.sampled(step):
            self.collector.measure_sharded_fp8_weights(all_reduce_max)
            self.collector.arm()

    def write_sample(self, step: int) -> list[dict[str, Any]]:
        """Reduce what the hooks measured over every rank; on rank 0 write the records and the warnings."""
        rows = reduce_rows(self.collector.keys(), self.collector.take(), all_reduce_max=all_reduce_max,
                           all_reduce_sum=all_reduce_sum)
        records = [record(step, layer, op, self._scaling[(layer, op)], row) for (layer, op), row in rows.items()]
        lines = self.warner.check(records)
        if self.is_main and records:
            if self._file is None:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                jsonl.repair(self.path)  # a partial last line of a killed run would swallow this run's first record
                self._file = open(self.path, "a", encoding="utf-8")
            try:
                self._file.write("".join(json.dumps(r) + "\n" for r in records))
                self._file.flush()
            except OSError as e:
                if not disk.full(e, self.path):
                    raise
                raise disk.DiskFull(self.path) from e
            for line in lines:
                print(line, file=self.stream, flush=True)
            if self.sink is not None:
                self.sink(sample_summary(records, underflow_warn=self.warner.underflow_warn,
                                         overflow_warn=self.warner.overflow_warn))
        return records

    def finish(self, state=None) -> None:
        """End of the run: drop any hook, print the worst layers, close the file."""
        self.collector.disarm()
        self.collector.take()
        if self.is_main:
            for line in self.warner.summary_lines():
                print(line, file=self.stream, flush=True)
        self.close()

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except OSError as e:  # what a failed write left in the buffer: write_sample has raised DiskFull for it already
                if not disk.full(e, self.path):
                    raise


def monitor_targets(model: nn.Module, precision: Precision) -> list[Target]:
    """The FP8 layers of `model` as the backend converted them (`Precision.monitor_targets`: none for AMP and MS-AMP)."""
    if precision.report.mode != "fp8":
        return []
    return precision.monitor_targets(model)


def build_monitor(plan: Plan, precision: Precision, model: nn.Module, *, is_main: bool, start_step: int = 0,
                  stream: IO[str] | None = None) -> FP8Monitor | None:
    """The monitor of the plan, or None when monitor.fp8_stats_every = 0 (then nothing is hooked).
    Call it on the model as converted by the precision backend, wrapped or not (hooks sit on the
    FP8 modules themselves, whose FQNs are those of the model as built)."""
    m = plan.monitor
    if m.fp8_stats_every <= 0:
        return None
    targets = monitor_targets(model, precision)
    return FP8Monitor(targets, every=m.fp8_stats_every, total_steps=plan.train.steps, output_dir=plan.train.output_dir,
                      is_main=is_main, underflow_warn=m.underflow_warn, overflow_warn=m.overflow_warn,
                      backend=precision.report.backend, recipe=precision.report.recipe, start_step=start_step, stream=stream)


def unwatched_note(plan: Plan, precision: Precision, monitor: FP8Monitor | None) -> str | None:
    """The start line that says the monitor is on but watches nothing (no FP8, or MS-AMP)."""
    if monitor is None or monitor.targets:
        return None
    why = "no layer runs in FP8" if precision.report.mode != "fp8" else f"the {precision.report.backend} backend is not watched"
    return f"note: monitor.fp8_stats_every = {plan.monitor.fp8_stats_every} but {why}: no {STATS_FILE} is written"
