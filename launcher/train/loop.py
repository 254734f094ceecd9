"""The training loop: micro-batches with gradient accumulation, fp32 cross entropy, clipping,
the optimizer step, the precision hook, the lr schedule, non-finite-loss handling, metrics.

Everything a checkpoint needs is reachable from one `TrainState`: the engine (model,
optimizer, lr schedule), the data stream's position, the step and token counters, and the
RNG states. Checkpoints plug in as a callback `(state) -> None` run after every step (the
CheckpointManager's `callback`), and by restoring the TrainState before `Trainer.run()`. A callback
object with a `finish(state)` method (the FP8 monitor) also gets that call after the last step.

Stopping early, every rank after the same step (the loss and a stop flag ride on the one
all-reduce each step already does, so every rank takes the same branch):
- SIGTERM (preempt.py): the step in progress finishes, a checkpoint is written, `Preempted` (exit 75).
- a non-finite loss or gradient norm: train.on_nan = "stop" raises `TrainingDiverged` (exit 4)
  before the update; "skip" drops the update and goes on, up to MAX_CONSECUTIVE_SKIPS in a row.
"""

from __future__ import annotations

import math
import statistics
import time
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from launcher.errors import EXIT_DIVERGED, LauncherError
from launcher.planning.backends import named
from launcher.train.checkpoint import preempt
from launcher.train.loss import loss_function
from launcher.train.metrics import MetricsLogger, StepTimer, Throughput, peak_memory_gib, step_record
from launcher.train.parallel.distributed import all_reduce_sum
from launcher.train.rng import rng_state, set_rng_state

annotate = torch.profiler.record_function
"""The loop's parts as the profiler sees them (launcher/profiling/parts.py reads these names): fp8launch.step,
fp8launch.data, fp8launch.loss, fp8launch.optimizer. A few microseconds each when no profiler runs."""

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.train.checkpoint import CheckpointManager
    from launcher.train.engines import Engine

MAX_CONSECUTIVE_SKIPS = 5
"""With train.on_nan = "skip", this many non-finite steps in a row stop the run anyway."""


class TrainingDiverged(LauncherError):
    """The loss (or gradient norm) became NaN or infinite."""

    exit_code = EXIT_DIVERGED


@dataclass(kw_only=True, slots=True)
class TrainState:
    """The whole state of a run: what a checkpoint saves and what resuming restores."""

    engine: Engine
    """Model, optimizer and lr schedule (`engine.train_state()` names them for a checkpoint)."""
    data: Iterator[torch.Tensor]
    """The token stream; its `state_dict()` is its position."""
    step: int = 0
    """Optimizer steps completed (skipped ones included)."""
    tokens_seen: int = 0
    """Global tokens trained on."""
    skipped_steps: int = 0
    """Steps whose update was skipped for a non-finite loss (train.on_nan = "skip")."""
    losses: list[float] = field(default_factory=list)
    """The global mean loss of each step of this process's run (for the summary)."""
    precision_phase: int = 0
    """The `[[precision.schedule]]` phase the last step trained in (0: the spec's precision)."""
    tracker_ids: dict[str, str] = field(default_factory=dict)
    """The experiment trackers' run ids on rank 0 ({"wandb": ..., "mlflow": ...}): a resumed run continues those runs."""
    last_step_time_s: float = 0.0
    """The wall time of the last step (for callbacks that measure: the step profiler)."""

    def state_dict(self) -> dict[str, Any]:
        """Counters, data position and RNG states (the model and optimizer go through `engine.train_state()`)."""
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "skipped_steps": self.skipped_steps,
            "data": self.data.state_dict() if hasattr(self.data, "state_dict") else None,
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if state.get("data") is not None and hasattr(self.data, "load_state_dict"):
            self.data.load_state_dict(state["data"])
        if state.get("rng") is not None:
            set_rng_state(state["rng"])


