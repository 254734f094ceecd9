"""The adversarial corpus: a command as a careless or hostile user would type it, and exactly what it must give.

Each `Case` names the files to lay out in a fresh folder, the `fp8launch` arguments, and what must come back: the
exit code, the one line on stderr (a regular expression it must match), what must still be on disk byte for byte,
and what must not exist. `check(case, tmp_path)` runs it and asserts all of that, plus: no traceback, no hang (the
command runs in its own process group under a timeout), nothing written outside the case's folder.

    CASES = [Case("name-trailing-newline", ("plan", "s.toml"), files={"s.toml": ...}, code=2, line=r"\\$\\.name: .*")]

    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
    def test_case(case, tmp_path):
        check(case, tmp_path)

In-process (Click's runner, milliseconds) unless the case needs a real process (`process=True`: a hang to time out,
a signal, a deleted working directory, a FIFO); the in-process runner reports an exception escaping Click as the
traceback a user would have seen.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner

from launcher.cli import main

Content = str | bytes


@dataclass(frozen=True, kw_only=True)
class Case:
    id: str
    argv: tuple[str, ...]
    """fp8launch's arguments (`plan`, `run`, ... first); `{dir}` is replaced by the case's folder."""
    code: int
    """The exact exit code."""
    line: str
    """A regular expression the error line (stderr's last non-blank line) must match (re.search)."""
    files: dict[str, Content] = field(default_factory=dict)
    """Laid out in the case's folder before the command; a value ending a key with '/' makes a folder."""
    kept: dict[str, Content] | None = None
    """Files that must hold exactly these bytes afterwards [default: every file in `files`]."""
    absent: tuple[str, ...] = ()
    """Paths (relative to the case's folder) that must not exist afterwards."""
    lines: int = 1
    """How many lines stderr may hold at most (a spec error reports every problem, one line each)."""
    process: bool = False
    """Run as a real process (`python -m launcher`) in its own process group, killed at `timeout`."""
    timeout: float = 20.0
    env: dict[str, str] = field(default_factory=dict)
    setup: object = None
    """A callable(folder: Path) for what files cannot say (a FIFO, a symlink, a read-only folder)."""
    cwd: str = ""
    """The working directory, relative to the case's folder [default: the folder]."""
    prefix: tuple[str, ...] = ()
    """With `process`: run the command under this one (e.g. unshare, to take root's override of file modes away)."""

    def __str__(self) -> str:
        return self.id


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    traceback: bool


def lay_out(folder: Path, files: dict[str, Content]) -> None:
    for name, content in files.items():
        path = folder / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def invoke(case: Case, folder: Path) -> Outcome:
    argv = [a.replace("{dir}", str(folder)) for a in case.argv]
    cwd = folder / case.cwd if case.cwd else folder
    if case.process:
        return _in_a_process(argv, cwd, case)
    runner = CliRunner()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = runner.invoke(main, argv, env=case.env or None, catch_exceptions=True)
    finally:
        os.chdir(old)
    escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
    code = 1 if escaped else result.exit_code
    return Outcome(code, result.stdout, result.stderr, escaped or "Traceback (most recent call last)" in result.stderr)


def _in_a_process(argv: list[str], cwd: Path, case: Case) -> Outcome:
    env = {**os.environ, **case.env}
    child = subprocess.Popen([*case.prefix, sys.executable, "-m", "launcher", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=case.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # its own group only: the command and anything it started
        out, err = child.communicate()
        raise AssertionError(f"{case.id}: hung: no exit within {case.timeout} s; stderr: {err[-2000:]}") from None
    return Outcome(child.returncode, out, err, "Traceback (most recent call last)" in err)


def snapshot(folder: Path) -> dict[str, bytes]:
    out = {}
    for root, dirs, names in os.walk(folder):
        for n in names:
            p = Path(root) / n
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(folder))] = p.read_bytes()
    return out


RECORD_ENV = "FP8LAUNCH_HOSTILE_RECORD"
"""A file each checked case appends one JSON line to (benchmarks/hostile_record.py counts them for docs/reliability.md)."""


def _record(case: Case, got: Outcome | None, seconds: float, folder: Path) -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    kept = case.files if case.kept is None else case.kept
    lost = [name for name, content in kept.items() if not name.endswith("/") and (
        not (folder / name).exists() or ((folder / name).is_file() and not (folder / name).is_symlink()
                                         and (folder / name).read_bytes() != (content.encode() if isinstance(content, str) else content)))]
    lines = [line for line in got.stderr.splitlines() if line.strip()] if got else []
    row = {"id": case.id, "command": case.argv[0] if case.argv else "", "code": got.code if got else None, "expected": case.code,
           "hang": got is None, "traceback": bool(got and got.traceback), "lines": len(lines), "lost": lost,
           "left": [name for name in case.absent if os.path.lexists(folder / name)], "seconds": round(seconds, 3)}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def check(case: Case, tmp_path: Path) -> Outcome:
    """Run `case` in tmp_path/case and assert everything it promises; return what it gave."""
    folder = tmp_path / "case"
    folder.mkdir()
    lay_out(folder, case.files)
    if case.setup is not None:
        case.setup(folder)
    t0 = time.monotonic()
    try:
        got = invoke(case, folder)
    except AssertionError:
        _record(case, None, time.monotonic() - t0, folder)
        raise
    _record(case, got, time.monotonic() - t0, folder)
    where = f"{case.id}: exit {got.code}\nstderr:\n{got.stderr}\nstdout:\n{got.stdout[-2000:]}"
    assert not got.traceback, where
    assert got.code == case.code, where
    lines = [line for line in got.stderr.splitlines() if line.strip()]
    assert lines, where
    assert len(lines) <= case.lines, where
    assert re.search(case.line, lines[-1]), f"{where}\nexpected a line matching: {case.line}"
    kept = case.files if case.kept is None else case.kept
    for name, content in kept.items():
        if name.endswith("/"):
            assert (folder / name).is_dir(), f"{case.id}: {name} is gone"
            continue
        path = folder / name
        assert path.exists(), f"{case.id}: {name} is gone"
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert data == (content.encode() if isinstance(content, str) else content), f"{case.id}: {name} changed"
    for name in case.absent:
        assert not os.path.lexists(folder / name), f"{case.id}: {name} exists"
    return got
