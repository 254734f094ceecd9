"""A run owns its folder (launcher/targets/runlock.py), in this process and a few small ones: the lock refuses a second
holder at once naming the first, goes with a dead holder, lets the run's own rank-0 worker join and nobody else, leaves
nothing behind after a failed command; a child started with `stop_with_this_process` gets SIGTERM when its parent is
killed -9; Ctrl-C in `fp8launch run` is one line and exit 130 (the real runs: tests/e2e/test_runlock.py)."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.commands.run import Command, RunInterrupted, claim, execute, launch_command, plan_for_run
from launcher.errors import EnvironmentProblem
from launcher.targets import runlock
from launcher.targets.runlock import LOCK_ENV, LOCK_FILE, PEER, for_worker, hold, join

SPEC = """
version = 1
name = "t"
[launch]
device = "cpu"
[train]
output_dir = "runs/t"
"""


@pytest.fixture
def held():
    """Holds taken in a test, released after it (this process would keep them otherwise)."""
    locks = []
    yield locks
    for lock in locks:
        lock.release()


def in_use_line(folder, holder: dict) -> str:
    return (f"error: train.output_dir {folder} is in use by another run: pid {holder['pid']} on host {holder['host']} "
            f"({holder['command']}, since {holder['started']}); fix: wait for it to end or stop it, or set train.output_dir "
            "to another folder")


def test_a_second_hold_is_refused_at_once_naming_the_first(tmp_path, held):
    folder = tmp_path / "runs" / "x"
    held.append(hold(str(folder)))
    holder = json.loads((folder / LOCK_FILE).read_text())
    assert (holder["pid"], holder["host"], holder["token"]) == (os.getpid(), socket.gethostname(), held[0].token)
    t0 = time.monotonic()
    with pytest.raises(EnvironmentProblem) as e:  # another open of the file: refused as another process would be
        hold(str(folder))
    assert time.monotonic() - t0 < 5  # no waiting for the holder (a waiting lock would wait for ever)
    assert e.value.exit_code == 3 and str(e.value) == in_use_line(folder, holder)
    assert json.loads((folder / LOCK_FILE).read_text()) == holder  # the refused one changed nothing


HOLDER = """
import sys
from launcher.targets.runlock import hold
hold(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def test_a_lock_held_by_another_process_is_refused_and_goes_with_its_death(tmp_path, held):
    folder = tmp_path / "out"
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert other.stdout.readline() == "held\n"
        with pytest.raises(EnvironmentProblem, match=rf"in use by another run: pid {other.pid} on host {socket.gethostname()} "):
            hold(str(folder))
    finally:
        os.killpg(other.pid, signal.SIGKILL)  # a holder killed -9: flock goes with its last open file
        other.wait()
    held.append(hold(str(folder)))  # taken over: the file stays, naming the new holder
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_the_rank0_worker_joins_its_launchers_hold_and_no_other(tmp_path, held):
    folder = str(tmp_path / "out")
    launcher = hold(folder)
    held.append(launcher)
    assert launcher.env == {LOCK_ENV: launcher.token}
    held.append(for_worker(folder, {LOCK_ENV: launcher.token}))  # joined: shared, beside the launcher's
    assert held[-1].fds and held[-1].token == launcher.token
    with pytest.raises(EnvironmentProblem, match="in use by another run"):
        for_worker(folder, {LOCK_ENV: "another-launcher:1:ab"})  # a token this lock file does not name
    with pytest.raises(EnvironmentProblem, match="in use by another run"):
        for_worker(folder, {})  # started by no launcher: takes it itself, refused while held
    assert for_worker(folder, {LOCK_ENV: PEER}) is None  # node rank > 0's worker: node rank 0's launcher holds it
    launcher.release()
    with pytest.raises(EnvironmentProblem, match="in use by another run"):
        hold(folder)  # the worker still holds it after its launcher let go (killed -9, say)
    held[1].release()
    held.append(hold(folder))


def test_a_command_leaves_no_lock_file_behind_and_a_failed_one_nothing(tmp_path):
    with pytest.raises(ValueError), hold(str(tmp_path / "new" / "deep")):
        raise ValueError("tune refused its candidates")
    assert not (tmp_path / "new").exists()  # the folders it made, gone with the lock file
    with hold(str(tmp_path / "written")):
        (tmp_path / "written" / "train.log").write_text("the run")
    assert os.listdir(tmp_path / "written") == ["train.log"]  # what else was written stays
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / LOCK_FILE).write_text("")
    with hold(str(tmp_path / "kept")):
        pass
    assert os.listdir(tmp_path / "kept") == [LOCK_FILE]  # a lock file it did not create (a killed run's) stays


def test_a_file_system_without_locks_runs_with_a_warning(tmp_path, monkeypatch):
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)  # what NFS without a lock daemon says
    lock = hold(str(tmp_path / "nfs"))
    assert lock.fds == () and lock.env == {}
    assert lock.warning == (f"warning: train.output_dir {tmp_path / 'nfs'}: this file system cannot lock files "
                            f"({os.strerror(errno.ENOLCK)}); a second run into this folder would not be refused")


