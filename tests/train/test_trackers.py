"""The [log] trackers against the real libraries, in this process: what TensorBoard's EventAccumulator, an
offline W&B run's .wandb file and MLflow's client read back; resuming continues the same tracked runs; rank
!= 0 writes nothing; a tracker that cannot start stops the run (exit 3) naming its key. No test reaches the
network: W&B runs offline (or stops before it would connect), MLflow uses file stores, and the
`no_network` fixture refuses any connection that leaves this machine."""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from launcher.errors import EnvironmentProblem
from launcher.planning.install import INSTALL
from launcher.train.metrics import METRICS_FILE, MetricsLogger, Throughput, step_record
from launcher.train.metrics.trackers import TRACKED_STEP_FIELDS, build_trackers, metrics_of
from launcher.train.monitor.records import sample_summary
from tests.support import plan_from

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

THROUGHPUT = Throughput(tokens_per_step=64, world_size=1, flops_per_token=1e6, peak_tflops=None)
ALL = {"tensorboard": True, "wandb": {"mode": "offline", "project": "fp8launch-tests"}, "mlflow": True}


def _local(host) -> bool:
    return host in ("localhost", "127.0.0.1", "::1", "", None) or str(host).startswith("127.")


@pytest.fixture(scope="module", autouse=True)
def no_network(tmp_path_factory):
    """W&B offline and silent, its folders and MLflow's variables out of the user's home and environment, and every
    connection from this process that would leave the machine refused (W&B's wandb-core process talks to us on
    localhost; its server address points at a closed local port)."""
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_BASE_URL": "http://127.0.0.1:9",
                           "WANDB_CONFIG_DIR": str(home / "config"), "WANDB_CACHE_DIR": str(home / "cache"),
                           "WANDB_DATA_DIR": str(home / "data"), "WANDB_ERROR_REPORTING": "false",
                           "NETRC": str(home / "no-netrc")}.items():
            mp.setenv(key, value)
        for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
            mp.delenv(key, raising=False)
        connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

        def guarded_connect(self, address):
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
                raise AssertionError(f"a test tried to reach {address}")
            return connect(self, address)

        def guarded_getaddrinfo(host, *args, **kwargs):
            if not _local(host):
                raise AssertionError(f"a test tried to resolve {host}")
            return getaddrinfo(host, *args, **kwargs)

        mp.setattr(socket.socket, "connect", guarded_connect)
        mp.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
        yield


@pytest.fixture(autouse=True)
def clean_tracker_env(monkeypatch):
    """MLFLOW_ALLOW_FILE_STORE, set by the MLflow tracker for its own file store, is removed after each test."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)


def _plan(out: Path, log: dict, steps: int = 4):
    return plan_from({"launch": {"device": "cpu"}, "train": {"output_dir": str(out), "steps": steps}, "log": log})


def _logger(plan, *, start_step: int = 0, ids: dict | None = None, enabled: bool = True) -> MetricsLogger:
    return MetricsLogger(output_dir=plan.train.output_dir, enabled=enabled, total_steps=plan.train.steps, start_step=start_step,
                         stream=io.StringIO(), progress=False, trackers=build_trackers(plan, enabled=enabled), tracker_ids=ids)


def _step(step: int, loss: float, *, grad_norm: float | None = 0.5) -> dict:
    return step_record(step=step, loss=loss, lr=1e-3 * step, step_time_s=0.25, throughput=THROUGHPUT, peak_mem_gib=1.5,
                       grad_norm=grad_norm)


def _session(plan, steps: dict[int, float], *, start_step: int = 0, ids: dict | None = None, end: bool = True,
             evals: dict[int, float] | None = None) -> MetricsLogger:
    """A run's records through a MetricsLogger with the plan's trackers: start, steps (step -> loss), evaluations
    (step -> eval_loss) right after their step, an FP8 monitor summary per step, and the end record."""
    logger = _logger(plan, start_step=start_step, ids=ids)
    logger.start({"name": plan.name, "start_step": start_step, "recipe": "tensorwise", "parameters": 123}, "start")
    for step, loss in steps.items():
        logger.step(_step(step, loss))
        if evals and step in evals:
            logger.event({"event": "eval", "step": step, "eval_loss": evals[step], "eval_perplexity": 2.0 ** evals[step],
                          "eval_tokens": 512}, "eval")
        logger.track({"event": "fp8_stats", "step": step, "fp8/underflow_max": step / 100, "fp8/layers_over_warn": 1})
    if end:
        logger.end({"steps_run": len(steps), "final_step": max(steps), "first_loss": steps[min(steps)],
                    "final_loss": steps[max(steps)], "elapsed_s": 1.0,
                    "median_tokens_per_s": 1.0, "peak_mem_gib": 1.5, "skipped_steps": 0})
    logger.close()
    return logger


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]


# --- what each library reads back -------------------------------------------------------------

def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_records(path: Path):
    """The protobuf Records of a .wandb file: a 7-byte header (":W&B", magic 0xBEE1, version 0), then LevelDB-log
    chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) that never cross a 32 KiB block (wandb 0.31
    writes it from wandb-core and has no Python reader left: sdk/internal/datastore.py is gone)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_run(folder: Path, timeout_s: float = 20.0) -> tuple[str, dict, dict[int, dict[str, float]]]:
    """(run id, config, step -> {metric: value}) of one offline run folder. wandb-core (its own process) may still be
    writing the file when finish() has returned (seen under load): read it again until the run record is there."""
    deadline, size = time.monotonic() + timeout_s, -1
    while True:
        now = sum(p.stat().st_size for p in folder.glob("run-*.wandb"))
        run_id, config, history = _wandb_file(folder)
        if (run_id is not None and now == size) or time.monotonic() > deadline:  # the run record there, the file settled
            return run_id, config, history
        size = now
        time.sleep(0.3)


