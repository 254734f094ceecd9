"""The test phases' timeline: tests/conftest.py's hook writes each test's start, end and worker; benchmarks/ci_timeline.py
and ci_time_record.py turn them into each worker's busy time and idle tail."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import conftest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import ci_time_record  # noqa: E402
import ci_timeline  # noqa: E402

LINES = [{"test": "tests/a.py::t1", "worker": "gw0", "start": 100.0, "end": 160.0},
         {"test": "tests/a.py::t2", "worker": "gw0", "start": 160.0, "end": 170.0},
         {"test": "tests/b.py::t3", "worker": "gw1", "start": 100.5, "end": 200.0}]


def test_the_hook_appends_one_line_a_test_with_its_worker(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    monkeypatch.setenv("FP8LAUNCH_TEST_TIMELINE", str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    for nodeid in ("tests/x.py::a", "tests/x.py::b"):
        hook = conftest.pytest_runtest_protocol(types.SimpleNamespace(nodeid=nodeid), None)
        next(hook)
        try:
            next(hook)
        except StopIteration:
            pass
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["test"], x["worker"]) for x in lines] == [("tests/x.py::a", "gw7"), ("tests/x.py::b", "gw7")]
    assert all(0 <= x["end"] - x["start"] < 5 for x in lines)


def test_each_worker_is_summed_with_its_idle_tail():
    s = ci_timeline.summary(LINES)
    assert s["wall_s"] == 100.0
    assert s["workers"] == {"gw0": {"busy_s": 70.0, "tests": 2, "idle_at_end_s": 30.0},
                            "gw1": {"busy_s": 99.5, "tests": 1, "idle_at_end_s": 0.0}}
    assert s["by_file_s"] == {"tests/b.py": 99.5, "tests/a.py": 70.0}
    assert [t["test"] for t in s["tests"]] == ["tests/b.py::t3", "tests/a.py::t1", "tests/a.py::t2"]


def test_the_ci_record_carries_each_phases_workers(tmp_path):
    timeline = tmp_path / "timeline"
    timeline.mkdir()
    (timeline / "slow.jsonl").write_text("".join(json.dumps(x) + "\n" for x in LINES))
    log = tmp_path / "ci.log"
    log.write_text("ci-phase: setup 10.0 s exit 0\nci-phase: slow 100.0 s exit 0\n")
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ci_time_record.py"), str(tmp_path / "none.jsonl"), str(log),
                           "110", "0", "abc1234", str(out), str(timeline)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "ci_time.json").read_text())
    assert record["workers"]["slow"]["workers"]["gw0"]["idle_at_end_s"] == 30.0
    assert "gw0 busy 1.2 min (2 tests), idle at the end 30 s" in (out / "ci_time.md").read_text()
    assert ci_time_record.workers(str(tmp_path / "missing")) == {}


def test_the_ci_record_reads_the_machines_speed_from_the_clones_python(tmp_path):
    """The 8th argument is the clone's Python: its `import torch` CPU seconds, the median of 5 new processes. Here a stand-in
    Python that burns 0.2 CPU-s whatever it is asked, so the median must be at least that and not the wall time of a sleep."""
    fake = tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\nimport time\nt = time.process_time()\nwhile time.process_time() - t < 0.2:\n    pass\n"
                    "time.sleep(0.3)\n")
    fake.chmod(0o755)
    log = tmp_path / "ci.log"
    log.write_text("ci-phase: setup 10.0 s exit 0\n")
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ci_time_record.py"), str(tmp_path / "none.jsonl"), str(log),
                           "10", "0", "abc1234", str(out), str(tmp_path / "none"), str(fake)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    machine = json.loads((out / "ci_time.json").read_text())["machine"]
    assert 0.2 <= machine["import_torch_cpu_s"] < 0.45, machine
    assert f"`import torch` takes {machine['import_torch_cpu_s']} CPU-s here" in (out / "ci_time.md").read_text()
