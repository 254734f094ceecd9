"""Hostile cases for "a run owns its folder" (launcher/targets/runlock.py): a command into a folder another run holds,
and lock files that are not what fp8launch writes. Each is refused at once with one line (exit 3), writing nothing."""

from __future__ import annotations

import os
import re
import socket

import pytest

from launcher.targets.runlock import LOCK_FILE, hold
from tests.hostile.corpus import Case, check

SPEC = 'version = 1\nname = "t"\n[launch]\ndevice = "cpu"\n[train]\noutput_dir = "runs/t"\nsteps = 4\n'
OLD_PLAN = '{"the running run": "its plan"}\n'
HELD: list = []
IN_USE = (rf"is in use by another run: pid {os.getpid()} on host {re.escape(socket.gethostname())} \(.+, since \S+Z\); "
          "fix: wait for it to end or stop it")


def held(path: str):
    """A setup: this process holds `path` (relative to the case's folder) as a running run would."""
    return lambda folder: HELD.append(hold(str(folder / path)))


def victim(folder) -> None:
    os.symlink(folder / "victim.txt", folder / "runs" / "t" / LOCK_FILE)


CASES = [
    Case(id="dry-run-into-a-held-folder", argv=("run", "s.toml", "--dry-run"), code=3,
         line=rf"^error: train\.output_dir runs/t {IN_USE}, or set train\.output_dir to another folder$",
         files={"s.toml": SPEC, "runs/t/plan/plan.json": OLD_PLAN}, setup=held("runs/t"), absent=("runs/t/plan/torchrun.sh",)),
    Case(id="run-into-a-held-folder", argv=("run", "s.toml", "--set", "train.lr=0.05"), code=3,
         line=rf"^error: train\.output_dir runs/t {IN_USE}", files={"s.toml": SPEC}, setup=held("runs/t"),
         absent=("runs/t/plan", "runs/t/logs", "runs/t/metrics.jsonl")),
    Case(id="bench-into-a-held-out", argv=("bench", "s.toml", "--out", "b"), code=3,
         line=rf"^error: bench --out b {IN_USE}, or name another --out$", files={"s.toml": SPEC}, setup=held("b"),
         absent=("b/.fp8launch-bench", "b/spec-1", "b/bench.json")),
    Case(id="tune-into-a-held-out", argv=("tune", "s.toml", "--out", "t"), code=3,
         line=rf"^error: tune --out t {IN_USE}, or name another --out$", files={"s.toml": SPEC}, setup=held("t"),
         absent=("t/runs", "t/tune.json")),
    Case(id="lock-file-is-a-symlink", argv=("run", "s.toml", "--dry-run"), code=3,
         line=r"^error: train\.output_dir runs/t: \.fp8launch\.lock is a symbolic link, not the lock file fp8launch writes; "
              r"fix: remove runs/t/\.fp8launch\.lock$",
         files={"s.toml": SPEC, "victim.txt": "not fp8launch's\n", "runs/t/": ""}, setup=victim, absent=("runs/t/plan",)),
    Case(id="lock-file-is-a-folder", argv=("run", "s.toml", "--dry-run"), code=3,
         line=r"^error: train\.output_dir runs/t: \.fp8launch\.lock is a folder, not the lock file fp8launch writes; fix: remove ",
         files={"s.toml": SPEC, f"runs/t/{LOCK_FILE}/": ""}, absent=("runs/t/plan",)),
]


@pytest.fixture(autouse=True)
def _release():
    yield
    while HELD:
        HELD.pop().release()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case(case, tmp_path):
    check(case, tmp_path)