def _wandb_file(folder: Path) -> tuple[str, dict, dict[int, dict[str, float]]]:
    (path,) = folder.glob("run-*.wandb")
    run_id, config, history = None, {}, {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[record.history.step.num] = {k: v for k, v in row.items() if not k.startswith("_")}
    return run_id, config, history


def wandb_folders(out: Path) -> list[Path]:
    return sorted((out / "wandb").glob("offline-run-*"))


# --- tests ------------------------------------------------------------------------------------

def test_metrics_of_keeps_the_step_metrics_eval_and_fp8_fields():
    record = _step(3, 2.5, grad_norm=None)
    assert set(metrics_of(record)) == set(TRACKED_STEP_FIELDS) - {"mfu", "grad_norm"}  # None: left out
    assert metrics_of({**record, "loss": float("nan")}).get("loss") is None
    assert metrics_of({"event": "eval", "step": 3, "eval_loss": 2.0, "eval_note": "x", "eval_ok": True}) == {"eval_loss": 2.0}
    assert metrics_of({"event": "fp8_stats", "step": 3, "fp8/underflow_max": 0.25}) == {"fp8/underflow_max": 0.25}
    assert metrics_of({"event": "start", "step": 0, "loss": 1.0}) == {}


def test_tensorboard_holds_each_metric_at_its_step(tmp_path):
    plan = _plan(tmp_path / "run", {"tensorboard": True})
    _session(plan, {1: 3.0, 2: 2.5}, evals={2: 2.75})
    scalars = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    assert scalars["loss"] == [(1, 3.0), (2, 2.5)]
    assert scalars["lr"] == [(1, pytest.approx(1e-3)), (2, pytest.approx(2e-3))]
    assert scalars["tokens_per_s"] == [(1, 256.0), (2, 256.0)] and scalars["grad_norm"] == [(1, 0.5), (2, 0.5)]
    assert scalars["eval_loss"] == [(2, 2.75)] and scalars["eval_tokens"] == [(2, 512.0)]
    assert scalars["fp8/underflow_max"] == [(1, pytest.approx(0.01)), (2, pytest.approx(0.02))]
    assert "mfu" not in scalars  # null on a CPU: nothing logged
    start = _records(tmp_path / "run")[0]
    assert start["trackers"] == {"tensorboard": str(tmp_path / "run" / "tensorboard")}


def test_wandb_offline_run_holds_the_history_and_config(tmp_path):
    out = tmp_path / "run"
    plan = _plan(out, {"wandb": ALL["wandb"]})
    logger = _session(plan, {1: 3.0, 2: 2.5}, evals={2: 2.75})
    (folder,) = wandb_folders(out)
    run_id, config, history = wandb_run(folder)
    assert logger.tracker_ids() == {"wandb": run_id} and folder.name.endswith(f"-{run_id}")
    assert history[1]["loss"] == 3.0 and history[1]["lr"] == pytest.approx(1e-3) and history[1]["step_time_s"] == 0.25
    assert history[2]["loss"] == 2.5 and history[2]["eval_loss"] == 2.75 and history[2]["fp8/underflow_max"] == 0.02
    assert "mfu" not in history[1]
    assert config["train.steps"] == 4 and config["precision.recipe"] == "tensorwise" and config["parameters"] == 123
    start = _records(out)[0]
    assert start["trackers"]["wandb"].startswith(f"offline run {run_id} in ") and "wandb sync" in start["trackers"]["wandb"]


def test_wandb_true_takes_mode_project_and_folder_from_the_environment_where_the_spec_says_nothing(tmp_path, monkeypatch):
    """`[log] wandb = true` with WANDB_MODE=offline, WANDB_PROJECT and WANDB_DIR set (as W&B users do): an offline run
    in that project and folder (before: the default "online" overrode WANDB_MODE and failed without credentials)."""
    elsewhere = tmp_path / "wandb-dir"
    elsewhere.mkdir()
    monkeypatch.setenv("WANDB_PROJECT", "from-the-env")
    monkeypatch.setenv("WANDB_DIR", str(elsewhere))
    out = tmp_path / "run"
    plan = _plan(out, {"wandb": True})
    assert plan.log.wandb == {"enabled": True, "project": "", "entity": "", "mode": ""}  # what plan.json keeps: nothing said
    tracker = build_trackers(plan, enabled=True)[0]
    assert (tracker.mode, tracker.project, tracker.folder) == ("offline", "from-the-env", str(elsewhere))
    _session(plan, {1: 3.0})
    (folder,) = sorted((elsewhere / "wandb").glob("offline-run-*"))
    _, config, history = wandb_run(folder)
    assert history[1]["loss"] == 3.0 and not (out / "wandb").exists()
    # the spec wins where it says something; WANDB_MODE=disabled beside log.wandb on would train without the tracker: refused
    assert build_trackers(_plan(tmp_path / "b", {"wandb": {"mode": "online", "project": "mine"}}), enabled=True)[0].project == "mine"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(EnvironmentProblem, match="WANDB_MODE=disabled"):
        build_trackers(plan, enabled=True)[0].mode


def test_mlflow_experiment_name_comes_from_the_environment_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team-runs")
    plan = _plan(tmp_path / "run", {"mlflow": True})
    tracker = build_trackers(plan, enabled=True)[0]
    assert tracker.experiment == "team-runs"
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    assert tracker.experiment == plan.name


def test_mlflow_file_store_holds_the_history_params_and_status(tmp_path):
    out = tmp_path / "run"
    plan = _plan(out, {"mlflow": True})
    logger = _session(plan, {1: 3.0, 2: 2.5}, evals={2: 2.75})
    run_id = logger.tracker_ids()["mlflow"]
    client = MlflowClient((out / "mlruns").resolve().as_uri())
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 3.0), (2, 2.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval_loss")] == [(2, 2.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "fp8/underflow_max")] == [(1, 0.01), (2, 0.02)]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and client.get_experiment(run.info.experiment_id).name == plan.name
    assert run.data.params["train.steps"] == "4" and run.data.params["precision.mode"] == plan.precision.mode
    assert _records(out)[0]["trackers"]["mlflow"] == f"{(out / 'mlruns').resolve().as_uri()} run {run_id} (experiment 't')"


def test_a_resumed_run_continues_the_same_tracked_runs(tmp_path):
    """Attempt 1 logs steps 1..3 and stops (its checkpoint is at step 2); attempt 2 resumes from step 2 with the
    ids that checkpoint holds and logs 3..4: one W&B run id, one MLflow run with steps 1..4, and TensorBoard shows
    attempt 2's step 3, not the crashed attempt's."""
    out = tmp_path / "run"
    plan = _plan(out, ALL)
    first = _session(plan, {1: 3.0, 2: 2.5, 3: 9.0}, end=False)
    ids = first.tracker_ids()
    assert set(ids) == {"wandb", "mlflow"}
    client = MlflowClient((out / "mlruns").resolve().as_uri())
    assert client.get_run(ids["mlflow"]).info.status == "KILLED"  # stopped before its end record
    # TensorBoard orders a folder's event files by name (seconds, host, pid, a per-process counter): a new second
    # keeps attempt 2's file after attempt 1's whatever the counter (separate processes in a real run).
    time.sleep(1.01 - time.time() % 1)
    second = _session(plan, {3: 2.0, 4: 1.5}, start_step=2, ids=ids)
    assert second.tracker_ids() == ids

    assert [(m.step, m.value) for m in client.get_metric_history(ids["mlflow"], "loss")] == [
        (1, 3.0), (2, 2.5), (3, 9.0), (3, 2.0), (4, 1.5)]  # MLflow keeps every point it was given, in the same run
    assert client.get_run(ids["mlflow"]).info.status == "FINISHED"
    assert len(client.search_runs([client.get_experiment_by_name(plan.name).experiment_id])) == 1

    folders = wandb_folders(out)
    assert len(folders) == 2 and all(f.name.endswith(f"-{ids['wandb']}") or f.name.endswith(f"-{ids['wandb']}-1") for f in folders)
    runs = [wandb_run(f) for f in folders]
    assert {r[0] for r in runs} == {ids["wandb"]}
    histories = sorted((r[2] for r in runs), key=min)
    assert {s: h["loss"] for s, h in histories[0].items()} == {1: 3.0, 2: 2.5, 3: 9.0}
    assert {s: h["loss"] for s, h in histories[1].items()} == {3: 2.0, 4: 1.5}

    scalars = tensorboard_scalars(out / "tensorboard")
    assert scalars["loss"] == [(1, 3.0), (2, 2.5), (3, 2.0), (4, 1.5)]  # the crashed attempt's step 3 (9.0) is purged
    starts = [r for r in _records(out) if r["event"] == "start"]
    assert [s["trackers"]["mlflow"].split(" run ")[1].split()[0] for s in starts] == [ids["mlflow"]] * 2


def test_other_ranks_write_nothing_and_import_no_tracker(tmp_path):
    out = tmp_path / "run"
    plan = _plan(out, ALL)
    assert build_trackers(plan, enabled=False) == []
    logger = _logger(plan, enabled=False)
    logger.start({"name": "t", "start_step": 0}, "start")
    logger.step(_step(1, 3.0))
    logger.track({"event": "fp8_stats", "step": 1, "fp8/underflow_max": 0.1})
    logger.close()
    assert not out.exists() and logger.tracker_ids() == {}
    # building the trackers (rank 0) imports no tracker library: only opening one does
    code = ("import sys; from tests.support import plan_from; from launcher.train.metrics.trackers import build_trackers; "
            f"build_trackers(plan_from({{'log': {ALL!r}}}), enabled=True); "
            "print(sorted(m for m in ('wandb', 'mlflow', 'tensorboard', 'torch') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
                       check=False)
    assert r.returncode == 0 and r.stdout.split("\n")[-2] == "[]", r.stderr[-2000:]


def test_a_missing_tracker_package_stops_run_before_torchrun(cli, spec, monkeypatch):
    """`fp8launch run` checks the trackers' packages like the backends' (preflight: exit 3, the install hint)."""
    from launcher.commands import preflight

    monkeypatch.setattr(preflight, "importable", lambda name: name != "wandb")
    path = spec('version = 1\nname = "w"\n[launch]\ndevice = "cpu"\n[precision]\nmode = "bf16"\n'
                '[distributed]\nprocs_per_node = 1\n[log]\ntensorboard = true\n[log.wandb]\nmode = "offline"\n')
    r = cli("run", path)
    assert r.exit_code == 3
    assert r.stderr.splitlines()[-1] == ("error[BACKEND-MISSING]: the wandb package is not importable here; fix: install it: "
                                         f"{INSTALL['wandb']}")
    assert "pip install" in INSTALL["wandb"] and "wandb" in INSTALL["wandb"]


@pytest.mark.parametrize("uri", ["bogus://tracking", "a-file/mlruns"])
def test_a_broken_mlflow_tracking_uri_stops_the_run_naming_log_mlflow(tmp_path, monkeypatch, uri):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri if "://" in uri else (tmp_path / uri).as_uri())
    out = tmp_path / "run"
    logger = _logger(_plan(out, {"tensorboard": True, "mlflow": True}))
    with pytest.raises(EnvironmentProblem) as e:
        logger.start({"name": "t", "start_step": 0}, "start")
    assert e.value.exit_code == 3
    assert e.value.message.startswith("log.mlflow: mlflow could not start (")
    assert e.value.message.endswith("; fix: set MLFLOW_TRACKING_URI to a tracking server (http(s)://HOST:PORT) or a database "
                                    f"this machine reaches, or unset it for a file store under {out / 'mlruns'}, "
                                    "or set log.mlflow = false")
    assert "\n" not in e.value.message
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # the user's store: not ours to allow
    assert not any(t._open_now for t in logger.trackers) and logger._file is None  # TensorBoard, opened first, is closed
    assert (out / METRICS_FILE).read_text() == ""  # no start record for a run that never started


