"""Faults of the machine around a run, each named in one line (issue 49, item 7): odd metrics.jsonl lines under `fp8launch
report`, a CPU run bigger than this machine's memory, a rendezvous port another program holds, a full disk; and the
pieces `fp8launch run` reads a failed run with (torchrun's failure table, a failing rank's held lines, a partial last
line). The runs that need real ranks are in tests/e2e/test_faults.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from launcher.commands import failure, rendezvous
from launcher.targets.disk import DiskFull, no_space
from launcher.train.metrics import MetricsLogger, jsonl
from tests.hostile.corpus import Case, check
from tests.support import tmpfs

pytest.importorskip("matplotlib")

STEP = {"event": "step", "step": 1, "loss": 2.0, "lr": 0.1, "tokens_per_s": 10.0, "tflops_per_device": 0.1, "mfu": None,
        "peak_mem_gib": 0.4, "step_time_s": 0.1}
GOOD = json.dumps({"event": "start", "name": "odd"}) + "\n" + json.dumps(STEP) + "\n"


def _metrics(text: str) -> dict[str, str]:
    return {"run/metrics.jsonl": text}


REPORT_CASES = [
    Case(id="not-json", argv=("report", "run"), code=0, files=_metrics(GOOD + "not json\n"),
         line=r"^note: run/metrics\.jsonl: 1 line skipped \(line 3: not JSON\)$"),
    Case(id="json-array", argv=("report", "run"), code=0, files=_metrics(GOOD + "[1, 2]\n"),
         line=r"^note: run/metrics\.jsonl: 1 line skipped \(line 3: a JSON array, not an object\)$"),
    Case(id="json-string", argv=("report", "run"), code=0, files=_metrics('"a string"\n' + GOOD),
         line=r"^note: run/metrics\.jsonl: 1 line skipped \(line 1: a JSON string, not an object\)$"),
    Case(id="string-for-a-number", argv=("report", "run"), code=0,
         files=_metrics(GOOD + json.dumps({**STEP, "step": 2, "loss": "high"}) + "\n"),
         line=r'^note: run/metrics\.jsonl: 1 line skipped \(line 3: its "loss" is "high", not a number\)$'),
    Case(id="missing-keys", argv=("report", "run"), code=0, files=_metrics(GOOD + '{"event": "step"}\n{"step": 3}\n'),
         line=r'^note: run/metrics\.jsonl: 2 lines skipped \(line 3: a step record without a step number; line 4: no "event"\)$'),
    Case(id="cut-short", argv=("report", "run"), code=0, files=_metrics(GOOD + '{"event": "step", "st'),
         line=r"^note: run/metrics\.jsonl: 1 line skipped \(line 3: cut short \(no newline at the end of the file\)\)$"),
    Case(id="many-bad-lines", argv=("report", "run"), code=0, files=_metrics(GOOD + "x\n" * 5),
         line=r"^note: run/metrics\.jsonl: 5 lines skipped \(line 3: not JSON; line 4: not JSON; line 5: not JSON; and 2 more\)$"),
    Case(id="empty", argv=("report", "run"), code=2, files=_metrics(""), absent=("run/report.png",),
         line=r"^error: run/metrics\.jsonl has no step records yet; fix: report a run that has logged at least one step$"),
    Case(id="no-usable-step", argv=("report", "run"), code=2, absent=("run/report.png",),
         files=_metrics(json.dumps({**STEP, "step": "1"}) + "\n" + json.dumps({**STEP, "step": True}) + "\n"),
         line=r'^error: run/metrics\.jsonl has no step record that can be drawn: 2 lines skipped \(line 1: its "step" is "1", not a '
              r'step number; line 2: its "step" is true, not a step number\); fix: report a run that has logged at least one step$'),
    Case(id="odd-fp8-stats", argv=("report", "run"), code=0,
         files={**_metrics(GOOD), "run/fp8_stats.jsonl": '{"step": 1, "layer": "l", "tensor": "input", "underflow": "x"}\n[]\n'},
         line=r"^note: run/fp8_stats\.jsonl: 2 lines skipped \(line 1: not an FP8 stats record; line 2: a JSON array, not an object\)$"),
]


@pytest.mark.parametrize("case", REPORT_CASES, ids=str)
def test_report_on_odd_metrics_lines(case, tmp_path):
    got = check(case, tmp_path)
    if case.code == 0:
        assert got.stdout == "wrote run/report.png\n" and (tmp_path / "case" / "run" / "report.png").stat().st_size > 10_000


BIG_CPU = 'version = 1\nname = "big"\n[launch]\ndevice = "cpu"\n[train]\nmodel = "builtin:llama3-70b"\n[distributed]\nprocs_per_node = 2\n'
PREFLIGHT_CASES = [
    Case(id="cpu-run-beyond-memory", argv=("run", "s.toml"), code=3, files={"s.toml": BIG_CPU}, absent=("runs",),
         line=r"^error\[MEMORY-EXCEEDS-HOST\]: 2 ranks x \d+\.\d GiB \(the plan's memory estimate per rank: model states, "
              r"activations, initialisation\) = \d+\.\d GiB, but this machine has \d+\.\d GiB available \(MemAvailable\); the "
              r"kernel would kill a rank part-way; fix: use fewer ranks \(distributed\.procs_per_node\), set "
              r'activation_checkpointing\.mode = "full", lower train\.seq_len, choose a smaller '
              r"train\.model, or run on a machine with more memory$"),
    Case(id="cpu-run-beyond-memory-auto-device", argv=("run", "s.toml", "--set", "launch.device=auto"), code=3,
         files={"s.toml": BIG_CPU}, absent=("runs",), env={"CUDA_VISIBLE_DEVICES": ""}, lines=2,  # and the plan's GPU warning
         line=r"^error\[MEMORY-EXCEEDS-HOST\]: 2 ranks x"),
]


@pytest.mark.parametrize("case", PREFLIGHT_CASES, ids=str)
def test_preflight_refuses_before_anything_is_written(case, tmp_path):
    start = time.monotonic()
    check(case, tmp_path)
    assert time.monotonic() - start < 2.0


@contextmanager
def _listening(port: int = 0):
    """A program of the test's own holding a TCP port: it accepts and never answers, as a foreign server would."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(8)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


