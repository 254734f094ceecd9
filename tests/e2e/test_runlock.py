"""A run owns its folder, end to end: real `fp8launch run` processes (torchrun, gloo, 2 ranks on this CPU), one run
after the other in one test (each phase needs the state the one before left):

1. Run A trains. Run B into the same folder (`--set train.lr=0.05`) exits 3 at once with the one line naming A's pid
   and host, and changes nothing of A's: plan/ and the lock file byte for byte (and untouched), torchrun.log not
   truncated, metrics.jsonl holding only A's records with A's learning rate.
2. kill -9 of A's launcher alone: torchrun (its parent-death signal) stops the workers with SIGTERM, they finish the
   step, write a complete checkpoint of it and exit; every process of A is gone within torchrun's 30 s grace (torchrun
   itself a few seconds after its workers: it first reports the broken pipe to the dead launcher).
3. Run C, the same command: takes the lock A left over, resumes from that checkpoint. The plan's torchrun.sh started by
   hand (as sbatch or Kubernetes start a job: no launcher holds the folder for it) into C's folder: its rank 0 finds
   the folder held and every rank stops with exit 3 before writing anything. Ctrl-C to C (SIGINT to its process
   group, as a terminal sends it): exit 130, no traceback, stderr ends with the one line naming the step reached and
   that checkpoint; the folder is free again.

~30-50 s on the 2-core development machine, by its load (three jobs' start-up, most of it importing torch in every process; the
hand-started torchrun.sh ~18 s of it, its workers importing torch beside C's training).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from launcher.targets.runlock import LOCK_FILE, hold
from launcher.train.checkpoint import read_marker

from .helpers import FP8LAUNCH, children, env, output_of, run, write_spec

pytestmark = pytest.mark.slow

STEPS = 10000
"""Never reached: each run is stopped (kill -9, Ctrl-C) while it trains."""
LR = 3e-3
STOP_BOUND_S = 30
"""torchrun's grace between its SIGTERM and a SIGKILL (TORCH_ELASTIC_SHUTDOWN_TIMEOUT): a step and a checkpoint within it."""


def start(cwd: Path, *args: str) -> subprocess.Popen:
    """`fp8launch ARGS` in a process group of its own (the launcher and torchrun; the workers get sessions of their own)."""
    return subprocess.Popen([FP8LAUNCH, *args], cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def records(out: Path) -> list[dict]:
    text = (out / "metrics.jsonl").read_text() if (out / "metrics.jsonl").exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]  # rank 0 may be writing the last line


def wait_for(proc: subprocess.Popen, out: Path, *, starts: int, step: int, timeout: float = 300) -> int:
    """Wait until the `starts`-th run in metrics.jsonl logged a step >= `step`; returns the newest step logged."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended: exit {proc.returncode}\n{proc.stderr.read()[-3000:]}"
        recs = records(out)
        begun = [i for i, r in enumerate(recs) if r["event"] == "start"]
        if len(begun) >= starts:
            stepped = [r["step"] for r in recs[begun[starts - 1]:] if r["event"] == "step"]
            if stepped and stepped[-1] >= step:
                return stepped[-1]
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout} s")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has stopped; whoever adopted it reaps it


def tree(pid: int) -> list[int]:
    """The launcher's torchrun and its workers (found while they run)."""
    agents = children(pid)
    return agents + [w for a in agents for w in children(a)]


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def snapshot(out: Path) -> dict:
    """What a second run into `out` could change of the first's: plan/ and the lock file (bytes, inode, mtime), the
    start of torchrun.log (which the launcher opens with "w")."""
    files = {}
    for path in [*sorted((out / "plan").iterdir()), out / LOCK_FILE]:
        st = path.stat()
        files[path.name] = (path.read_bytes(), st.st_ino, st.st_mtime_ns)
    log = out / "logs" / "torchrun.log"
    return {"files": files, "log": (log.stat().st_ino, log.read_bytes()[:200])}


