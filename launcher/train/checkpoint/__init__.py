"""Checkpoints that lose nothing: atomic, sharded where the engine shards, resumable to the bit.

    <output_dir>/checkpoints/
      step-200/                  a complete checkpoint (the folder name is the step)
        model/                   DCP (torch.distributed.checkpoint): weights, high precision, clean FQNs
        optim/                   DCP: optimizer state, keyed by the same FQNs
        deepspeed/               DeepSpeed only, instead of model/ and optim/: save_checkpoint(tag="ds") + zero_to_fp32.py
        rank-00000.pt ...        per rank: RNG states, data position, lr schedule, grad scaler, counters,
                                 the modules' `_extra_state`, and Transformer Engine's delayed-scaling state
                                 (scale and amax history per module and tensor role) as plain tensors
        COMPLETE.json            written last: step, world size, strategy, versions, seconds taken, and the
                                 record of every file above (size, CRC-32): record.py
      .tmp-step-300/             a save in progress (or one a crash interrupted): never loaded

A save writes into `.tmp-step-N`, then rank 0 writes COMPLETE.json, renames the folder to
`step-N` (one atomic rename) and fsyncs; only then are checkpoints beyond `keep_checkpoints`
removed (renamed away first, so a half-deleted folder is never mistaken for a checkpoint).
Resuming checks the newest `step-N` against its record (every file there, its size, its checksum) and takes
it if intact; else it names what is wrong, skips it, and checks the one before (`choose_resume`).

DDP and FSDP2 go through `torch.distributed.checkpoint.state_dict` (get/set_model_state_dict,
get/set_optimizer_state_dict): FSDP2 saves its shards from every rank, nothing is gathered
on rank 0, DDP's replicated tensors are written once; the FQNs carry no `module.`,
`_orig_mod.` (torch.compile), `_checkpoint_wrapped_module.` or `_fsdp_wrapped_module.`. A
DCP checkpoint loads into DDP or FSDP2 at any world size (DCP reshards). DeepSpeed uses its
own save_checkpoint/load_checkpoint, with the same marker, rank files and parameter names.

Transformer Engine: TE 2.x pickles DelayedScaling's state into `_extra_state` and refuses to unpickle
it on load unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1. fp8launch never writes that pickle: the TE
modules' `_extra_state` is saved empty (the payload TE ignores) and their scales and amax histories
go into the rank file as plain tensors, restored through TE's own fp8_meta before the first forward
(launcher/train/precision/te_state.py), so a resumed delayed-scaling run continues as the
uninterrupted one. Stateless recipes (current, block, mxfp8, nvfp4) have nothing to keep. A
checkpoint written before (holding TE's pickle) is refused by TE; that refusal is reported as such.

Usage, in every rank (every call is collective), with the loop's TrainState:

    ckpt = CheckpointManager.for_plan(plan, rank=env.rank, world_size=env.world_size)
    loaded = ckpt.restore_train_state(state, plan.train.resume)   # None: a fresh start
    Trainer(state, plan, ..., callbacks=[ckpt.callback], checkpoints=ckpt).run()
    # saves every N steps and at the end (train.checkpoint_at_end), and after the step a SIGTERM stopped

or piece by piece:

    path = ckpt.resolve_resume(plan.train.resume)     # or choose_resume: also what it skipped, to tell the user
    loaded = ckpt.load(path, **engine.train_state(), grad_scaler=engine.precision.grad_scaler)
    ckpt.save(step, **engine.train_state(), grad_scaler=..., data_state=data.state_dict(), extra={...})
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import typing
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from launcher import __version__
from launcher.errors import EnvironmentProblem, InputError, LauncherError
from launcher.planning.layout import Layout
from launcher.targets import checkpoint_record as record
from launcher.targets import disk
from launcher.train.checkpoint.dcp import FLAT, NESTED, _load_dcp, _save_dcp
from launcher.train.checkpoint.deepspeed import _clean_param_names, _naming_reads, clean_fqn
from launcher.train.precision import te_state
from launcher.train.rng import rng_state, set_rng_state

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

__all__ = ["CheckpointManager", "Choice", "LoadedState", "clean_fqn", "read_marker", "MARKER", "CHECKPOINTS"]

CHECKPOINTS = "checkpoints"
"""The folder under train.output_dir that holds the checkpoints."""
MARKER = record.MARKER
"""Written last into a checkpoint; a folder without it is not a checkpoint."""
DS_TAG = "ds"
"""DeepSpeed's tag (sub-folder) inside `<checkpoint>/deepspeed/`."""
FORMAT_VERSION = 1
KEY = "train.resume"
_TMP, _TRASH = ".tmp-", ".trash-"


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedState:
    """What `CheckpointManager.load` restored, and what the loop restores itself."""

    path: str
    step: int
    """Optimizer steps completed when the checkpoint was written."""
    data_state: dict | None
    """This rank's data stream position (rank 0's when this rank did not exist then); None if none was saved."""
    extra: dict
    """The `extra` dict given to `save` (counters and the like)."""
    saved_world_size: int
    warnings: tuple[str, ...] = ()
    """Things the user should know (e.g. the world size changed); the caller logs them."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The checkpoint to read, and the newer ones passed over on the way to it."""

    path: str | None
    """None: none to read (a fresh start)."""
    skipped: tuple[tuple[str, str], ...] = ()
    """(path, what is wrong with it) of each newer checkpoint that failed its check, newest first."""
    unchecked: bool = False
    """`path` was written before checkpoints recorded their files: there was nothing to check it against."""

    def notes(self, shown: Callable[[str], str] = str) -> list[str]:
        """One line for each checkpoint skipped, and one for an unchecked `path` (paths through `shown`)."""
        lines = [f"{shown(path)}: {why}; skipped" for path, why in self.skipped]
        if self.unchecked:
            lines.append(f"{shown(self.path)} has no record of its files (written before checkpoints recorded them): "
                         "read without checking them")
        return lines


