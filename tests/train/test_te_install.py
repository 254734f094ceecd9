"""benchmarks/te_install.sh (the `te` stage of benchmarks/gpu_session.sh) on a fake parts folder, up to where a GPU
machine is needed: the core wheel reassembled from its parts and checked, a part that does not match refused, the
missing nvcc said with what to do, and (with a stand-in nvcc and pip) the install and the background build of the
binding with NVTE_PYTORCH_FORCE_BUILD=TRUE."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "te_install.sh"
CORE = "transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl"


def parts_folder(tmp_path: Path, payload: bytes = b"", part_size: int = 1000) -> tuple[Path, bytes]:
    """What `gpu-wheelhouse te` writes: part-00.. of the core wheel (split -d), te-core.sha256, deps/."""
    payload = payload or os.urandom(3500)
    folder = tmp_path / "te"
    (folder / "deps").mkdir(parents=True)
    for i in range(0, len(payload), part_size):
        (folder / f"part-{i // part_size:02d}").write_bytes(payload[i:i + part_size])
    (folder / "te-core.sha256").write_text(f"{hashlib.sha256(payload).hexdigest()}  {CORE}\n")
    (folder / "deps" / "transformer_engine-2.20.2-py3-none-any.whl").write_bytes(b"te")
    (folder / "deps" / "transformer_engine_torch-2.20.2.tar.gz").write_bytes(b"sdist")
    return folder, payload


def run(parts: Path, logs: Path, path: str = "/usr/bin:/bin", **env) -> subprocess.CompletedProcess:
    base = {"PATH": path, "HOME": str(logs), "CUDA_ROOTS": str(logs / "no-cuda")}
    return subprocess.run(["bash", str(SCRIPT), str(parts), str(logs)], capture_output=True, text=True, env={**base, **env}, timeout=60)


def test_the_parts_reassemble_and_a_machine_without_nvcc_is_told_what_is_missing(tmp_path):
    parts, payload = parts_folder(tmp_path)
    r = run(parts, tmp_path / "logs")
    assert (parts / CORE).read_bytes() == payload  # reassembled in part order, checked
    assert "sha256 ok" in r.stderr
    assert r.returncode == 3, r.stderr
    assert "no nvcc: `which nvcc` finds none, CUDA_HOME is unset" in r.stderr
    assert "install the CUDA toolkit" in r.stderr and "transformer_engine_torch" in r.stderr


def test_a_part_that_does_not_match_is_refused(tmp_path):
    parts, payload = parts_folder(tmp_path)
    (parts / "part-01").write_bytes(b"x" * 1000)  # another download's part
    r = run(parts, tmp_path / "logs")
    assert r.returncode == 4 and "checksum mismatch" in r.stderr and "send the parts again" in r.stderr
    assert not (parts / CORE).exists()  # nothing half-checked is left to install
    (parts / "part-03").unlink()
    (parts / "part-01").write_bytes(payload[1000:2000])
    assert run(parts, tmp_path / "logs").returncode == 4  # a missing part too


def test_a_folder_without_the_parts_says_which_are_missing(tmp_path):
    parts, _ = parts_folder(tmp_path)
    (parts / "deps" / "transformer_engine_torch-2.20.2.tar.gz").unlink()
    r = run(parts, tmp_path / "logs")
    assert r.returncode == 2 and "transformer_engine_torch-*.tar.gz" in r.stderr


def test_with_a_toolchain_it_installs_and_builds_the_binding_in_the_background(tmp_path):
    parts, _ = parts_folder(tmp_path)
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "include").mkdir()
    (cuda / "include" / "cuda_runtime.h").write_text("")
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho nvcc\n")
    nvcc.chmod(0o755)
    calls = tmp_path / "pip-calls"
    pip = tmp_path / "pip"
    pip.write_text(f'#!/bin/sh\necho "NVTE_PYTORCH_FORCE_BUILD=$NVTE_PYTORCH_FORCE_BUILD CUDA_HOME=$CUDA_HOME $*" >> {calls}\n')
    pip.chmod(0o755)
    logs = tmp_path / "logs"
    r = run(parts, logs, path=f"{cuda / 'bin'}:/usr/bin:/bin", PIP=str(pip))
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 30
    while not (logs / "te-build.rc").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (logs / "te-build.rc").read_text().strip() == "0"
    install, build = calls.read_text().splitlines()
    assert "--no-index --no-deps" in install and CORE in install and "transformer_engine-2.20.2-py3-none-any.whl" in install
    assert build.startswith(f"NVTE_PYTORCH_FORCE_BUILD=TRUE CUDA_HOME={cuda} install --no-index --no-deps --no-build-isolation")
    assert build.endswith("transformer_engine_torch-2.20.2.tar.gz")


@pytest.mark.parametrize("script", ["benchmarks/te_install.sh", "benchmarks/gpu_session.sh"])
def test_the_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(REPO / script)]).returncode == 0