def test_an_agent_of_node_rank_1_leaves_the_lock_to_node_rank_0(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SPEC)
    planned = plan_for_run("s.toml", ["distributed.nodes=2"])
    lock = claim(planned, launch_command(planned, node_rank=1, rdzv_endpoint="h:1"), environ={})
    assert lock.env == {LOCK_ENV: PEER} and lock.fds == ()
    assert not (tmp_path / "runs").exists()
    lock = claim(planned, launch_command(planned, node_rank=0, rdzv_endpoint="h:1"), environ={})
    assert lock.fds and (tmp_path / "runs" / "t" / LOCK_FILE).exists()
    lock.release()


def test_a_job_submitted_elsewhere_gets_the_folder_free(tmp_path, monkeypatch):
    """sbatch (and kubectl) start the job somewhere else, later: `run` lets its hold go before it submits, so the job's
    rank 0 can take it where it runs."""
    monkeypatch.chdir(tmp_path)
    slurm = SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"') + '[launch.slurm]\ntime = "00:05:00"\n'
    (tmp_path / "s.toml").write_text(slurm)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\necho 77\nexec {sys.executable} -c \"from launcher.targets.runlock import hold; "
                                 "hold('runs/t')\"\n")
    (fake / "sbatch").chmod(0o755)
    planned = plan_for_run("s.toml")
    command = launch_command(planned, environ={"PATH": str(fake)})
    lock = claim(planned, command)
    assert execute(command, environ={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, lock=lock) == 0


FAKE_TORCHRUN = """\
#!/bin/bash
sleep 0.3
echo "[fp8launch-rank0]:step 1/10"
sleep 0.3         # shown before the Ctrl-C (a line the launcher reads after it is not)
kill -INT $PPID   # Ctrl-C: the terminal's SIGINT reaches the launcher (and torchrun, and through it every worker)
sleep 0.3
echo "[fp8launch-rank1]:Traceback (most recent call last):" >&2
echo "[fp8launch-rank1]:RuntimeError: Connection closed by peer" >&2
echo "[fp8launch-rank0]:interrupted: Ctrl-C after step 1 of 10, without a checkpoint of it; no checkpoint was written" >&2
echo "torchrun's own SignalException traceback" >&2
exit 1
"""


@pytest.mark.parametrize("said", [True, False], ids=["a rank said where it stopped", "no rank did"])
def test_ctrl_c_shows_the_ranks_one_line_and_nothing_they_print_on_the_way_out(tmp_path, said):
    script = tmp_path / "torchrun.sh"
    script.write_text(FAKE_TORCHRUN if said else "\n".join(line for line in FAKE_TORCHRUN.splitlines() if "interrupted:" not in line))
    script.chmod(0o755)
    shown = []
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(RunInterrupted) as e:
        execute(Command(kind="torchrun", argv=(str(script),), logs=str(tmp_path / "logs")), out=shown.append, err=shown.append)
    line = ("interrupted: Ctrl-C after step 1 of 10, without a checkpoint of it; no checkpoint was written" if said
            else f"interrupted: Ctrl-C; torchrun and its workers stopped; full logs: {tmp_path / 'logs'}/")
    assert (e.value.exit_code, str(e.value)) == (130, line)
    assert shown == ["step 1/10\n"]
    assert "Connection closed by peer" in (tmp_path / "logs" / "torchrun.log").read_text()  # kept, in the log
    assert signal.getsignal(signal.SIGINT) is before


MIDDLE = """
import os, sys, subprocess, time
from launcher.targets.runlock import stop_with_this_process
leaf = subprocess.Popen([sys.executable, "-c", sys.argv[1]], preexec_fn=stop_with_this_process())
print(leaf.pid, flush=True)
time.sleep(60)
"""
LEAF = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda s, f: (open("{out}", "w").write("SIGTERM"), sys.exit(0)))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_child_gets_sigterm_when_its_launcher_is_killed_9(tmp_path):
    out = tmp_path / "leaf.out"
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE, LEAF.replace("{out}", str(out))], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        leaf = int(middle.stdout.readline())
        assert middle.stdout.readline() == "ready\n"  # the leaf's handler is in place (it shares the pipe)
        os.kill(middle.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out.read_text() == "SIGTERM"
    finally:
        os.killpg(middle.pid, signal.SIGKILL)
        middle.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{leaf}").exists() and "Z" not in Path(f"/proc/{leaf}/stat").read_text().split(")")[-1].split()[0]:
        assert time.monotonic() < deadline, "the leaf outlived its parent"
        time.sleep(0.01)


def test_join_refuses_where_a_run_holds_it_exclusively(tmp_path, held):
    """The instant another run holds the lock exclusively (while it names itself): a joining worker is refused."""
    import fcntl

    folder = tmp_path / "out"
    folder.mkdir()
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(EnvironmentProblem, match=r"in use by another run: a process that has not named itself yet \(it is starting\)"):
            join(str(folder), "x:1:y")
    finally:
        os.close(fd)


def test_the_lock_module_stays_torch_free():
    code = "import sys, launcher.targets.runlock; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_lock_file_contents_name_the_command(tmp_path, held):
    held.append(hold(str(tmp_path)))
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["command"] == runlock._this_command() and holder["command"].split()[0] == os.path.basename(sys.argv[0])
    assert abs(time.mktime(time.strptime(holder["started"], "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(time.gmtime())) < 60