def test_a_run_owns_its_folder_and_stops_with_its_launcher(tmp_path):
    spec = write_spec(tmp_path, "owned", train__model="builtin:llama-debug?layers=1", train__steps=STEPS, train__lr=LR,
                      train__checkpoint_every=0, distributed__strategy="ddp")
    out = tmp_path / "runs" / "owned"
    a = start(tmp_path, "run", str(spec))
    pids = []
    try:
        # -- 1. a second run into A's folder ---------------------------------------------------------------------
        wait_for(a, out, starts=1, step=1)
        holder = json.loads((out / LOCK_FILE).read_text())
        assert (holder["pid"], holder["host"], holder["command"]) == (a.pid, socket.gethostname(), f"fp8launch run {spec}")
        before = snapshot(out)
        b, refuse_s = run(tmp_path, "run", str(spec), "--set", "train.lr=0.05")
        assert b.returncode == 3, output_of(b)
        assert b.stderr == (f"error: train.output_dir runs/owned is in use by another run: pid {a.pid} on host {socket.gethostname()} "
                            f"(fp8launch run {spec}, since {holder['started']}); fix: wait for it to end or stop it, or set "
                            "train.output_dir to another folder\n")
        after = snapshot(out)
        assert after["files"] == before["files"]
        assert after["log"] == before["log"]

        # -- 2. kill -9 of A's launcher ----------------------------------------------------------------------------
        wait_for(a, out, starts=1, step=3)
        pids = tree(a.pid)
        assert len(pids) == 3, pids  # torchrun (torchrun.sh exec'd it), then its 2 workers
        os.kill(a.pid, signal.SIGKILL)
        t0 = time.monotonic()
        a.wait()
        gone = {}
        while len(gone) < len(pids):
            assert time.monotonic() - t0 < STOP_BOUND_S, f"still running {STOP_BOUND_S} s after the launcher's kill -9: {pids}"
            gone.update({p: time.monotonic() - t0 for p in pids if p not in gone and not alive(p)})
            time.sleep(0.02)
        workers_s, torchrun_s = max(gone[p] for p in pids[1:]), gone[pids[0]]
        recs = records(out)
        assert [r["event"] for r in recs].count("start") == 1  # B started nothing
        steps = [r for r in recs if r["event"] == "step"]
        stopped = steps[-1]["step"]
        assert [r["step"] for r in steps] == list(range(1, stopped + 1))
        assert json.loads((out / "plan" / "plan.json").read_text())["train"]["lr"] == LR
        assert all(0 < r["lr"] <= LR for r in steps)  # A's schedule, never B's 0.05
        checkpoint = out / "checkpoints" / f"step-{stopped}"
        marker = read_marker(str(checkpoint))
        assert marker is not None and (marker["step"], marker["world_size"]) == (stopped, 2)
        assert sorted(os.listdir(out / "checkpoints")) == [f"step-{stopped}"]  # nothing half-written beside it
        (rank0,) = glob.glob(str(out / "logs" / "*" / "attempt_0" / "0" / "stderr.log"))
        assert f"preempted: SIGTERM after step {stopped} of {STEPS}; every rank stopped after it and checkpoint {checkpoint} is complete" \
            in Path(rank0).read_text()

        # -- 3. the same command takes the folder over, resumes, and a Ctrl-C stops it -------------------------
        c = start(tmp_path, "run", str(spec))
        try:
            wait_for(c, out, starts=2, step=stopped + 1)
            assert json.loads((out / LOCK_FILE).read_text())["pid"] == c.pid
            # the job's own script, as sbatch or a user starts it, with no launcher: its rank 0 finds C's hold, every rank stops
            t0 = time.monotonic()
            d = subprocess.run(["bash", str(out / "plan" / "torchrun.sh")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                               env={**env(), "PATH": f"{Path(FP8LAUNCH).parent}:{os.environ['PATH']}"})
            direct_s = time.monotonic() - t0
            assert d.returncode == 1, f"exit {d.returncode}\n{d.stderr[-3000:]}"  # torchrun's own code for failed workers
            assert d.stderr.count(f"error: train.output_dir runs/owned is in use by another run: pid {c.pid} on host ") == 1
            assert d.stderr.count("exitcode  : 3 ") == 2  # torchrun's failure table: each rank stopped itself with 3
            assert [r["event"] for r in records(out)].count("start") == 2  # and wrote nothing
            logged = wait_for(c, out, starts=2, step=stopped + 2)
            pids = tree(c.pid)
            os.killpg(c.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
            t0 = time.monotonic()
            stdout, stderr = c.communicate(timeout=120)
            ctrl_c_s = time.monotonic() - t0
        finally:
            if c.poll() is None:
                kill_all([c.pid, *tree(c.pid)])
                c.wait()
        assert c.returncode == 130, f"exit {c.returncode}\n{stderr[-4000:]}"
        second = [r for r in records(out) if r["event"] == "start"][1]
        assert (second["start_step"], second["resumed_from"]) == (stopped, str(checkpoint))
        assert f"resumed from runs/owned/checkpoints/step-{stopped} at step {stopped}\n" in stdout
        assert "Traceback" not in stderr
        last = stderr.strip().splitlines()[-1]
        said = re.fullmatch(rf"interrupted: Ctrl-C after step (\d+) of {STEPS}, without a checkpoint of it; the newest complete "
                            rf"checkpoint is {re.escape(str(checkpoint))}; run the same command again to continue from it "
                            r'\(train\.resume = "auto"\)', last)
        assert said, stderr[-3000:]
        assert logged <= int(said.group(1)) <= [r for r in records(out) if r["event"] == "step"][-1]["step"] + 1
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids):
            assert time.monotonic() < deadline, f"still running 10 s after Ctrl-C: {pids}"
            time.sleep(0.02)
        with hold(str(out)):  # free again
            pass
    finally:
        kill_all([a.pid, *pids])
        a.wait()
    print(f"second run refused (exit 3) in {refuse_s:.2f} s; kill -9 of the launcher at step {stopped}: both workers gone "
          f"{workers_s:.1f} s later, torchrun {torchrun_s:.1f} s; checkpoint step-{stopped} complete and resumed; torchrun.sh by hand "
          f"into the held folder: every rank exit 3, {direct_s:.1f} s; Ctrl-C: exit 130 {ctrl_c_s:.1f} s after it")
