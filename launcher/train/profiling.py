"""`fp8launch run --profile N` (and bench's --profile): torch.profiler over N steps after the warm-up, on rank 0,
then where each step's time went (launcher/profiling) written beside metrics.jsonl.

    profiler = StepProfiler.from_env(plan, engine.module, precision, device, is_main=env.is_main, start_step=state.step)
    callbacks.append(profiler)            # the Trainer calls it after every step

The launcher asks for it through the environment of the processes it starts (PROFILE_ENV = N, PROFILE_WARMUP_ENV),
so plan.json stays what the spec says. One profiler step of warm-up comes first (Kineto's start-up is not
measured), then N steps are recorded with shapes (for the GEMMs' layers and FLOPs). On a CPU, Inductor's C++
kernels are named in the trace only with TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1, which the launcher sets too.

Writes (rank 0): <output_dir>/profile/trace.json.gz (open it in Perfetto or chrome://tracing), <output_dir>/profile.json
= {"run": RUN} (launcher/profiling/record.py) and, where matplotlib is installed, profile.png.

The profile is a by-product of the run: where the profiler fails (starting, exporting the trace, reading it back), the
failure is printed, the profiler is stopped, the training goes on, and the run's end record in metrics.jsonl carries
`profile_error` (bench records it in bench.json and goes on to the next run). FP8LAUNCH_PROFILE_FAULT=start|write
makes it fail there on purpose, to rehearse that path (tests/e2e/test_bench.py).
"""

from __future__ import annotations

import json
import os
import sys
import typing

import torch
from torch import nn

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

from launcher.profiling import PROFILE_ENV, PROFILE_WARMUP_ENV

DEFAULT_WARMUP = 2
"""Steps trained before the profiler starts: the first ones compile and warm the allocator up."""
TRACE = os.path.join("profile", "trace.json.gz")
FAULT_ENV = "FP8LAUNCH_PROFILE_FAULT"
""""start" or "write": the profiler raises there, as one that breaks on a real trace would (the failure path, rehearsed)."""


def _fault(where: str) -> None:
    if os.environ.get(FAULT_ENV) == where:
        raise RuntimeError(f"injected by {FAULT_ENV}={where}")


def layer_table(model: nn.Module, precision) -> list:
    """Every Linear-like module (and grouped-experts module) with its shape and whether it runs in FP8, as built."""
    from launcher.profiling.layers import Layer
    from launcher.train.fqn import clean_fqn
    from launcher.train.precision.report import linear_like

    out = []
    for fqn, m, fp8 in linear_like(model, lambda mod: precision.fp8_label(mod) is not None):
        w1 = m._parameters.get("w1") if hasattr(m, "_parameters") else None
        if w1 is not None and w1.ndim == 3:  # grouped experts: w1 (E, hidden, dim)
            k, n = int(w1.shape[2]), int(w1.shape[1])
        elif hasattr(m, "in_features") and hasattr(m, "out_features"):
            k, n = int(m.in_features), int(m.out_features)
        else:
            continue
        out.append(Layer(clean_fqn(fqn) or "<root>", k, n, bool(fp8)))
    return out


class StepProfiler:
    """A Trainer callback: starts the profiler after step `start_step + warmup - 1`, records `steps` steps, writes."""

    def __init__(self, plan: Plan, model: nn.Module, precision, device: torch.device, *, steps: int, warmup: int = DEFAULT_WARMUP,
                 start_step: int = 0, is_main: bool = True):
        from launcher.errors import UsageError

        last = start_step + warmup + steps
        if last > plan.train.steps:
            raise UsageError(f"--profile {steps} records steps {start_step + warmup + 1}..{last} (after {warmup} warm-up steps), "
                             f"past train.steps = {plan.train.steps}; fix: --set train.steps={last} or a smaller --profile")
        self.plan, self.model, self.precision, self.device = plan, model, precision, device
        self.steps, self.is_main = steps, is_main
        self.begin_after = start_step + warmup - 1  # the step after it is the profiler's own warm-up step
        self._prof = None
        self._calls = 0
        self._times: list[float] = []
        self.written: str | None = None
        self.error: str | None = None
        """Why the profile failed ("RuntimeError: ..."), or None: the run's end record carries it as profile_error."""

    @classmethod
    def from_env(cls, plan: Plan, model: nn.Module, precision, device: torch.device, *, is_main: bool, start_step: int):
        """The profiler the launcher asked for through the environment, or None."""
        steps = int(os.environ.get(PROFILE_ENV, "0") or 0)
        if steps <= 0:
            return None
        warmup = int(os.environ.get(PROFILE_WARMUP_ENV, str(DEFAULT_WARMUP)) or DEFAULT_WARMUP)
        return cls(plan, model, precision, device, steps=steps, warmup=warmup, start_step=start_step, is_main=is_main)

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        _fault("start")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        path = os.path.join(self.plan.train.output_dir, TRACE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._prof = profile(activities=activities, record_shapes=True, schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1),
                             on_trace_ready=lambda p: p.export_chrome_trace(path))
        self._prof.__enter__()

    def __call__(self, state) -> None:
        if not self.is_main or self.written is not None or self.error is not None:
            return
        try:
            self._advance(state)
        except Exception as e:  # noqa: BLE001 -- the profile is a by-product: its failure is recorded, the training goes on
            self._fail(e, state.step)

    def summary(self) -> dict:
        """The end record's fields (Trainer.run): profile_error where the profile failed."""
        return {"profile_error": self.error} if self.error is not None else {}

    def _fail(self, error: Exception, step: int) -> None:
        self.error = f"{type(error).__name__}: {error}"
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 -- a profiler that failed may fail to stop too; it is dropped either way
                pass
        print(f"profile: failed after step {step}: {self.error}; the training goes on without a profile "
              "(the end record's profile_error says so)", file=sys.stderr, flush=True)

    def _advance(self, state) -> None:
        if self._prof is None:
            if state.step == self.begin_after:
                self._start()
            return
        self._calls += 1
        if self._calls > 1:  # the first profiled step is the profiler's warm-up
            self._times.append(state.last_step_time_s)
        self._prof.step()
        if self._calls == self.steps + 1:
            self._prof.__exit__(None, None, None)
            self._prof = None
            self.written = self._write()

    def _write(self) -> str:
        from launcher.profiling.layers import LayerTable
        from launcher.profiling.record import run_record
        from launcher.profiling.trace import read_trace
        from launcher.targets.files import write_atomic

        _fault("write")
        out = self.plan.train.output_dir
        layers = layer_table(self.model, self.precision)
        run = run_record(read_trace(os.path.join(out, TRACE)), LayerTable(layers), measured_step_s=self._times)
        run["trace"] = TRACE
        run["layers"] = [x.to_json() for x in layers]
        path = os.path.join(out, "profile.json")
        write_atomic(path, json.dumps({"run": run}, indent=2, sort_keys=True) + "\n")
        try:
            from launcher.profiling.compare import plot

            plot({"run": run}, os.path.join(out, "profile.png"))
        except ImportError:
            pass  # matplotlib is optional: profile.json has everything
        return path
