"""benchmarks/te_install.sh (the `te` stage of benchmarks/gpu_session.sh) on a fake parts folder and a fake toolchain
(tests/train/_te_fakes.py), one refusal at a time: the headers the binding includes are checked first, then nvcc,
then what arrived; a part that does not match is refused with nothing half-checked left to install. The calls in
sequence, the build outliving its call: tests/train/test_te_session.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ._te_fakes import CORE, REPO, Machine, parts_folder

SCRIPT = REPO / "benchmarks" / "te_install.sh"


def run(parts: Path, state: Path, machine: Machine, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "next", str(parts), str(state)], capture_output=True, text=True,
                          env=machine.env(**env), timeout=60)


def test_the_headers_are_checked_first_and_a_machine_without_them_is_told_which(tmp_path):
    parts_folder(tmp_path / "te")
    machine = Machine(tmp_path / "m", headers=False)
    r = run(tmp_path / "te", tmp_path / "state", machine)
    assert r.returncode == 3, r.stderr
    assert "missing headers: nccl.h cudnn.h cublasLt.h cuda_runtime.h" in r.stderr and "nvidia-nccl-cu13" in r.stderr
    assert not (tmp_path / "te" / CORE).exists() and not (tmp_path / "state" / "headers.txt").exists()  # nothing else done
    # the toolkit's own include folder counts too (CUDA_HOME/include)
    for header in ("nccl.h", "cudnn.h", "cublasLt.h"):
        (machine.cuda / "include" / header).write_text("")
    r = run(tmp_path / "te", tmp_path / "state", machine)
    assert r.returncode == 3 and "missing headers: cuda_runtime.h " in r.stderr


def test_a_machine_without_nvcc_is_told_what_is_missing(tmp_path):
    parts_folder(tmp_path / "te")
    r = run(tmp_path / "te", tmp_path / "state", Machine(tmp_path / "m", nvcc=False))
    assert r.returncode == 3, r.stderr
    assert "no nvcc: `which nvcc` finds none, CUDA_HOME is " in r.stderr and "asks nvcc for the CUDA version" in r.stderr
    assert not (tmp_path / "te" / CORE).exists()


def test_a_part_that_does_not_match_is_refused(tmp_path):
    """Without parts.sha256 (`prepare` not run) a bad part shows when the parts are reassembled."""
    payload = parts_folder(tmp_path / "te")
    machine = Machine(tmp_path / "m")
    parts = tmp_path / "te"
    (parts / "part-01").write_bytes(b"x" * 1000)  # another download's part
    r = run(parts, tmp_path / "state", machine)
    assert r.returncode == 4 and "checksum mismatch" in r.stderr and "carry the parts again" in r.stderr
    assert not (parts / CORE).exists() and not machine.calls.exists()  # nothing half-checked is left to install
    (parts / "part-03").unlink()
    (parts / "part-01").write_bytes(payload[1000:2000])
    assert run(parts, tmp_path / "state", machine).returncode == 4  # a missing part too


def test_with_parts_sha256_each_part_is_checked_as_it_arrives(tmp_path):
    parts = tmp_path / "te"
    parts_folder(parts)
    assert subprocess.run(["bash", str(SCRIPT), "prepare", str(parts)], capture_output=True, text=True, cwd=REPO).returncode == 0
    machine = Machine(tmp_path / "m")
    (parts / "part-02").unlink()
    (parts / "part-03").unlink()
    r = run(parts, tmp_path / "state", machine)
    assert r.returncode == 75 and f'2 of 4 parts here; next call: carry ["{parts}/part-02"] (then part-03)' in r.stderr
    (parts / "part-02").write_bytes(b"truncated")
    r = run(parts, tmp_path / "state", machine)
    assert r.returncode == 4 and "part-02: not the part parts.sha256 names" in r.stderr and "carry it again" in r.stderr


def test_a_folder_without_the_sdist_says_what_to_carry(tmp_path):
    parts_folder(tmp_path / "te")
    (tmp_path / "te" / "deps" / "transformer_engine_torch-2.20.2.tar.gz").unlink()
    r = run(tmp_path / "te", tmp_path / "state", Machine(tmp_path / "m"))
    assert r.returncode == 2 and "transformer_engine_torch-*.tar.gz" in r.stderr and "te_install.sh prepare" in r.stderr


def test_prepare_lists_the_calls_the_smallest_part_riding_with_the_first(tmp_path):
    parts = tmp_path / "te"
    parts_folder(parts, os.urandom(2500))  # part-00, part-01 of 1000 bytes, part-02 of 500
    r = subprocess.run(["bash", str(SCRIPT), "prepare", str(parts)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    lines = [line.strip() for line in r.stdout.splitlines()]
    assert lines[1].startswith(f'1. carry [".whl", "{parts}/deps", "{parts}/te-core.sha256", "{parts}/parts.sha256", '
                               f'"{parts}/part-02"]')
    assert lines[2].startswith(f'2. carry ["{parts}/part-00"]') and lines[3].startswith(f'3. carry ["{parts}/part-01"]')
    sums = (parts / "parts.sha256").read_text().split()
    assert sums[1::2] == ["part-00", "part-01", "part-02"]


@pytest.mark.parametrize("script", ["benchmarks/te_install.sh", "benchmarks/gpu_session.sh", "benchmarks/gpu_bench.sh"])
def test_the_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(REPO / script)]).returncode == 0

