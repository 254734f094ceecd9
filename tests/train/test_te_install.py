"""benchmarks/te_install.sh (the `te` stage of benchmarks/gpu_session.sh) on a fake parts folder and a fake toolchain
(tests/train/_te_fakes.py), one refusal at a time: the headers the binding includes are checked first, then nvcc,
then what arrived; a part that does not match is refused with nothing half-checked left to install. The calls in
sequence, the build outliving its call: tests/train/test_te_session.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from ._te_fakes import CORE, REPO, Machine, parts_folder

SCRIPT = REPO / "benchmarks" / "te_install.sh"


def run(parts: Path, state: Path, machine: Machine, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "next", str(parts), str(state)], capture_output=True, text=True,
                          env=machine.env(**env), timeout=60)


@pytest.mark.skipif(importlib.util.find_spec("nvidia") is not None,
                    reason="this venv carries CUDA's nvidia pip packages (a CUDA torch): te_install.sh finds their headers")
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


def _dist(site: Path, name: str, version: str, *requires: str) -> None:
    """An installed distribution as importlib.metadata finds it: NAME-VERSION.dist-info/METADATA in `site`."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))


def test_the_machines_own_packages_stay_and_only_what_it_lacks_is_installed(tmp_path):
    """TE's needs go in beside the image's packages, never over them: the carried onnx is left out where the machine
    has one, what it lacks (nvdlfw-inspect) and TE's own wheels go in, and deps.txt says which. Once the binding is
    built, TE's requirements are held to what the machine has: a kept onnx below TE's floor is said, not fatal."""
    parts = tmp_path / "te"
    parts_folder(parts)
    for wheel in ("onnx-1.19.0-cp312-cp312-manylinux_2_17_x86_64.whl", "nvdlfw_inspect-0.2.1-py3-none-any.whl"):
        (parts / "deps" / wheel).write_bytes(b"wheel")
    machine = Machine(tmp_path / "m")
    _dist(machine.site, "onnx", "1.23.1")  # the image's
    _dist(machine.site, "transformer_engine", "2.20.2", "onnx>=1.99", "nvdlfw-inspect", 'einops; extra == "pytorch"')
    r = run(parts, tmp_path / "state", machine)
    assert r.returncode == 0, r.stderr
    install = next(line for line in machine.calls.read_text().splitlines() if "install -q --no-index --no-deps" in line)
    got = sorted(Path(w).name for w in install.split("--no-deps", 1)[1].split())
    assert got == sorted([CORE, "nvdlfw_inspect-0.2.1-py3-none-any.whl", "transformer_engine-2.20.2-py3-none-any.whl"])
    assert (tmp_path / "state" / "deps.txt").read_text().splitlines() == [
        "installed nvdlfw_inspect 0.2.1", "kept onnx 1.23.1 (the machine's; the carried 1.19.0 not installed)",
        "installed transformer_engine 2.20.2"]
    assert "kept the machine's onnx 1.23.1" in r.stderr
    needs = (tmp_path / "state" / "needs.txt").read_text().splitlines()
    assert [line.split(" needs ")[1].split(":")[0] for line in needs] == ["onnx>=1.99", "nvdlfw-inspect", "einops"]  # the extra's too
    assert needs[0] == "UNMET transformer_engine needs onnx>=1.99: 1.23.1"
    assert "transformer_engine needs onnx>=1.99, the machine has 1.23.1" in r.stderr


@pytest.mark.parametrize("listing", ["pep691", "pep503", "wrong sha256"])
def test_complete_finishes_what_gpu_wheelhouse_left_at_the_sdist_without_building_it(tmp_path, listing):
    """`complete` on a folder where `gpu-wheelhouse te` stopped at the binding's sdist (the core wheel downloaded, not
    split; deps/ empty): the core summed and split, TE's wheel and the needs the image lacks downloaded as wheels only,
    the sdist fetched from the index as a file and checked against its sha256; a mismatch leaves nothing."""
    import functools
    import hashlib
    import http.server
    import json
    import threading

    parts, index = tmp_path / "te", tmp_path / "index"
    parts.mkdir()
    payload = os.urandom(2500)
    (parts / CORE).write_bytes(payload)
    sdist = b"the binding's sources"
    (index / "files").mkdir(parents=True)
    (index / "files" / "transformer_engine_torch-2.20.2.tar.gz").write_bytes(sdist)
    sha = hashlib.sha256(sdist if listing != "wrong sha256" else b"other").hexdigest()
    page = index / "simple" / "transformer-engine-torch"
    page.mkdir(parents=True)
    url = "../../files/transformer_engine_torch-2.20.2.tar.gz"
    (page / "index.html").write_text(
        json.dumps({"files": [{"filename": "transformer_engine_torch-2.20.2.tar.gz", "url": url, "hashes": {"sha256": sha}}]})
        if listing == "pep691" else f'<html><body><a href="{url}#sha256={sha}">transformer_engine_torch-2.20.2.tar.gz</a></body></html>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        machine = Machine(tmp_path / "m")
        r = subprocess.run(["bash", str(SCRIPT), "complete", str(parts)], capture_output=True, text=True, timeout=60,
                           env=machine.env(TE_INDEX=f"http://127.0.0.1:{server.server_port}/simple"))
    finally:
        server.shutdown()
    assert (parts / "te-core.sha256").read_text() == f"{hashlib.sha256(payload).hexdigest()}  {CORE}\n"
    assert b"".join(p.read_bytes() for p in sorted(parts.glob("part-*"))) == payload and not (parts / CORE).exists()
    download = machine.calls.read_text()
    assert "download -q --no-deps -d" in download and "--only-binary=:all:" in download
    assert all(f" {w}" in download for w in ("transformer_engine==2.20.2", "pydantic", "nvdlfw-inspect", "nvidia-cudnn-frontend>=1.29.0"))
    assert "transformer_engine_torch" not in download  # the sdist never goes through pip here
    fetched = parts / "deps" / "transformer_engine_torch-2.20.2.tar.gz"
    if listing == "wrong sha256":
        assert r.returncode == 3 and "the index says" in r.stderr and not fetched.exists()
        assert list((parts / "deps").iterdir()) == []  # no half-written file
    else:
        assert r.returncode == 0, r.stderr
        assert fetched.read_bytes() == sdist and "its metadata is built on the GPU machine" in r.stderr