@dataclass(frozen=True, kw_only=True, slots=True)
class StepResult:
    loss: float
    """Global mean loss of the step (all micro-batches, all ranks)."""
    grad_norm: float | None
    """Total gradient norm before clipping; None where the engine clips inside its step."""
    step_time_s: float
    lr: float
    """The learning rate the step used."""
    skipped: bool
    stop: str | None = None
    """The signal some rank got before this step's all-reduce ("SIGTERM"): every rank stops after this step."""
    grad_comm_bytes: int | None = None
    """Bytes this rank sent for the step's gradient reduction (launcher/train/parallel/grad_reduce.py); None: not known."""


class Trainer:
    """Runs `plan.train.steps` optimizer steps on `state`, logging through `logger`.

    `checkpoints` (a CheckpointManager, optional) is what a SIGTERM saves through and what a
    divergence message names; its `callback` goes in `callbacks` for the scheduled saves.
    `resumed_from` is the checkpoint the state was restored from (None: a fresh start)."""

    def __init__(self, state: TrainState, plan: Plan, *, device: torch.device, logger: MetricsLogger,
                 throughput: Throughput, callbacks: Sequence[Callable[[TrainState], None]] = (),
                 checkpoints: CheckpointManager | None = None, resumed_from: str | None = None):
        self.state = state
        self.plan = plan
        self.device = device
        self.logger = logger
        self.throughput = throughput
        self.callbacks = list(callbacks)
        self.checkpoints = checkpoints
        self.resumed_from = resumed_from
        self._timer = StepTimer(device)
        self._loss = loss_function(plan)
        self._window: list[StepResult] = []
        self._consecutive_skips = 0

    def next_tokens(self) -> torch.Tensor:
        try:
            with annotate("fp8launch.data"):
                tokens = next(self.state.data)
        except StopIteration:
            raise LauncherError(
                f"train.data ran out of batches at step {self.state.step + 1} of {self.plan.train.steps}; "
                "fix: give it more data, or lower train.steps"
            ) from None
        return tokens.to(self.device, non_blocking=True)

    def train_step(self) -> StepResult:
        """One optimizer step over grad_accum_steps micro-batches."""
        with annotate("fp8launch.step"):
            return self._train_step()

    def _train_step(self) -> StepResult:
        engine, t = self.state.engine, self.plan.train
        self._timer.start()
        lr = engine.lr()
        step_loss = engine.train_step(self.next_tokens, self._loss_of)
        with annotate("fp8launch.optimizer"):
            norm = engine.clip_grad_norm(t.max_grad_norm)
        comm_bytes = engine.grad_comm_bytes()  # after the last backward (the default reductions count its gradients)
        # One collective per step: every rank sees the same loss and the same stop flag, so every
        # rank takes the same branches below and stops after the same step.
        stop_here = preempt.requested()
        zero = step_loss.new_zeros(())
        stats = torch.stack([step_loss, norm.detach().float() if norm is not None else zero, zero + (1.0 if stop_here else 0.0)])
        loss_value, norm_value, stops = all_reduce_sum(stats).tolist()
        loss_value /= engine.loss_ranks  # every rank, or the last pipeline stage's (the others add 0)
        norm_value = norm_value / self.throughput.world_size if norm is not None else None
        skipped = not self._finite(loss_value, norm_value)
        if skipped:
            self._on_non_finite(loss_value, norm_value)
            engine.skip_step()
        else:
            self._consecutive_skips = 0
            with annotate("fp8launch.optimizer"):
                engine.step()
                engine.zero_grad()
        self.state.step += 1
        self.state.tokens_seen += self.throughput.tokens_per_step
        self.state.skipped_steps += skipped
        self.state.losses.append(loss_value)
        stop = (stop_here or "SIGTERM") if stops > 0 else None
        self.state.last_step_time_s = step_time = self._timer.stop()
        return StepResult(loss=loss_value, grad_norm=norm_value, step_time_s=step_time, lr=lr, skipped=skipped, stop=stop,
                          grad_comm_bytes=comm_bytes)

    def _loss_of(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss, as the profiler's loss part. Takes the logits so that no caller's frame keeps them alive through
        backward (the head's output over the vocabulary is the largest activation)."""
        with annotate("fp8launch.loss"):
            return self._loss(logits, targets)

    def _finite(self, loss: float, norm: float | None) -> bool:
        # With a GradScaler (fp16) inf/nan gradients are the scaler's business: it skips and lowers the scale.
        check_norm = norm is not None and self.state.engine.precision.grad_scaler is None
        return math.isfinite(loss) and (not check_norm or math.isfinite(norm))

    def _on_non_finite(self, loss: float, norm: float | None) -> None:
        step = self.state.step + 1
        what = f"loss {loss}" + (f", gradient norm {norm}" if norm is not None else "")
        latest = self._last_checkpoint()
        where = f"last complete checkpoint: {latest or 'none yet'}"
        causes = f"likely causes ({likely_causes(self.plan, self.state.engine.precision.report)})"
        again = ('make the change and resume from that checkpoint (train.resume = "auto", or its path)' if latest
                 else "make the change and start again")
        if self.plan.train.on_nan == "stop":
            raise TrainingDiverged(
                f"step {step}: non-finite {what}; every rank stopped before the update (train.on_nan = \"stop\"); "
                f"{where}; {causes}; fix: {again}, or set train.on_nan = \"skip\" to step over isolated bad batches"
            )
        self._consecutive_skips += 1
        if self._consecutive_skips >= MAX_CONSECUTIVE_SKIPS:
            raise TrainingDiverged(
                f"step {step}: non-finite {what} for {MAX_CONSECUTIVE_SKIPS} steps in a row, the most "
                f"train.on_nan = \"skip\" steps over (MAX_CONSECUTIVE_SKIPS); every rank stopped, "
                f"{self.state.skipped_steps + 1} steps skipped in all; {where}; {causes}; fix: {again}"
            )

    def _last_checkpoint(self) -> str | None:
        if self.checkpoints is None:
            return None
        return self.checkpoints.latest_complete()

    def step_and_log(self) -> StepResult:
        """One step, then its metrics record (every log_every steps, at the last step and at a stop) and the callbacks."""
        result = self.train_step()
        self._window.append(result)
        self.logger.advance()
        t = self.plan.train
        if self.state.step % t.log_every == 0 or self.state.step == t.steps or result.stop:
            self.log()
        for callback in self.callbacks:
            callback(self.state)
        return result

    def log(self) -> None:
        window, self._window = self._window, []
        if not window:
            return
        step_time = sum(r.step_time_s for r in window) / len(window)
        norms = [r.grad_norm for r in window if r.grad_norm is not None]
        record = step_record(
            step=self.state.step, loss=window[-1].loss, lr=window[-1].lr, step_time_s=step_time,
            throughput=self.throughput, peak_mem_gib=peak_memory_gib(self.device), grad_norm=norms[-1] if norms else None,
        )
        record["skipped_steps"] = self.state.skipped_steps
        # measured, not assumed: the live optimizer state and what this rank sent for the last step's gradients
        record["optimizer_state_bytes"] = self.state.engine.optimizer_state_bytes()
        record["grad_comm_bytes"] = window[-1].grad_comm_bytes
        self.logger.step(record)

    def run(self) -> dict[str, Any]:
        """Train until plan.train.steps; return the summary record (also logged). Raises Preempted
        after a stop signal (with a checkpoint of the step every rank stopped after) and
        TrainingDiverged on a non-finite loss."""
        start_step, t0 = self.state.step, time.perf_counter()
        times = []
        if self.state.step < self.plan.train.steps:
            self._stop_before_training()
        while self.state.step < self.plan.train.steps:
            result = self.step_and_log()
            times.append(result.step_time_s)
            if result.stop and self.state.step < self.plan.train.steps:
                self._preempted(result.stop)
        summary = self.summary(steps_run=self.state.step - start_step, elapsed_s=time.perf_counter() - t0, times=times)
        for callback in self.callbacks:  # callbacks with figures of their own for the end record (the evaluator's eval_loss)
            fields = getattr(callback, "summary", None)
            if fields is not None:
                summary.update(fields())
        for callback in self.callbacks:  # callbacks with an end of their own (the FP8 monitor's summary)
            finish = getattr(callback, "finish", None)
            if finish is not None:
                finish(self.state)
        self.logger.end(summary)
        return summary

    def _stop_before_training(self) -> None:
        """A signal that came while the run was starting: stop before the first step (one collective)."""
        flag = torch.tensor([1.0 if preempt.requested() else 0.0], device=self.device)
        if all_reduce_sum(flag).item() > 0:
            latest = self._last_checkpoint()
            raise preempt.Preempted(
                f"preempted: {preempt.requested() or 'SIGTERM'} before the first step of this run (at step {self.state.step} of "
                f"{self.plan.train.steps}); nothing new to save{f', the newest checkpoint is {latest}' if latest else ''}; "
                + _how_to_continue(self.plan.train.resume, from_it=latest is not None)
            )

    def _preempted(self, signal_name: str) -> None:
        """Every rank, after the same step: write a checkpoint of it (unless the schedule just did), then stop."""
        step, total = self.state.step, self.plan.train.steps
        if self.checkpoints is None:
            raise preempt.Preempted(f"preempted: {signal_name} after step {step} of {total}; no checkpoint manager, nothing saved")
        path = self.checkpoints.save_unless_saved(self.state)
        raise preempt.Preempted(
            f"preempted: {signal_name} after step {step} of {total}; every rank stopped after it and checkpoint {path} is complete; "
            + _how_to_continue(self.plan.train.resume)
        )

    def interrupted(self) -> preempt.Interrupted:
        """What a Ctrl-C became: the step reached, no checkpoint of it, and the checkpoint the same command continues from."""
        latest, step, total = self._last_checkpoint(), self.state.step, self.plan.train.steps
        then = (f"the newest complete checkpoint is {latest}; " + _how_to_continue(self.plan.train.resume) if latest
                else "no checkpoint was written, so the same command starts again from step 0")
        return preempt.Interrupted(f"interrupted: Ctrl-C after step {step} of {total}, without a checkpoint of it; {then}")

    def summary(self, *, steps_run: int, elapsed_s: float, times: list[float]) -> dict[str, Any]:
        # The first step carries one-time costs (compile, allocator warm-up): leave it out of the median when there are others.
        steady = times[1:] if len(times) > 1 else times
        median = statistics.median(steady) if steady else 0.0
        losses = self.state.losses
        return {
            "steps_run": steps_run,
            "final_step": self.state.step,
            "first_loss": losses[0] if losses else None,
            "final_loss": losses[-1] if losses else None,
            "elapsed_s": elapsed_s,
            "median_step_time_s": median,
            "median_tokens_per_s": self.throughput.tokens_per_s(median) if median else 0.0,
            "tokens_seen": self.state.tokens_seen,
            "skipped_steps": self.state.skipped_steps,
            "peak_mem_gib": peak_memory_gib(self.device),
            "world_size": self.throughput.world_size,
        }


def _how_to_continue(resume: str, *, from_it: bool = True) -> str:
    where = " from it" if from_it else ""
    if resume == "auto":
        return f'run the same command again to continue{where} (train.resume = "auto")'
    return f'continue{where} with train.resume = "auto" (this run has train.resume = "{resume}")'


def likely_causes(plan: Plan, report) -> str:
    """What usually makes the loss non-finite with this precision, and what to try; for the divergence message."""
    p = plan.precision
    lr = "the learning rate (lower train.lr or raise train.warmup_steps), or a bad batch in the data"
    backend, recipe = report.backend, report.recipe
    if p.mode != "fp8":
        if p.mode == "fp16":
            return f"fp16 overflow beyond 65504 that the loss scaler could not absorb (use precision.mode = \"bf16\"), or {lr}"
        return lr
    b = named(backend)
    hint = b.overflow_hint(recipe) if b is not None else ""
    return f"{hint}; or {lr}" if hint else lr
