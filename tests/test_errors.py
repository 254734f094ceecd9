"""One place adds the "error:" prefix: LauncherError.__str__. Raisers pass the message only."""

from __future__ import annotations

import re

from conftest import REPO, run_module
from launcher.errors import EnvironmentProblem, LauncherError, SpecError, UsageError, Problem
from launcher.train.preempt import Preempted


def test_the_class_adds_the_prefix_once():
    assert str(UsageError("--x is bad")) == "error: --x is bad"
    assert str(EnvironmentProblem("no GPU", rule="FP8-HARDWARE")) == "error[FP8-HARDWARE]: no GPU"
    assert str(LauncherError("boom", exit_code=4)) == "error: boom" and LauncherError("boom", exit_code=4).exit_code == 4
    assert str(SpecError([Problem("s.toml", "bad", path="$.x", line=3)])) == "s.toml:3: error: $.x: bad"
    assert str(Preempted("preempted: SIGTERM after step 3")) == "preempted: SIGTERM after step 3"


def test_no_raiser_spells_the_prefix_itself():
    raising = re.compile(r"""(?:Error|Problem|Interrupted|Diverged|Failed|Preempted)\(\s*f?["']error""")
    offenders = [f"{path.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}"
                 for path in sorted((REPO / "launcher").rglob("*.py")) if path.name != "errors.py"
                 for text in [path.read_text()] for m in raising.finditer(text)]
    assert offenders == []


def test_cli_errors_read_error_once(tmp_path):
    (tmp_path / "s.toml").write_text('version = 1\nname = "s"\n[launch]\ndevice = "cpu"\n')
    r = run_module("run", "s.toml", "--rdzv-endpoint", "nohost", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == "error: --rdzv-endpoint 'nohost' is not HOST:PORT (e.g. node0:29500)"
    r = run_module("explain", "NOPE", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: no rule 'NOPE'") and r.stderr.count("error") == 1
