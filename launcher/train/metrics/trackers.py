"""Experiment trackers: TensorBoard, Weights & Biases and MLflow get the run's metrics, on rank 0 (docs/trackers.md).

    trackers = build_trackers(plan, enabled=env.is_main)          # [] on the other ranks and without [log]
    logger = MetricsLogger(..., trackers=trackers, tracker_ids=state.tracker_ids)
    logger.start(record, line)       # opens each tracker (exit 3 naming log.X when one cannot start)
    state.tracker_ids = logger.tracker_ids()   # saved in every checkpoint: a resumed run continues the same tracked runs

Each tracker: `open(start_record, resume_ids)` -> where it writes; `log(record)` for every record the
logger writes (it keeps what it tracks: the step metrics, evaluations' eval_* fields, the FP8 monitor's
per-sample summary), with the optimizer step as x; `ids()` -> {name: run id} for the checkpoint; `close()`.
A library is imported in `open`, and only for a tracker the spec turns on: wandb and mlflow take a
second or more to import.
"""

from __future__ import annotations

import math
import os
import pathlib
import sys
import time
import typing
from typing import Any

from launcher.errors import EnvironmentProblem, LauncherError, with_fix

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

TRACKED_STEP_FIELDS = ("loss", "lr", "tokens_per_s", "tflops_per_device", "mfu", "peak_mem_gib", "grad_norm", "step_time_s")
"""What every step record gives the trackers (a None, e.g. MFU on a CPU, is left out)."""

FP8_EVENT = "fp8_stats"
"""The event of the FP8 monitor's per-sample summary (`fp8/...` fields; launcher/train/monitor/records.py)."""

TENSORBOARD_DIR = "tensorboard"
MLRUNS_DIR = "mlruns"