def read_marker(path: str) -> dict | None:
    """The COMPLETE.json of checkpoint folder `path`, or None where it is missing or unreadable."""
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("step"), int) else None


class CheckpointManager:
    """Saves and finds the checkpoints of one run (`<output_dir>/checkpoints`), for this rank."""

    def __init__(self, output_dir: str, *, keep: int, strategy: str, every: int = 0, total_steps: int | None = None,
                 at_end: bool = True, rank: int | None = None, world_size: int | None = None, tensor_parallel: int = 1):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir = os.path.abspath(os.path.join(output_dir, CHECKPOINTS))
        self.keep = keep
        self.strategy = strategy
        self.every = every
        self.total_steps = total_steps
        self.at_end = at_end
        self.last_saved: tuple[int, str] | None = None
        """(step, path) of the newest checkpoint this manager wrote."""
        initialized = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if initialized else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if initialized else 1)
        self.tensor_parallel = tensor_parallel
        """distributed.tensor_parallel: recorded in the marker; DCP reshards across layouts."""
        self._checked: str | None = None
        """The checkpoint `choose_resume` chose and checked (not checked again when named again)."""

    @classmethod
    def for_plan(cls, plan: Plan, *, rank: int, world_size: int) -> "CheckpointManager":
        t = plan.train
        return cls(t.output_dir, keep=t.keep_checkpoints, strategy=plan.distributed.strategy, every=t.checkpoint_every,
                   total_steps=t.steps, at_end=t.checkpoint_at_end, rank=rank, world_size=world_size,
                   tensor_parallel=plan.distributed.tensor_parallel)

    @property
    def format(self) -> str:
        return "deepspeed" if self.strategy == "deepspeed" else "dcp"

    def due(self, step: int) -> bool:
        """Whether the plan asks for a checkpoint after `step`: every `every` steps, and at the last
        step (train.checkpoint_at_end)."""
        return bool(self.every and step % self.every == 0) or (self.at_end and step == self.total_steps)

    def step_dir(self, step: int) -> str:
        return os.path.join(self.dir, f"step-{step}")

    # -- finding checkpoints -------------------------------------------------------------

    def complete(self) -> list[tuple[int, str]]:
        """(step, path) of every complete checkpoint, oldest first."""
        return record.complete(self.dir)

    def latest_complete(self) -> str | None:
        """The newest complete checkpoint, or None."""
        found = self.complete()
        return found[-1][1] if found else None

    def resolve_resume(self, resume: str) -> str | None:
        """train.resume -> the checkpoint to load, or None to start fresh: `choose_resume`'s path."""
        return self.choose_resume(resume).path

    def choose_resume(self, resume: str) -> Choice:
        """train.resume -> the checkpoint to load (its path None: start fresh), and the newer ones skipped.
        Collective: the ranks check the files together and all take the same one.

        "auto": the newest intact checkpoint of this run (none there: a fresh start); a newer one that fails its
        check (record.py) is skipped, and when every one fails the error names each. "never": none; an error if
        this run's folder already holds checkpoints. Anything else is a path: a checkpoint folder, which must be
        intact, or a run's output_dir or checkpoints folder (its newest intact checkpoint, as "auto")."""
        if resume not in ("auto", "never") and os.path.abspath(os.path.expanduser(resume)) == self._checked:
            return Choice(self._checked)  # chosen already (open_run), named again (restore_train_state)
        kind, path = self._on_rank0(lambda: self._resolve(resume))
        if kind is None:
            return Choice(None)
        if kind == "checkpoint":
            found = self._on_rank0(lambda: record.candidate(path))
            why = found.problem or self.damage(found)
            if why is not None:
                raise InputError(KEY, f"{resume} is damaged: {why}",
                                 f'name another checkpoint, or its checkpoints folder {os.path.dirname(path)} (its newest intact one), '
                                 'or set train.resume = "auto"')
            choice = Choice(path, unchecked=found.unchecked)
        else:
            choice = self.newest_intact(path)
            if choice.path is None and choice.skipped:
                raise InputError(
                    KEY, f"no checkpoint in {path} is intact: "
                    + "; ".join(f"{os.path.basename(p)}: {why}" for p, why in choice.skipped),
                    f"restore one from a copy, or move {path} aside to start this run afresh")
        self._checked = choice.path
        return choice

    def newest_intact(self, folder: str | None = None, *, weights_only: bool = False) -> Choice:
        """The newest checkpoint in checkpoints folder `folder` (default: this run's) that passes its check, and
        the newer ones that failed (its path None: none passed, or there is none). `weights_only`: check only the
        files the weights are read from (an export). Collective."""
        found = self._on_rank0(lambda: record.candidates(folder or self.dir))
        skipped = []
        for candidate in found:
            why = candidate.problem or self.damage(candidate, weights_only=weights_only)
            if why is None:
                return Choice(candidate.path, tuple(skipped), candidate.unchecked)
            skipped.append((candidate.path, why))
        return Choice(None, tuple(skipped))

    def damage(self, candidate: record.Candidate, *, weights_only: bool = False) -> str | None:
        """What is wrong with `candidate`'s files against its record, or None (also where it has no record). Every
        rank checks its share of the files; all see what every rank found. Collective."""
        files = candidate.files
        if files is None:
            return None
        if weights_only:
            part = record.weights_part(candidate.marker)
            files = {name: entry for name, entry in files.items() if name.startswith(part)}
        mine = record.share(files, self.rank, self.world_size)
        found = self._each_rank(lambda: record.check(candidate.path, files, mine), gather=True)
        problems = sorted(p for rank_found in found for p in rank_found)
        return record.summary(problems) if problems else None

    def _resolve(self, resume: str) -> tuple[str | None, str | None]:
        """train.resume -> ("checkpoint", its folder), ("folder", a checkpoints folder) or (None, None) for a fresh start."""
        if resume == "auto":
            return "folder", self.dir
        if resume == "never":
            found = self.complete()
            if found:
                raise InputError(
                    KEY,
                    f'"never" starts a fresh run, but {self.dir} already holds {len(found)} complete checkpoint(s) of a run '
                    f"(newest: step-{found[-1][0]}) that it would overwrite",
                    'set train.resume = "auto" to continue that run, or give this run a new train.output_dir, '
                    f"or delete {self.dir}",
                )
            return None, None
        path = os.path.abspath(os.path.expanduser(resume))
        if not os.path.isdir(path):
            raise InputError(KEY, f"{resume} does not exist (as {path})",
                             'name a checkpoint folder (<output_dir>/checkpoints/step-N), or set train.resume = "auto"')
        if read_marker(path) is not None:
            return "checkpoint", path
        for folder in (path, os.path.join(path, CHECKPOINTS)):
            if record.candidates(folder):
                return "folder", folder
        newest = self.latest_complete()
        raise InputError(
            KEY,
            f"{resume} is not a complete checkpoint: it has no readable {MARKER} (a save that did not finish, or not a checkpoint)",
            f"name a complete one{f', e.g. {newest}' if newest else ''}, or set train.resume = \"auto\"",
        )

    # -- saving ---------------------------------------------------------------------------

    def save(self, step: int, *, model: Any, optimizer: Any = None, scheduler: Any = None, deepspeed_engine: Any = None,
             grad_scaler: Any = None, data_state: dict | None = None, extra: dict | None = None, precision: Any = None,
             optimizer_layout: str = NESTED) -> str:
        """Write checkpoint `step` atomically, then remove the ones beyond `keep`. Collective: every
        rank calls it with its own state. Returns the checkpoint's path once it is complete everywhere.
        `optimizer_layout`: FLAT where the optimizer holds a pipeline stage's parameters (Engine.flat_optimizer_state).

        DDP/FSDP2: `model` (the wrapped model), `optimizer`, `scheduler`. DeepSpeed: `deepspeed_engine`
        (its own checkpoint holds model, optimizer, lr schedule and loss scale). `data_state` and
        `extra` are this rank's (plain values and tensors). `precision` is unused here; load takes it."""
        start = time.monotonic()
        rank_state = {
            "format_version": FORMAT_VERSION, "step": step, "rank": self.rank, "world_size": self.world_size,
            "rng": rng_state(),  # first, before anything below could draw a random number
            "data": data_state, "extra": dict(extra or {}),
            "scheduler": scheduler.state_dict() if scheduler is not None and deepspeed_engine is None else None,
            "grad_scaler": grad_scaler.state_dict() if grad_scaler is not None and grad_scaler.is_enabled() else None,
        }
        final, tmp = self.step_dir(step), os.path.join(self.dir, f"{_TMP}step-{step}")
        self._on_rank0(lambda: _fresh_folder(self.dir, tmp))
        self._each_rank(lambda: _check_shared(tmp, self.rank))
        float8_scales, written_layout = False, None
        try:
            if self.format == "deepspeed":
                if deepspeed_engine is None:
                    raise ValueError("strategy deepspeed: pass deepspeed_engine= (Engine.train_state() names it)")
                # TE modules' _extra_state empty in DeepSpeed's files: their scaling state goes into the rank file
                with _clean_param_names(deepspeed_engine), te_state.empty_extra_state(deepspeed_engine.module):
                    deepspeed_engine.save_checkpoint(os.path.join(tmp, "deepspeed"), tag=DS_TAG)
            else:
                float8_scales, rank_state["fp8_extra_state"], written_layout = _save_dcp(tmp, model, optimizer, optimizer_layout)
            rank_state["te_scaling"] = te_state.scaling_state(_inner(deepspeed_engine.module if deepspeed_engine is not None else model))
        except (OSError, RuntimeError, CheckpointException) as e:
            if isinstance(e, RuntimeError) and not disk.full(e, tmp):  # torch.save reports a full disk as a stream error
                raise
            raise _write_error(tmp, e, self.dir) from e
        self._each_rank(lambda: _write_rank_file(os.path.join(tmp, _rank_file(self.rank)), rank_state))
        # every rank has written: each describes its own files (record.py), rank 0 gathers them into the marker
        described = self._each_rank(lambda: record.describe(tmp, record.owned(tmp, self.rank, self.world_size)), gather=True)
        marker = {
            "format_version": FORMAT_VERSION, "step": step, "world_size": self.world_size, "strategy": self.strategy,
            "tensor_parallel": self.tensor_parallel, "format": self.format, "float8_precomputed_scale": float8_scales,
            "fp8launch_version": __version__, "torch_version": torch.__version__,
            "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        if written_layout == FLAT:  # a pipeline stage's (dcp.py); absent: nested, as every checkpoint before it
            marker["optimizer_layout"] = FLAT
        self._on_rank0(lambda: self._publish(tmp, final, marker, start, described))
        self.last_saved = (step, final)
        return final

    def _publish(self, tmp: str, final: str, marker: dict, start: float, described: list[dict]) -> None:
        """Rank 0, once every rank has written and described its files: the marker with the record of every
        file, atomic rename, fsync, then pruning."""
        try:
            marker["files"] = record.merge(tmp, described)
            _fsync_tree(tmp)
            marker["save_seconds"] = round(time.monotonic() - start, 3)
            _write_json(os.path.join(tmp, MARKER), marker)
            _fsync_dir(tmp)
            replaced = None
            if os.path.exists(final):  # the same step saved again (e.g. the final step of a resumed, finished run)
                replaced = os.path.join(self.dir, f"{_TRASH}{os.path.basename(final)}")
                os.replace(final, replaced)
            os.replace(tmp, final)
            _fsync_dir(self.dir)
            if replaced:
                shutil.rmtree(replaced, ignore_errors=True)
            self._prune(final)
        except OSError as e:
            raise _write_error(tmp, e, self.dir) from e

    def _prune(self, saved: str) -> None:
        # never the checkpoint just saved: a resumed run saves below the damaged checkpoints it skipped
        for _, path in [c for c in self.complete()[: -self.keep] if c[1] != saved]:
            trash = os.path.join(self.dir, _TRASH + os.path.basename(path))
            os.replace(path, trash)  # a folder half deleted must not look like a checkpoint
            shutil.rmtree(trash, ignore_errors=True)
        _fsync_dir(self.dir)

    # -- loading --------------------------------------------------------------------------

    def load(self, path: str, *, model: Any, optimizer: Any = None, scheduler: Any = None, deepspeed_engine: Any = None,
             grad_scaler: Any = None, precision: Any = None) -> LoadedState:
        """Restore model, optimizer, lr schedule, grad scaler, FP8 scale state and this rank's RNG
        from checkpoint `path` (from `resolve_resume`). Collective. Returns the step, this rank's
        data position and `extra` for the loop to restore. `precision`: the run's (a Transformer Engine
        one restores the delayed-scaling state the rank file holds)."""
        marker = read_marker(path)
        if marker is None:
            raise InputError(KEY, f"{path} is not a complete checkpoint (no readable {MARKER})", 'set train.resume = "auto"')
        saved_ws = int(marker.get("world_size", 0))
        warnings = self._check_saved_layout(path, marker)
        own = self.rank < saved_ws
        state = self._each_rank(lambda: _read_rank_file(os.path.join(path, _rank_file(self.rank if own else 0))))
        try:
            # TE's scaling state first, as TE's own _load_from_state_dict sets its extra state before copying FP8 weights
            _restore_te_scaling(_inner(deepspeed_engine.module if deepspeed_engine is not None else model),
                                state.get("te_scaling") or {}, precision)
            if self.format == "deepspeed":
                with _clean_param_names(deepspeed_engine), _naming_reads(deepspeed_engine, path):
                    loaded, _ = deepspeed_engine.load_checkpoint(
                        os.path.join(path, "deepspeed"), tag=DS_TAG, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True)
                if loaded is None:
                    raise RuntimeError(f"DeepSpeed found no checkpoint in {os.path.join(path, 'deepspeed')}")
            else:
                _load_dcp(path, model, optimizer, state.get("fp8_extra_state") or {}, marker.get("float8_precomputed_scale", False),
                          marker.get("optimizer_layout", NESTED))
        except (RuntimeError, ValueError, KeyError, CheckpointException) as e:
            raise _load_error(path, marker, e) from e
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])
        if grad_scaler is not None and state.get("grad_scaler") is not None:
            grad_scaler.load_state_dict(state["grad_scaler"])
        if own:
            set_rng_state(state["rng"])  # last: nothing above may draw from the restored generators
        return LoadedState(path=path, step=int(marker["step"]), data_state=state.get("data"), extra=state.get("extra") or {},
                           saved_world_size=saved_ws, warnings=tuple(warnings))

    def _check_saved_layout(self, path: str, marker: dict) -> list[str]:
        """Refuse a checkpoint of another format, or a DeepSpeed one of another world size; the warnings of one written
        at another layout (resharded exactly, but the data order differs)."""
        saved_format, saved_ws = marker.get("format", "dcp"), int(marker.get("world_size", 0))
        if saved_format != self.format:
            raise InputError(
                KEY,
                f'{path} was written by distributed.strategy = "{marker.get("strategy")}" ({saved_format} format); '
                f'this run uses "{self.strategy}" ({self.format} format)',
                f'resume with distributed.strategy = "{marker.get("strategy")}", or start fresh in a new train.output_dir '
                f"(export the weights first: see docs/checkpoints.md)",
            )
        warnings = []
        saved_tp = int(marker.get("tensor_parallel", 1))
        if saved_ws == self.world_size and saved_tp != self.tensor_parallel:  # same processes, another DP x TP layout
            warnings.append(
                f"{path} was written at data-parallel x tensor-parallel {Layout.of_degrees(saved_ws, tp=saved_tp).dp} x {saved_tp} "
                f"and this run is {Layout.of_degrees(self.world_size, tp=self.tensor_parallel).dp} x {self.tensor_parallel}: "
                "the model and optimizer were resharded exactly, "
                "but the data position and random state are per process, so the data order differs from an uninterrupted run"
            )
        if saved_ws != self.world_size:
            if self.format == "deepspeed":
                raise InputError(
                    KEY,
                    f"{path} was written by {saved_ws} processes and this run has {self.world_size}; "
                    "DeepSpeed's ZeRO checkpoints load only at the world size that wrote them",
                    f"resume with distributed.nodes x procs_per_node = {saved_ws}, or convert it with DeepSpeed's "
                    "ds_to_universal.py and start a new run from the weights",
                )
            warnings.append(
                f"{path} was written by {saved_ws} processes and this run has {self.world_size}: the model and optimizer "
                "were resharded exactly, but the data position and random state are per process, so the data order "
                "(and any randomness) differs from an uninterrupted run"
            )
        return warnings

    # -- the loop's TrainState ---------------------------------------------------------------

    def save_train_state(self, state) -> str:
        """`save` for the loop's TrainState: its engine's model, optimizer, schedule (or DeepSpeed
        engine) and grad scaler, its data position, and its counters as `extra`."""
        engine = state.engine
        return self.save(state.step, **engine.train_state(), grad_scaler=engine.precision.grad_scaler,
                         optimizer_layout=FLAT if engine.flat_optimizer_state else NESTED,
                         data_state=state.data.state_dict() if hasattr(state.data, "state_dict") else None,
                         extra={"tokens_seen": state.tokens_seen, "skipped_steps": state.skipped_steps,
                                "precision_phase": getattr(state, "precision_phase", 0),
                                "tracker_ids": dict(getattr(state, "tracker_ids", {}))})

    def callback(self, state) -> None:
        """A Trainer callback: a checkpoint after every `every` steps and after the last one."""
        if self.due(state.step):
            self.save_train_state(state)

    def save_unless_saved(self, state) -> str:
        """A checkpoint of `state` now (a preemption), unless this manager just wrote one of this step."""
        if self.last_saved is not None and self.last_saved[0] == state.step and read_marker(self.last_saved[1]) is not None:
            return self.last_saved[1]
        return self.save_train_state(state)

    def restore_train_state(self, state, resume: str) -> LoadedState | None:
        """train.resume applied to the loop's TrainState: None when starting fresh, else what was
        loaded (its `warnings` are for the caller to log). `resume` may also be a path
        `resolve_resume` already returned. Call it after the engine and the data stream exist and
        right before training (in the entrypoint: before the MetricsLogger, whose start step it
        sets): it restores the random state as the last thing."""
        path = self.resolve_resume(resume)
        if path is None:
            return None
        engine = state.engine
        loaded = self.load(path, **engine.train_state(), grad_scaler=engine.precision.grad_scaler, precision=engine.precision)
        state.step = loaded.step
        state.tokens_seen = int(loaded.extra.get("tokens_seen", 0))
        state.skipped_steps = int(loaded.extra.get("skipped_steps", 0))
        state.precision_phase = int(loaded.extra.get("precision_phase", 0))
        state.tracker_ids = dict(loaded.extra.get("tracker_ids") or {})
        if loaded.data_state is not None and hasattr(state.data, "load_state_dict"):
            state.data.load_state_dict(loaded.data_state)
        return loaded

    # -- agreeing across ranks ------------------------------------------------------------

    def _distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _on_rank0(self, fn: Callable[[], Any]) -> Any:
        """fn() on rank 0; every rank returns its result or raises its error (also a barrier)."""
        result, error = None, None
        if self.rank == 0:
            try:
                result = fn()
            except Exception as e:  # noqa: BLE001 - re-raised below, after telling the other ranks
                error = e
        if self._distributed():
            box = [(result, _describe(error))]
            dist.broadcast_object_list(box, src=0)
            result, failure = box[0]
            if error is None and failure is not None:
                raise _remote_error(failure, "rank 0")
        if error is not None:
            raise error
        return result

    def _each_rank(self, fn: Callable[[], Any], *, gather: bool = False) -> Any:
        """fn() on every rank, returning its result (with `gather`, every rank's, by rank); if it fails anywhere,
        every rank raises (also a barrier)."""
        result, error = None, None
        try:
            result = fn()
        except OSError as e:
            error = _write_error(self.dir, e, self.dir)
        except Exception as e:  # noqa: BLE001 - re-raised below, after telling the other ranks
            error = e
        results = [result]
        if self._distributed():
            gathered: list = [None] * self.world_size
            dist.all_gather_object(gathered, (_describe(error), result if gather and error is None else None))
            results = [r for _, r in gathered]
            if error is None:
                rank, failure = next(((r, f) for r, (f, _) in enumerate(gathered) if f), (None, None))
                if failure is not None:
                    raise _remote_error(failure, f"rank {rank}")
        if error is not None:
            raise error
        return results if gather else result


