"""benchmarks/ci_cpu.sh's accounting: each Python process records its CPU seconds and the test that started it, through
os._exit too; the compiler wrapper times each call and keeps the compiler's exit code and output; the report adds them
up by kind and by test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import ci_cpu_report  # noqa: E402

ACCOUNTING = REPO / "benchmarks" / "ci_cpu"


def _env(records, test: str) -> dict:
    return {**os.environ, "CI_CPU_DIR": str(records), "PYTHONPATH": str(ACCOUNTING), "PYTEST_CURRENT_TEST": f"{test} (call)",
            "PATH": f"{ACCOUNTING / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def test_a_process_records_its_cpu_seconds_and_test_even_through_os_exit(tmp_path):
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
    for code in (spin, spin + "import os\nos._exit(7)\n"):
        r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, "tests/x.py::spins"), timeout=60)
        assert r.returncode == (7 if "_exit" in code else 0)
    records = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert len(records) == 2
    for record in records:
        assert record["test"] == "tests/x.py::spins" and record["argv"] == ["-c"]
        assert 0.2 <= record["cpu_s"] < 5  # the 0.2 s it spun, and its start


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_the_compiler_wrapper_times_each_call_and_keeps_its_exit_code_and_output(tmp_path):
    (tmp_path / "a.cpp").write_text("int main() { return 3; }\n")
    env = _env(tmp_path, "tests/x.py::compiles")
    ok = subprocess.run(["g++", "a.cpp", "-o", "a"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    bad = subprocess.run(["c++", "missing.cpp"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and subprocess.run([str(tmp_path / "a")]).returncode == 3
    assert bad.returncode != 0 and "missing.cpp" in bad.stderr
    lines = (tmp_path / "native.log").read_text().splitlines()
    assert len(lines) == 2 and all(line.endswith("\ttests/x.py::compiles") for line in lines)
    assert all(len(line.split("\t")[0].split()) == 2 for line in lines)  # user and system seconds


def test_the_report_adds_the_seconds_up_by_kind_and_by_test(tmp_path):
    procs = [(["/v/bin/fp8launch-train", "--plan", "p.json"], "t.py::a", 8.0), (["/v/bin/fp8launch-train"], "t.py::a", 7.0),
             (["/v/bin/torchrun", "--nnodes", "1"], "t.py::a", 2.0), (["/v/bin/fp8launch", "run"], "t.py::a", 0.5),
             (["-c"], "", 40.0), (["/v/bin/torchrun"], "t.py::b", 1.5)]
    for i, (argv, test, cpu) in enumerate(procs):
        (tmp_path / f"{i}.json").write_text(json.dumps({"argv": argv, "cpu_s": cpu, "wall_s": 1.0, "test": test}))
    (tmp_path / "native.log").write_text("1.0 0.5\tt.py::b\n2.0 0.0\tt.py::b\n")
    s = ci_cpu_report.summary(ci_cpu_report.load(tmp_path))
    assert s["cpu_s"] == 62.5
    assert s["kinds"]["rank"] == {"cpu_s": 15.0, "processes": 2} and s["kinds"]["native"] == {"cpu_s": 3.5, "processes": 2}
    assert s["kinds"]["agent"]["cpu_s"] == 3.5 and s["kinds"]["cli"]["cpu_s"] == 0.5 and s["kinds"]["pytest"]["cpu_s"] == 40.0
    tests = {t["test"]: t for t in s["tests"]}
    assert tests["t.py::a"] == {"test": "t.py::a", "cpu_s": 17.5, "launches": 1, "rank": 15.0, "agent": 2.0, "cli": 0.5}
    assert tests["t.py::b"]["cpu_s"] == 5.0 and tests["t.py::b"]["launches"] == 1
    assert [t["test"] for t in s["tests"]][0].startswith("(no test")  # the workers' own 40 s first
    assert "| 17.5 | 1 | 15.0 | 2.0 | 0.0 | `t.py::a` |" in ci_cpu_report.table(s, 10)
