"""Shared fixtures: run the CLI in-process, write specs, locate the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import main

REPO = Path(__file__).resolve().parent.parent

# DeepSpeed JIT-builds its CPU ops (CPU Adam, async_io; runs skip its shared-memory op) into TORCH_EXTENSIONS_DIR, once per
# Python environment: the in-process tests and every process a test starts share one folder, so each op is built
# once per CI run (~30 s each on 2 cores), not once per kind of test (tests/e2e/helpers.env keeps it for runs).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser(
    f"~/.cache/torch_extensions/fp8launch-{__import__('hashlib').sha256(sys.prefix.encode()).hexdigest()[:8]}"))
# ...and one ninja builds them: this Python's bin folder first on PATH, as `fp8launch run` puts it for the processes it
# starts (launcher/commands/run.py). Otherwise the in-process tests found the system's ninja (1.11 here) and the runs
# the environment's (1.13): the two hash a build command differently, so each took the other's build for stale and
# rebuilt it (benchmarks/results/tooling_notes.md).
# Each of pytest-xdist's N workers computes with cores / N threads (OpenMP, torch's intra-op pool): by default every
# worker takes all the cores, and N workers x all cores threads on 2 cores spin-wait for each other (OpenMP's busy
# wait), several times slower than alone (benchmarks/results/tooling_notes.md). The runs a test starts take 1 thread a process already
# (tests/e2e/helpers.env, the CPU specs' launch.env).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
_BIN = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", os.defpath)
CASES = Path(__file__).resolve().parent / "cases"


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def pytest_collection_modifyitems(items):
    """Tests marked `compiles` first, then those marked `heavy`, the rest in their order (a stable sort). pytest-xdist's
    loadgroup hands out its groups first (the largest first), then one test at a time in this order: a graph build
    (40-130 s from a cold cache) or a long in-process run dispatched last runs while the other worker has nothing left
    to do (CI from a cold AVX2 host: tests/train/test_te_features.py's two FP8-weight runs, 116 and 136 s there, ended
    the slow phase with the other worker idle 176 s)."""
    items.sort(key=lambda item: (item.get_closest_marker("compiles") is None, item.get_closest_marker("heavy") is None))


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """Run `fp8launch ARGS` in-process with tmp_path as the working directory."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> CliResult:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        return CliResult(result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture
def spec(tmp_path):
    """Write a TOML (or JSON, by suffix) spec into tmp_path and return its path as a string."""

    def write(text: str, name: str = "spec.toml") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
        return str(path)

    return write


@pytest.fixture
def msamp_stack(monkeypatch):
    """MS-AMP's own stack installed (launcher/planning/stack.py `msamp_runs`): a backend = "msamp" spec plans for the
    MS-AMP package, as it does in MS-AMP's own environment, instead of as its opt level's native keys."""
    from launcher.planning import stack

    monkeypatch.setattr(stack, "msamp_runs", lambda strategy: True)


@pytest.fixture
def isolated_imports(monkeypatch):
    """Undo sys.path and sys.modules changes made by importing user factories."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


def run_module(*args: str, cwd: str | os.PathLike, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m launcher ARGS` in a real subprocess (for exit codes and tracebacks as users see them)."""
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


MINIMAL = """
version = 1
name = "t"
[launch]
device = "cpu"
"""


@pytest.fixture(autouse=True)
def _restore_functional_linear():
    """deepspeed.zero.Init replaces torch.nn.functional.linear with its ZeRO-3 wrapper for the rest of the process
    (in a run: the run's own process, where it belongs). In-process tests share one: give the next test torch's own."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.nn.functional.linear is not torch._C._nn.linear:
        torch.nn.functional.linear = torch._C._nn.linear


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With FP8LAUNCH_TEST_TIMELINE=PATH, each test's start and end (wall clock, setup to teardown) and its xdist worker
    are appended to PATH, one JSON line a test: benchmarks/ci_timeline.py shows from them where a phase's two workers
    waited (the idle tail after the last group) and which tests hold the critical path."""
    path = os.environ.get("FP8LAUNCH_TEST_TIMELINE")
    start = time.time()
    yield
    if path:
        line = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "start": round(start, 2),
                "end": round(time.time(), 2)}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
