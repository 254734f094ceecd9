"""The command line itself, as a careless user types it: every mistake around a command is one line and its code."""

from __future__ import annotations

import errno
import os

import pytest
from click.testing import CliRunner

from launcher.cli import main
from tests.hostile.corpus import Case, check

SPEC = 'version = 1\nname = "tiny"\n[launch]\ndevice = "cpu"\n'
HELP = r"; fix: see `fp8launch( \w+)? --help`$"

CASES = [
    Case(id="unknown-command", argv=("plna", "s.toml"), code=2, line=r"^error: No such command 'plna'\. Did you mean 'plan'\?" + HELP),
    Case(id="unknown-option", argv=("plan", "s.toml", "--chek"), code=2,
         line=r"^error: No such option '--chek'\. \(Did you mean one of: '--check', '--force', '--help'\?\)" + HELP),
    Case(id="missing-argument", argv=("plan",), code=2, line=r"^error: Missing argument 'SPECS\.\.\.'" + HELP),
    Case(id="bad-choice", argv=("schema", "--format", "yaml"), code=2, line=r"^error: Invalid value for '--format'.*" + HELP),
    Case(id="nodes-zero", argv=("plan", "s.toml", "--nodes", "0"), code=2, line=r"^error: Invalid value for '--nodes'.*" + HELP),
    Case(id="option-without-value", argv=("run", "s.toml", "--set"), code=2, line=r"^error: Option '--set' requires an argument" + HELP),
    *[Case(id=f"params-{v}", argv=("plan", "s.toml", "--params", v), code=2,
           line=r"^error: Invalid value for '--params': .* is not (a number|a parameter count from 1 to 1e15).*" + HELP)
      for v in ("nan", "inf", "-inf", "1e400", "0", "-5", "lots")],
]
for c in CASES:
    c.files.setdefault("s.toml", SPEC)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_case(case, tmp_path):
    check(case, tmp_path)
    assert not (tmp_path / "case" / "generated").exists()  # refused before anything was written


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=True)


def test_a_deleted_working_directory_is_named_before_anything_runs(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    (tmp_path / "s.toml").write_text(SPEC)
    old = os.getcwd()
    os.chdir(gone)
    gone.rmdir()
    try:
        r = _invoke("plan", str(tmp_path / "s.toml"))
    finally:
        os.chdir(old)
    assert r.exit_code == 2 and not isinstance(r.exception, FileNotFoundError)
    assert r.stderr == ("error: the current folder no longer exists (removed while this shell was in it); "
                        "fix: cd to an existing folder and run the command again\n")


def test_ctrl_c_in_a_command_exits_130_with_one_line(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("launcher.commands.plan.plan_many", interrupted)
    monkeypatch.chdir(tmp_path)
    r = _invoke("plan", "s.toml")
    assert (r.exit_code, r.stderr.split()) == (130, ["interrupted"])  # after the blank line that ends the terminal's ^C


def test_an_os_error_no_caller_named_is_its_path_and_reason_and_exit_3(tmp_path, monkeypatch):
    full = tmp_path / "full" / "plan.json"

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(full))

    monkeypatch.setattr("launcher.commands.plan.plan_many", disk_full)
    monkeypatch.chdir(tmp_path)
    r = _invoke("plan", "s.toml")
    free = __import__("shutil").disk_usage(tmp_path).free
    assert r.exit_code == 3 and r.stderr.count("\n") == 1
    # the nearest existing folder's free bytes: tmp_path's (full/ does not exist); free space moves, so its digits are not compared
    assert r.stderr.startswith(f"error: {full}: No space left on device (") and f" bytes free on {tmp_path}); " in r.stderr
    assert r.stderr.rstrip().endswith("; fix: free space there, or write elsewhere") and free > 0