SMALL = 'version = 1\nname = "rdzv"\n[launch]\ndevice = "cpu"\n[train]\nmodel = "builtin:llama-debug"\n'


def test_a_held_rendezvous_port_is_refused_at_once_naming_the_port_the_key_and_the_holder(tmp_path):
    """Before: torchrun took the holder for its store and hung until it let go (208 s measured), then a traceback. A real
    process (hung torchrun would fail the case by its timeout), nothing written; the holder is this test's own process."""
    with _listening() as port:
        case = Case(id="held-port", argv=("run", "s.toml", "--rdzv-endpoint", f"localhost:{port}"), code=3, files={"s.toml": SMALL},
                    absent=("runs",), process=True, timeout=30,
                    line=rf"^error: the rendezvous port {port} \(--rdzv-endpoint = localhost:{port}\) is held by another program on "
                         rf"this machine \(pid {os.getpid()}: .*\); torchrun would take it for its store and wait for an answer "
                         r"that never comes; fix: stop that program, or give every node a free port: --rdzv-endpoint HOST:PORT "
                         r"\(or launch\.rdzv_endpoint\)$")
        start = time.monotonic()
        check(case, tmp_path)
        seconds = time.monotonic() - start
    assert seconds < 10, seconds  # one CLI start-up; measured 1.1 s


def test_the_plans_endpoint_names_its_key_and_its_own_fix(tmp_path):
    with _listening() as port:
        case = Case(id="held-port-plan", argv=("run", "s.toml", "--nodes", "2", "--set", f"launch.rdzv_endpoint=127.0.0.1:{port}"),
                    code=3, files={"s.toml": SMALL}, absent=("runs",),
                    line=rf"^error: the rendezvous port {port} \(launch\.rdzv_endpoint = 127\.0\.0\.1:{port}\) is held by another "
                         r'program .*; fix: stop that program, or give every node a free port: launch\.rdzv_endpoint = "HOST:PORT"$')
        check(case, tmp_path)