def _inner(model: Any) -> Any:
    """The user's model inside DDP (whose module names carry "module."); any other model as it is."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _restore_te_scaling(model: Any, saved: dict, precision: Any) -> None:
    """The rank file's Transformer Engine delayed-scaling state back into the model's TE modules."""
    if not saved:
        return
    delayed_recipe = getattr(precision, "delayed_recipe", None)
    if delayed_recipe is None:
        raise ValueError(f"the checkpoint holds Transformer Engine delayed-scaling state of {len(saved)} module(s) and this run's "
                         "precision is not Transformer Engine")
    te_state.restore_scaling_state(model, saved, delayed_recipe, getattr(precision, "recipe", None))


def _te_refusal_line(error: BaseException) -> str:
    while error is not None and te_state.REFUSAL not in str(error):
        error = error.__cause__ or error.__context__
    text = str(error) if error is not None else ""
    return text[text.index(te_state.REFUSAL):].split(". ")[0] if te_state.REFUSAL in text else text


def _describe(error: BaseException | None) -> tuple[str, int, str | None] | None:
    """An error as (message, exit code, rule), to send to the other ranks; `where` is added to a foreign one."""
    if error is None:
        return None
    if isinstance(error, LauncherError):
        return error.message, error.exit_code, error.rule or ""
    return f"{type(error).__name__}: {_first_line(error)}", EnvironmentProblem.exit_code, None


def _remote_error(failure: tuple[str, int, str | None], where: str) -> LauncherError:
    """The error another rank raised, raised here too (so no rank waits for the others forever)."""
    message, exit_code, rule = failure
    return LauncherError(message if rule is not None else f"{where}: {message}", rule=rule or None, exit_code=exit_code)


# -- files --------------------------------------------------------------------------------

def _fresh_folder(checkpoints: str, tmp: str) -> None:
    """Rank 0 before a save: remove what crashed saves and prunes left behind, create `tmp`."""
    try:
        os.makedirs(checkpoints, exist_ok=True)
        for name in os.listdir(checkpoints):
            if name.startswith((_TMP, _TRASH)):
                shutil.rmtree(os.path.join(checkpoints, name), ignore_errors=True)
        os.makedirs(tmp)
    except OSError as e:
        raise _write_error(tmp, e, checkpoints) from e


def _check_shared(tmp: str, rank: int) -> None:
    if not os.path.isdir(tmp):
        raise EnvironmentProblem(
            f"rank {rank} cannot see the checkpoint folder {tmp} that rank 0 created: train.output_dir must be on a "
            "filesystem every node shares; fix: set train.output_dir to a shared path (NFS, Lustre, ...)"
        )


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _write_rank_file(path: str, state: dict) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _read_rank_file(path: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(KEY, f"{path} is missing from a checkpoint marked complete", "resume from another checkpoint") from None
    except Exception as e:  # noqa: BLE001 - unpickling errors have many types
        if "Unsupported global" in str(e):  # weights_only met an object: the data_state or extra given to save
            raise InputError(KEY, f"cannot read {path} ({_first_line(e)})",
                             "keep data_state and extra to plain values and tensors, or resume from another checkpoint") from e
        raise InputError(KEY, f"{os.path.dirname(path)}: {record.UnreadableFile.of(os.path.basename(path), e)}",
                         "resume from an older checkpoint (train.resume = its path), or restore this one from a copy") from e


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    if sys.platform == "win32":  # pragma: no cover - directories cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    """fsync every file and folder under `root` (DeepSpeed does not; DCP does its own files)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(folder)