def test_wandb_online_without_credentials_stops_before_connecting(tmp_path):
    """WANDB_MODE=offline is set here (no_network): log.wandb.mode wins over it, and it is "online"."""
    logger = _logger(_plan(tmp_path / "run", {"wandb": {"mode": "online"}}))
    with pytest.raises(EnvironmentProblem) as e:
        logger.start({"name": "t", "start_step": 0}, "start")
    assert e.value.exit_code == 3
    assert e.value.message == ('log.wandb: mode "online" but this machine has no W&B credentials (no WANDB_API_KEY, no '
                               '`wandb login`); fix: run `wandb login` (or set WANDB_API_KEY) where the job runs, or set '
                               'log.wandb.mode = "offline" and upload later with `wandb sync`')
    assert not (tmp_path / "run" / "wandb").exists()


def test_wandb_online_that_cannot_reach_its_server_stops_the_run(tmp_path, monkeypatch):
    """A key but no server (WANDB_BASE_URL is a closed local port here): W&B's own timeout, then one line naming
    log.wandb, instead of a run that trains on untracked or drops to offline."""
    import wandb

    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "3")
    wandb.teardown()  # W&B reads its environment once per process, when set up: from here on with this one
    logger = _logger(_plan(tmp_path / "run", {"wandb": {"mode": "online"}}))
    try:
        with pytest.raises(EnvironmentProblem) as e:
            logger.start({"name": "t", "start_step": 0}, "start")
    finally:
        monkeypatch.undo()
        wandb.teardown()
    assert e.value.exit_code == 3 and "\n" not in e.value.message
    assert e.value.message.startswith("log.wandb: wandb could not start (CommError: ")
    assert e.value.message.endswith('; fix: check the network and your W&B login (`wandb login`, or WANDB_API_KEY), and '
                                    'log.wandb.project / entity; or set log.wandb.mode = "offline" and upload later with `wandb sync`')