def test_a_port_held_by_this_jobs_own_torchrun_on_this_machine_is_no_error(tmp_path):
    """Two agents of one job on one machine (the loopback multi-node case): whichever starts first hosts the store, and
    the other must go on. The holder here is a process whose command line is such an agent's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "torchrun"
    agent.write_text("import socket, sys, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                     "s.bind(('0.0.0.0', 0))\ns.listen(1)\nprint(s.getsockname()[1], flush=True)\ntime.sleep(60)\n")
    from tests.support import plan_from

    plan = plan_from({"name": "job", "distributed": {"nodes": 2}})
    for rdzv_id, refused in (("job", False), ("another-job", True)):
        holder = subprocess.Popen([sys.executable, str(agent), "--nnodes", "2", "--rdzv-id", rdzv_id], stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            port = int(holder.stdout.readline())
            assert rendezvous.holder(port) == (holder.pid, [sys.executable, str(agent), "--nnodes", "2", "--rdzv-id", rdzv_id])
            env = {"RDZV_ENDPOINT": f"127.0.0.1:{port}"}
            if refused:
                with pytest.raises(Exception, match=rf"port {port} \(--rdzv-endpoint = 127\.0\.0\.1:{port}\) is held by another"):
                    rendezvous.check(plan, env, {})
            else:
                rendezvous.check(plan, env, {})
        finally:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()


def test_standalone_runs_check_no_port_and_a_free_port_passes():
    from tests.support import plan_from

    plan = plan_from({"name": "one"})
    assert rendezvous.endpoint(plan, {}, {}) is None  # one node, no endpoint: torchrun --standalone picks its own port
    assert rendezvous.endpoint(plan, {}, {"RDZV_ENDPOINT": "h:1"}) == ("h:1", "RDZV_ENDPOINT")
    with _listening() as port:
        pass
    rendezvous.check(plan, {"RDZV_ENDPOINT": f"localhost:{port}"}, {})  # free again: no error
    assert rendezvous.hosted_here("localhost") and rendezvous.hosted_here("127.0.0.2") and rendezvous.hosted_here(socket.gethostname())
    assert not rendezvous.hosted_here("192.0.2.1")  # TEST-NET-1: never this machine


@pytest.mark.slow
def test_another_machines_port_held_by_a_silent_program_is_refused_within_the_probe(monkeypatch):
    """The endpoint names another machine (hosted_here patched: there is one machine here) whose port a program holds that
    never answers: torch's own c10d client, in a subprocess, gets no answer within PROBE_S and the run is refused; a real
    store answers (torch's import in the probe: 2-6 s here)."""
    from tests.support import plan_from

    plan = plan_from({"name": "remote", "distributed": {"nodes": 2}})
    monkeypatch.setattr(rendezvous, "hosted_here", lambda host: False)
    monkeypatch.setattr(rendezvous, "PROBE_S", 15.0)
    with _listening() as port:
        start = time.monotonic()
        with pytest.raises(Exception, match=rf"the rendezvous endpoint 127\.0\.0\.1:{port} \(--rdzv-endpoint\) accepts connections "
                                            r"but does not answer as torch's c10d store within 15 s"):
            rendezvous.check(plan, {"RDZV_ENDPOINT": f"127.0.0.1:{port}"}, {})
        assert time.monotonic() - start < 20
    store = subprocess.Popen([sys.executable, "-c", "import datetime, time; from torch.distributed import TCPStore; "
                              "s = TCPStore('127.0.0.1', 0, is_master=True, timeout=datetime.timedelta(seconds=60)); "
                              "print(s.port, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(store.stdout.readline())
        rendezvous.check(plan, {"RDZV_ENDPOINT": f"127.0.0.1:{port}"}, {})  # a store: no error
    finally:
        os.killpg(store.pid, signal.SIGKILL)
        store.wait()


# -- a full disk, on a real filesystem of a few KB ----------

@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KB tmpfs mounted under tmp_path."""
    with tmpfs(tmp_path / "mnt", "64k") as mnt:
        yield mnt


def _fill(folder: Path) -> None:
    """Fill the filesystem of `folder` to its last byte."""
    with open(folder / "filler", "wb", buffering=0) as f:
        for size in (4096, 1):
            try:
                while True:
                    f.write(b"x" * size)
            except OSError:
                pass


def test_metrics_on_a_full_disk_is_one_line_naming_the_file_the_bytes_free_and_the_mount(tiny_tmpfs):
    logger = MetricsLogger(output_dir=str(tiny_tmpfs / "run"), enabled=True, total_steps=10, progress=False, stream=open(os.devnull, "w"))
    _fill(tiny_tmpfs)
    with pytest.raises(DiskFull) as caught:
        for step in range(1, 200):
            logger.step({**STEP, "step": step})
    logger.close()
    assert str(caught.value) == (f"error: no space left on device writing {tiny_tmpfs}/run/metrics.jsonl (0 bytes free on {tiny_tmpfs}); "
                                 f"fix: free space on {tiny_tmpfs}, or set train.output_dir to a folder on another filesystem")
    assert caught.value.exit_code == 3


def test_plan_into_a_full_disk_exits_3_naming_the_file(tiny_tmpfs, tmp_path):
    _fill(tiny_tmpfs)
    case = Case(id="plan-full-disk", argv=("plan", "s.toml", "--out", str(tiny_tmpfs / "gen")), code=3, files={"s.toml": SMALL},
                line=rf"^error: no space left on device writing {tiny_tmpfs}/gen/rdzv/ \(0 bytes free on {tiny_tmpfs}\); fix: free "
                     rf"space on {tiny_tmpfs}, or point --out at a folder on another filesystem$")
    check(case, tmp_path)


def test_no_space_is_found_inside_what_dcp_and_torch_raise():
    """DCP's CheckpointException keeps each rank's failure (rank -> (error, traceback)); torch.save's RuntimeError has the
    OSError as its context; a pickled one keeps only its text."""
    enospc = OSError(28, os.strerror(28))

    class CheckpointException(BaseException):  # DCP's holds `failures` like this (torch/distributed/checkpoint/api.py)
        failures = {1: (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), None)}

    wrapped = RuntimeError("unexpected pos")
    wrapped.__context__ = enospc
    CheckpointException.failures[0] = (wrapped, None)
    assert no_space(CheckpointException()) and no_space(enospc) and no_space(OSError(122, os.strerror(122)))
    assert no_space(RuntimeError("write failed: No space left on device"))
    assert not no_space(RuntimeError("unexpected pos 704 vs 598")) and not no_space(OSError(13, "Permission denied"))


# -- metrics.jsonl before a resumed run appends ----------

@pytest.mark.parametrize("tail, kept, said", [
    ('{"event": "step", "st', GOOD, "cut a partial last line (21 bytes, from a run stopped while writing it)"),
    (json.dumps(STEP), GOOD + json.dumps(STEP) + "\n", "its last record had no newline"),
    ("", GOOD, None),
])
def test_a_partial_last_line_is_cut_back_before_appending_and_said_once(tail, kept, said, tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(GOOD + tail)
    note = jsonl.repair(str(path))
    assert path.read_text() == kept
    assert (note is None) if said is None else (said in note)
    assert jsonl.repair(str(path)) is None  # once
    assert jsonl.repair(str(tmp_path / "none.jsonl")) is None


def test_the_logger_says_the_cut_in_its_start_lines(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(GOOD + '{"event": "st')
    shown = tmp_path / "out.txt"
    with open(shown, "w") as stream:
        logger = MetricsLogger(output_dir=str(tmp_path), enabled=True, total_steps=2, progress=False, stream=stream)
        logger.start({"name": "resumed"}, "the start line")
        logger.close()
    assert shown.read_text().splitlines()[0] == ("note: metrics.jsonl: cut a partial last line (13 bytes, from a run stopped while "
                                                 "writing it) back to the last complete record before appending")
    rows, problems = jsonl.read(str(tmp_path / "metrics.jsonl"))
    assert problems == [] and [r["event"] for _, r in rows] == ["start", "step", "start"]


# -- what `fp8launch run` reads a failed torchrun with ----------

TABLE = """\
W1207 21:38:58.067000 9696 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 9738 closing signal SIGTERM
E1207 21:38:58.841000 9696 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 9739)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
fp8launch-train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-07_21:38:58
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : {first} (pid: 9738) {first_name}
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_21:38:58
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : {root} (pid: 9739) {root_name}
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 9739
============================================================
"""
"""torchrun 2.13's report of a run whose rank 1 was killed with SIGKILL (the survivor, pid 9738, failed its collective
and exited 1; torchrun had sent it SIGTERM). Recorded from a real run's torchrun.log."""


@pytest.mark.parametrize("first, root, killed", [
    ("1", "-9", failure.Killed(1, 9)),  # the recorded run
    ("-15", "1", None),  # the survivor died of torchrun's own SIGTERM: a consequence; the root exited 1 (a Python error)
    ("-11", "1", None),  # pid 9738 was signalled by torchrun: its death is torchrun's doing
    ("1", "-2", None),  # Ctrl-C: the run's own business (exit 130)
    ("1", "-11", failure.Killed(1, 11)),
])
def test_the_rank_a_signal_killed_is_read_from_torchruns_table(first, root, killed):
    def name(code):
        return f"({__import__('signal').Signals(-int(code)).name})" if int(code) < 0 else ""

    text = TABLE.format(first=first, first_name=name(first), root=root, root_name=name(root))
    assert failure.killed(text.splitlines(keepends=True)) == killed


def test_the_killed_line_names_rank_signal_step_and_checkpoint(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(GOOD + json.dumps({**STEP, "step": 3}) + "\n" + '{"event": "start"}\n'
                                            + json.dumps({**STEP, "step": 4}) + "\n" + "{cut")
    line = failure.killed_line(failure.Killed(1, 9), str(tmp_path), "runs/k/checkpoints/step-2", 2)
    assert line == ("rank 1 was killed by SIGKILL (signal 9) after step 4; the other ranks stopped with it; the newest complete "
                    "checkpoint is runs/k/checkpoints/step-2; fix: find what sent it (SIGKILL: most often the kernel's out-of-memory "
                    "killer, which `dmesg` names; lower train.micro_batch_size or use fewer ranks if so); then run the same command "
                    "again to continue from that checkpoint")
    assert failure.killed(TABLE.format(first="1", first_name="", root="-9", root_name="").splitlines(True)).exit_code == 137
    assert "before its first logged step; no complete checkpoint was written yet; fix: find what sent it, or why the rank crashed " \
           "(SIGSEGV)" in failure.killed_line(failure.Killed(0, 11), str(tmp_path / "none"), None, 1)


def test_a_failing_ranks_traceback_and_error_line_are_held_and_its_other_lines_are_not():
    shown = []
    held = failure.Held()
    lines = [(0, "step 1/4 | loss 2\n"), (1, "[rank1]: Traceback (most recent call last):\n"), (1, '[rank1]:   File "x.py", line 1\n'),
             (0, "step 2/4 | loss 2\n"), (1, "[rank1]: RuntimeError: Connection closed by peer\n"), (1, "[rank1]: \n"),
             (1, "[rank1]: The above exception was the direct cause of the following exception:\n"),
             (1, "[rank1]: Traceback (most recent call last):\n"), (1, "[rank1]: ValueError: x\n"),
             (2, "[rank 2] error: step 3: non-finite loss nan; fix: lower train.lr\n"),
             (3, "Traceback (most recent call last):\n"), (3, "KeyError: 'a library logged it'\n"), (3, "step 3/4 on rank 3\n")]
    for rank, text in lines:
        held.line(rank, text, shown.append)
    assert shown == ["step 1/4 | loss 2\n", "step 2/4 | loss 2\n", "step 3/4 on rank 3\n"]
    assert held.errors() == ["error: step 3: non-finite loss nan; fix: lower train.lr"]
    held.release(("error",))
    assert shown[-1] == "[rank 2] error: step 3: non-finite loss nan; fix: lower train.lr\n" and held.lines == []


def test_a_rendezvous_failure_is_one_line_with_the_inner_error():
    agent = ["[W1207 21:46:54 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(...): Connection reset by peer\n",
             "Traceback (most recent call last):\n", '  File "torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py"\n',
             "torch.distributed.DistNetworkError: Connection reset by peer\n", "\n",
             "The above exception was the direct cause of the following exception:\n", "\n", "Traceback (most recent call last):\n",
             "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. "
             "See inner exception for details.\n"]
    assert failure.rendezvous_line(agent, "node0:29500", "--rdzv-endpoint") == (
        "torchrun could not join the rendezvous at node0:29500 (--rdzv-endpoint): Connection reset by peer; fix: check that node 0's "
        "agent runs and that node0:29500 reaches it from here (and that no other program holds that port there), or set "
        "--rdzv-endpoint to node 0's HOST:PORT")
    assert failure.rendezvous_line(["ValueError: something else\n"], "h:1", "launch.rdzv_endpoint") is None


def test_a_restart_after_a_killed_rank_is_one_note_and_a_final_failure_is_left_to_the_end():
    """launch.max_restarts = 1: torchrun reports the failure, stops the others (its own SIGTERM), and the ranks speak again:
    the failed attempt's tracebacks become one note. With no restart left the same lines stay held for `told`."""
    for restarts in (1, 0):
        shown, notes = [], []
        held = failure.Held(restarts=restarts)
        held.line(0, "[rank0]: Traceback (most recent call last):\n", shown.append)
        held.line(0, "[rank0]: RuntimeError: Connection closed by peer\n", shown.append)
        held.agent("W1207 api.py:1028] Sending process 10 closing signal SIGTERM\n", notes.append)
        held.agent("E1207 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 11) of binary: fp8launch-train\n", notes.append)
        held.line(0, "[rank0]: a last line of the old attempt, or the new attempt's first\n", shown.append)
        if restarts:
            assert notes == ["note: local rank 1 was killed by SIGKILL (signal 9); torchrun restarted the ranks (launch.max_restarts), "
                             "which resume from the newest complete checkpoint\n"]
            assert shown == ["[rank0]: a last line of the old attempt, or the new attempt's first\n"] and held.lines == []
        else:
            assert notes == [] and len(held.lines) == 2