def _write_error(path: str, error: BaseException, checkpoints: str) -> EnvironmentProblem:
    """A failed write of `path`: a full disk named as such (with the newest complete checkpoint in `checkpoints`)."""
    if disk.full(error, path):
        newest = record.complete(checkpoints)
        return disk.DiskFull(path, checkpoints=True, newest=newest[-1][1] if newest else None)
    return EnvironmentProblem(f"cannot write checkpoint {path}: {_first_line(error)}; "
                              "fix: check the free space and permissions of train.output_dir")


def _first_line(error: BaseException) -> str:
    failures = getattr(error, "failures", None)  # DCP's CheckpointException: the first rank's own error says what happened
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        inner = inner[0] if isinstance(inner, tuple) else inner
        if isinstance(inner, BaseException):
            return f"{type(inner).__name__}: {_first_line(inner)}"
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


def _load_error(path: str, marker: dict, e: BaseException) -> InputError:
    """What a checkpoint that would not load says: Transformer Engine's refused pickle, a damaged file, or state that
    does not fit this run's model and optimizer."""
    if te_state.is_te_refusal(e):
        return InputError(
            KEY,
            f"{path} holds Transformer Engine's pickled delayed-scaling state (written before fp8launch kept it as plain "
            f"tensors) and Transformer Engine refuses to unpickle it: \"{_te_refusal_line(e)}\"",
            f'if you trust this checkpoint (your own run\'s), resume with launch.env {te_state.UNSAFE_PICKLE_ENV} = "1", '
            "or start fresh in a new train.output_dir",
        )
    unreadable = record.unreadable_in(e)
    if unreadable is not None:  # a damaged file the record could not tell (none, or it changed since)
        older = [p for s, p in record.complete(os.path.dirname(path)) if s < int(marker["step"])]
        return InputError(KEY, f"{path}: {unreadable}",
                          f"resume from an older checkpoint (train.resume = \"{older[-1]}\")" if older else
                          "restore it from a copy, or start fresh in a new train.output_dir")
    return InputError(
        KEY,
        f"{path} does not fit this run's model and optimizer ({_first_line(e)})",
        "resume with the train.model, train.optimizer and precision that wrote it, or start fresh in a new train.output_dir",
    )
