"""The SLURM tests touch the system (apt-get install, /etc/munge/munge.key, daemons) only when asked."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def test_slurm_tests_skip_with_the_reason_unless_asked():
    env = {k: v for k, v in os.environ.items() if k != "FP8LAUNCH_TEST_SLURM"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_slurm.py"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FP8LAUNCH_TEST_SLURM is not 1" in r.stdout, r.stdout
    assert " passed" not in r.stdout and "skipped" in r.stdout


def test_ci_asks_for_the_slurm_tests_before_make_test():
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert lines.index("export FP8LAUNCH_TEST_SLURM=1") < lines.index("make test")