def test_a_tracker_failing_mid_run_warns_and_the_run_goes_on_without_it(tmp_path, capsys):
    out = tmp_path / "run"
    logger = _logger(_plan(out, {"tensorboard": True}))
    logger.start({"name": "t", "start_step": 0}, "start")
    (tracker,) = logger.trackers

    calls = []

    def broken(step, metrics):
        calls.append(step)
        raise OSError("disk full")

    tracker._write = broken
    for step in (1, 2):
        logger.step(_step(step, 3.0))
    logger.close()
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: log.tensorboard")]
    expected = (f"warning: log.tensorboard: tensorboard could not log step 1 (OSError: disk full); training goes on "
                f"without it and metrics.jsonl has every record; fix: make {out / 'tensorboard'} writable, "
                "or set log.tensorboard = false")
    assert warnings == [expected]
    assert [r["step"] for r in _records(out) if r["event"] == "step"] == [1, 2] and calls == [1]  # no second try


def test_the_monitor_summary_of_a_sample():
    records = [{"step": 6, "layer": "a", "tensor": "input", "underflow": 0.01, "overflow": 0.0},
               {"step": 6, "layer": "a", "tensor": "weight", "underflow": 0.30, "overflow": 0.0},
               {"step": 6, "layer": "b", "tensor": "input", "underflow": 0.02, "overflow": 0.002},
               {"step": 6, "layer": "c", "tensor": "input", "underflow": 0.03, "overflow": 0.0}]
    summary = sample_summary(records, underflow_warn=0.1, overflow_warn=0.001)
    assert summary == {"event": "fp8_stats", "step": 6, "fp8/underflow_max": 0.30, "fp8/underflow_mean": pytest.approx(0.09),
                       "fp8/overflow_max": 0.002, "fp8/overflow_mean": pytest.approx(0.0005), "fp8/layers_over_warn": 2}