def metrics_of(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers a tracker logs from a record at `record["step"]`: a step record's metrics, an
    evaluation's eval_* fields, the FP8 monitor summary's fp8/* fields; {} for the others (start, end, ...)."""
    event = record.get("event")
    if event == "step":
        names = TRACKED_STEP_FIELDS
    elif event == "eval":
        names = [k for k in record if k.startswith("eval_")]
    elif event == FP8_EVENT:
        names = [k for k in record if k.startswith("fp8/")]
    else:
        return {}
    return {k: float(record[k]) for k in names if _number(record.get(k))}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_config(plan: Plan, start: dict[str, Any]) -> dict[str, Any]:
    """The settings a tracked run is filed under (W&B config, MLflow params), flat, by their spec names."""
    from launcher import __version__

    p, d, t = plan.precision, plan.distributed, plan.train
    return {
        "name": plan.name,
        "precision.mode": p.mode,
        "precision.backend": p.backend,
        "precision.recipe": start.get("recipe") or "",
        "precision": start.get("precision") or "",
        "distributed.strategy": d.strategy,
        "distributed.nodes": d.nodes,
        "distributed.procs_per_node": d.procs_per_node,
        "distributed.tensor_parallel": d.tensor_parallel,
        "distributed.global_batch_size": d.global_batch_size,
        "compile.enabled": plan.compile.enabled,
        "activation_checkpointing.mode": plan.activation_checkpointing.mode,
        "train.model": t.model,
        "train.data": t.data,
        "train.seq_len": t.seq_len,
        "train.micro_batch_size": t.micro_batch_size,
        "train.grad_accum_steps": t.grad_accum_steps,
        "train.steps": t.steps,
        "train.optimizer": t.optimizer,
        "train.lr": t.lr,
        "train.weight_decay": t.weight_decay,
        "train.warmup_steps": t.warmup_steps,
        "train.max_grad_norm": t.max_grad_norm,
        "train.seed": t.seed,
        "world_size": start.get("world_size", plan.world_size),
        "tokens_per_step": plan.tokens_per_step,
        "parameters": start.get("parameters"),
        "fp8_layers": start.get("fp8_layers"),
        "total_linear": start.get("total_linear"),
        "device_name": start.get("device_name"),
        "torch_version": start.get("torch_version"),
        "fp8launch_version": __version__,
        "spec_sha256": plan.spec_sha256,
    }


class Tracker:
    """One experiment tracker. Subclasses set `name` and `fix`, and write in `_open`, `_write` and `_close`."""

    name = ""
    fix = ""
    """What to change when the tracker cannot start (after the library's own reason)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.output_dir = plan.train.output_dir
        self.ended = False
        """Whether the run's end record came through (the tracked run finished, rather than stopped)."""
        self.broken = False
        """It failed to log mid-run and gets nothing more (see `log`)."""
        self._open_now = False

    @property
    def key(self) -> str:
        """The spec key that turns it on, for messages."""
        return f"log.{self.name}"

    def open(self, start: dict[str, Any], resume_ids: dict[str, str]) -> str:
        """Start (or, with this tracker's id in `resume_ids`, continue) the tracked run; returns where it
        writes. Whatever stops it raises EnvironmentProblem naming the key and the fix."""
        try:
            where = self._open(start, resume_ids)
        except LauncherError:
            raise
        except Exception as e:  # the libraries raise many kinds; each becomes one line with the fix
            raise EnvironmentProblem(with_fix(f"{self.key}: {self.name} could not start ({type(e).__name__}: {_first_line(e)})",
                                              self.fix)) from e
        self._open_now = True
        return where

    def log(self, record: dict[str, Any]) -> None:
        """Write what the tracker keeps of `record`. A failure mid-run (a tracking server gone after the library's
        own retries, a full disk) warns and the run goes on without this tracker: metrics.jsonl has every record."""
        if record.get("event") == "end":
            self.ended = True
        metrics = metrics_of(record)
        if not (metrics and "step" in record and self._open_now) or self.broken:
            return
        try:
            self._write(int(record["step"]), metrics)
        except Exception as e:  # noqa: BLE001 - hours of training are worth more than one tracker's points
            self.broken = True  # no more tries: each could stall rank 0 in the library's retries again
            _warn(with_fix(f"{self.key}: {self.name} could not log step {record['step']} ({type(e).__name__}: "
                           f"{_first_line(e)}); training goes on without it and metrics.jsonl has every record", self.fix))

    def ids(self) -> dict[str, str]:
        """{name: run id} to save in the checkpoint; {} for a tracker without ids."""
        return {}

    def close(self) -> None:
        """Finish the tracked run (finished after the end record, stopped otherwise); a failure only warns."""
        if not self._open_now:
            return
        self._open_now = False
        try:
            self._close()
        except Exception as e:  # noqa: BLE001 - closing happens after the run: never turn it into a traceback
            _warn(with_fix(f"{self.key}: {self.name} did not close cleanly ({type(e).__name__}: {_first_line(e)}); "
                           "what it logged before stays", self.fix))

    def _open(self, start: dict[str, Any], resume_ids: dict[str, str]) -> str:
        raise NotImplementedError

    def _write(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    """Event files under <output_dir>/tensorboard/, one scalar per metric at x = the optimizer step."""

    name = "tensorboard"

    @property
    def fix(self) -> str:
        return f"make {self.log_dir} writable, or set log.tensorboard = false"

    @property
    def log_dir(self) -> str:
        return os.path.join(self.output_dir, TENSORBOARD_DIR)

    def _open(self, start, resume_ids) -> str:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides the events at steps >= this one that earlier files hold: what a crashed
        # attempt wrote past the checkpoint this run resumes from, or an earlier fresh run in the same folder.
        self.writer = SummaryWriter(log_dir=self.log_dir, purge_step=int(start.get("start_step", 0)) + 1, flush_secs=30)
        if not start.get("start_step"):
            rows = "\n".join(f"| {k} | {v} |" for k, v in run_config(self.plan, start).items())
            self.writer.add_text("config", "| setting | value |\n|---|---|\n" + rows, global_step=0)
        return self.log_dir

    def _write(self, step, metrics) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=step)

    def _close(self) -> None:
        self.writer.close()


WANDB_MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline"}
"""WANDB_MODE's values (W&B's docs: online, offline, disabled; "dryrun" and "run" its old names) -> the mode they mean."""


class WandbTracker(Tracker):
    """A W&B run, online or offline (under <output_dir>/wandb/, or WANDB_DIR). Each of log.wandb's keys the spec leaves
    empty takes what W&B users set in the environment: WANDB_PROJECT (else the spec name), WANDB_ENTITY (else your
    default), WANDB_MODE (else online), WANDB_DIR (else the run's output_dir)."""

    name = "wandb"

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self.settings = plan.log.wandb
        self.run = None

    @property
    def mode(self) -> str:
        """The spec's mode, else WANDB_MODE's; WANDB_MODE=disabled beside log.wandb on stops the run (exit 3)."""
        if self.settings.get("mode"):
            return self.settings["mode"]
        env = os.environ.get("WANDB_MODE", "").strip().lower()
        if env == "disabled":
            raise EnvironmentProblem(with_fix("log.wandb is on but WANDB_MODE=disabled in the environment: the run would train "
                                              "without the tracker the spec asks for",
                                              'unset WANDB_MODE, set log.wandb.mode = "offline", or log.wandb = false'))
        return WANDB_MODES.get(env, "online")

    @property
    def project(self) -> str:
        return self.settings.get("project") or os.environ.get("WANDB_PROJECT") or self.plan.name

    @property
    def folder(self) -> str:
        return os.path.abspath(os.environ.get("WANDB_DIR") or self.output_dir)

    @property
    def fix(self) -> str:
        if self.mode == "online":
            return ('check the network and your W&B login (`wandb login`, or WANDB_API_KEY), and log.wandb.project / entity; '
                    'or set log.wandb.mode = "offline" and upload later with `wandb sync`')
        return f"make {self.folder} writable, or set log.wandb = false"

    def _open(self, start, resume_ids) -> str:
        import wandb

        mode = self.mode
        # The spec's mode for the whole process, WANDB_MODE included: an offline run's library then sends
        # nothing (its error telemetry follows the global mode), and an online run never falls back to offline.
        wandb.setup(wandb.Settings(mode=mode))
        if mode == "online" and not wandb.login(prompt=False, verify=False):  # no prompt in a training job
            raise EnvironmentProblem(with_fix(
                'log.wandb: mode "online" but this machine has no W&B credentials (no WANDB_API_KEY, no `wandb login`)',
                'run `wandb login` (or set WANDB_API_KEY) where the job runs, or set log.wandb.mode = "offline" '
                "and upload later with `wandb sync`"))
        resume_id = resume_ids.get(self.name)
        config = run_config(self.plan, start)
        extra = {"quiet": True, "show_info": False}  # where it writes is in our trackers line
        if "WANDB_CONSOLE" not in os.environ:
            extra["console"] = "off"  # the run's lines are in metrics.jsonl; not wrapping stdout/stderr keeps our one-line errors
        run = wandb.init(
            project=self.project,
            entity=self.settings.get("entity") or os.environ.get("WANDB_ENTITY") or None,
            dir=self.folder,
            id=resume_id,
            resume="allow" if resume_id else None,
            name=self.plan.name,
            config=config,
            mode=mode,
            force=mode == "online",
            reinit="create_new",
            settings=wandb.Settings(**extra),
        )
        if run.settings.mode != mode:  # e.g. a login timeout disables W&B: never train on without the tracker asked for
            run.finish(exit_code=1)
            raise EnvironmentProblem(with_fix(f'log.wandb: W&B started in mode "{run.settings.mode}", not "{mode}"', self.fix))
        self.run = run
        if resume_id:  # resuming online loads the server's config over ours: this attempt's settings win (a raised train.steps)
            run.config.update(config, allow_val_change=True)
        if mode == "offline":
            folder = os.path.dirname(os.path.abspath(run.dir))  # <output_dir>/wandb/offline-run-<time>-<id>/ (run.dir: its files/)
            # one folder per attempt of a resumed run: `wandb sync` uploads them in order, into the one run
            every = os.path.join(os.path.dirname(_shown(folder)), f"offline-run-*-{run.id}*")
            return f"offline run {run.id} in {_shown(folder)} (upload: wandb sync {every})"
        return f"run {run.id} at {run.url}"

    def _write(self, step, metrics) -> None:
        self.run.log(metrics, step=step)

    def ids(self) -> dict[str, str]:
        return {self.name: self.run.id} if self.run is not None else {}

    def _close(self) -> None:
        self.run.finish(exit_code=0 if self.ended else 1)


class MlflowTracker(Tracker):
    """An MLflow run in the experiment MLFLOW_EXPERIMENT_NAME names (else the spec's name): on the server
    MLFLOW_TRACKING_URI names, else in a file store under <output_dir>/mlruns."""

    name = "mlflow"

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self.run_id: str | None = None

    @property
    def uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or pathlib.Path(self.output_dir, MLRUNS_DIR).resolve().as_uri()

    @property
    def experiment(self) -> str:
        return os.environ.get("MLFLOW_EXPERIMENT_NAME") or self.plan.name

    @property
    def fix(self) -> str:
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return ("set MLFLOW_TRACKING_URI to a tracking server (http(s)://HOST:PORT) or a database this machine reaches, "
                    f"or unset it for a file store under {os.path.join(self.output_dir, MLRUNS_DIR)}, or set log.mlflow = false")
        return f"make {self.output_dir} writable, or set log.mlflow = false"

    def _open(self, start, resume_ids) -> str:
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # MLflow 3 refuses file stores unless this is set: allowed here, for the store fp8launch chooses,
            # never for a URI the user gives (docs/trackers.md).
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = self.uri
        self.client = client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(self.experiment)
        resume_id = resume_ids.get(self.name)
        if resume_id and self._exists(resume_id):
            self.run_id = resume_id
            client.update_run(resume_id, status="RUNNING")
        else:
            if resume_id:
                _warn(with_fix(f"log.mlflow: run {resume_id} (from the checkpoint) is not in {uri}: a new run continues the "
                               f"metrics from step {int(start.get('start_step', 0)) + 1}",
                               "to continue that run instead, set MLFLOW_TRACKING_URI to the store it was started in"))
            run = client.create_run(experiment_id, run_name=self.plan.name, tags={"mlflow.source.name": "fp8launch"})
            self.run_id = run.info.run_id
            # Params once per run: MLflow refuses to change a logged param, and a resumed run keeps its own.
            client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in run_config(self.plan, start).items()])
        return f"{uri} run {self.run_id} (experiment {self.experiment!r})"

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        return True

    def _write(self, step, metrics) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def ids(self) -> dict[str, str]:
        return {self.name: self.run_id} if self.run_id else {}

    def _close(self) -> None:
        if not self.broken:  # a server that failed mid-run would stall the end of the run in the same retries
            self.client.set_terminated(self.run_id, status="FINISHED" if self.ended else "KILLED")


TRACKERS: dict[str, type[Tracker]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}
"""plan.log.trackers name -> its class."""


def build_trackers(plan: Plan, *, enabled: bool) -> list[Tracker]:
    """The trackers of plan.log, not yet open; [] where `enabled` is False (every rank but 0). Imports nothing."""
    if not enabled:
        return []
    return [TRACKERS[name](plan) for name in plan.log.trackers]


def open_trackers(trackers: list[Tracker], start: dict[str, Any], resume_ids: dict[str, str]) -> dict[str, str]:
    """Open each tracker: {name: where it writes}. If one cannot start, the ones already open are closed
    and its EnvironmentProblem goes on (the run stops before step 1)."""
    where = {}
    try:
        for tracker in trackers:
            where[tracker.name] = tracker.open(start, resume_ids)
    except BaseException:
        close_trackers(trackers)
        raise
    return where


def close_trackers(trackers: list[Tracker]) -> None:
    for tracker in trackers:
        tracker.close()


def trackers_line(where: dict[str, str]) -> str:
    """The start line that says where each tracker writes."""
    return "trackers: " + "; ".join(f"{name} -> {text}" for name, text in where.items())


def _shown(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__