def test_a_training_run_logs_to_all_three_and_checkpoints_their_ids(tmp_path, monkeypatch):
    """builtin:llama-debug (1 layer) in FP8 with the monitor, 2 steps through the entrypoint's build_run in this
    process: each tracker's loss is metrics.jsonl's at each step, the monitor's summaries reach them, and the
    checkpoint holds the run ids."""
    from tests.train._engine_setup import make_plan, train_in_process

    out = tmp_path / "out"
    _, plan_dir = make_plan(tmp_path, **{"train.model": "builtin:llama-debug?layers=1", "train.steps": 2, "train.output_dir": str(out),
                                         "precision.mode": "fp8", "precision.backend": "torchao",
                                         "precision.torchao.skip_small": False, "monitor.fp8_stats_every": 1,
                                         "log.tensorboard": True, "log.mlflow": True, "log.wandb": {"mode": "offline"}})
    stream = io.StringIO()
    train_in_process(f"{plan_dir}/plan.json", stream=stream)
    records = _records(out)
    losses = {r["step"]: r["loss"] for r in records if r["event"] == "step"}
    assert sorted(losses) == [1, 2]
    start = records[0]
    assert set(start["trackers"]) == {"tensorboard", "wandb", "mlflow"}
    assert "trackers: tensorboard -> " in stream.getvalue()

    scalars = tensorboard_scalars(out / "tensorboard")
    assert scalars["loss"] == [(s, pytest.approx(v, rel=1e-6)) for s, v in sorted(losses.items())]  # float32 in event files
    assert [s for s, _ in scalars["fp8/underflow_max"]] == [1, 2]
    (folder,) = wandb_folders(out)
    run_id, _, history = wandb_run(folder)
    assert {s: h["loss"] for s, h in history.items()} == losses and all("fp8/overflow_max" in h for h in history.values())
    ids = torch.load(out / "checkpoints" / "step-2" / "rank-00000.pt", weights_only=True)["extra"]["tracker_ids"]
    assert ids["wandb"] == run_id
    client = MlflowClient((out / "mlruns").resolve().as_uri())
    assert {m.step: m.value for m in client.get_metric_history(ids["mlflow"], "loss")} == losses
    assert client.get_run(ids["mlflow"]).info.status == "FINISHED"


def test_a_failure_after_the_trackers_opened_but_before_training_closes_them(tmp_path, monkeypatch):
    """build_run opens the trackers with the start record; if it fails after that (here: the monitor's note), the
    MLflow run ends KILLED, not left RUNNING, and the error reaches the caller."""
    from launcher.train import monitor as monitor_module
    from tests.train._engine_setup import make_plan, train_in_process

    out = tmp_path / "out"
    _, plan_dir = make_plan(tmp_path, **{"train.model": "builtin:llama-debug?layers=1", "train.steps": 2, "train.output_dir": str(out),
                                         "log.mlflow": True})

    def broken(*args, **kwargs):
        raise RuntimeError("broken after the start record")

    monkeypatch.setattr(monitor_module, "unwatched_note", broken)
    with pytest.raises(RuntimeError, match="broken after the start record"):
        train_in_process(f"{plan_dir}/plan.json", stream=io.StringIO())
    client = MlflowClient((out / "mlruns").resolve().as_uri())
    (experiment,) = [e for e in client.search_experiments() if e.name == "t"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "KILLED"
