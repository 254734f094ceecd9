"""Transformer Engine's session, walked call by call on the CPU as docs/benchmarks.md ("Transformer Engine, call by
call") gives it: each row's carry copied into a "machine" folder that keeps what earlier calls brought (git-ignored
folders stay while the machine is warm), OUT emptied before each call, the row's command run by the real
benchmarks/gpu_session.sh and te_install.sh, and every process the call leaves in its own process group killed when
it returns, as the GPU machine does. Stand-ins (tests/train/_te_fakes.py): the parts (random bytes), nvcc, the headers
in nvidia pip packages, and pip, whose build of the binding takes 4 s. Checked: each call's exit code and state, what
its OUT holds, the build started by one call running on after that call's processes were killed, and the next call
finding it done, then running tests/gpu's TE cases."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from ._te_fakes import CORE, REPO, Machine, parts_folder

pytestmark = pytest.mark.slow  # the last call collects tests/gpu's TE cases (~20 s); the others take about a second


def doc_calls() -> list[dict]:
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").split("## Transformer Engine, call by call", 1)[1]
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [dict(zip(rows[0], row)) for row in rows[2:]]


def call(row: dict, machine: Machine, local: Path, remote: Path, out: Path, work: Path, **env) -> subprocess.CompletedProcess:
    """One device call: the carry copied over (each path replaces its namesake there), OUT empty, the command run in
    its own process group, which is killed once the command returns."""
    for path in json.loads(row["carry"]):
        if path == ".whl":
            continue  # the wheelhouse: fp8launch's backends import here already, so the session installs nothing
        src, dst = local / path, remote / path
        shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(missing_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copyfile(src, dst)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    m = re.fullmatch(r"((?:[A-Z_]+=\S+ )*)bash benchmarks/gpu_session\.sh \.whl te \$OUT", row["command"])
    assert m, row["command"]
    assigned = dict(item.split("=", 1) for item in m.group(1).split())
    environ = machine.env(TE_PARTS=str(remote / ".te"), TE_STATE=str(remote / ".te-state"), WORK=str(work), PACK_EVERY="1",
                          **assigned, **env)
    proc = subprocess.Popen(["bash", "benchmarks/gpu_session.sh", ".whl", "te", str(out)], cwd=REPO, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    stdout, _ = proc.communicate(timeout=int(row["timeout_s"]))
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what the machine does to what a call leaves running in its session
    except ProcessLookupError:
        pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, "")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def problems(out: Path) -> list[str]:
    """benchmarks/pack_results.py's check of OUT against what the GPU machine brings back."""
    spec = importlib.util.spec_from_file_location("benchmarks_pack_results", REPO / "benchmarks" / "pack_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.problems(out)


def test_the_te_calls_bring_the_parts_build_across_calls_and_test(tmp_path):
    calls = doc_calls()
    assert [c["call"] for c in calls] == ["1", "2", "3", "4", "5", "6", "7"]
    local, remote = tmp_path / "here", tmp_path / "machine"
    payload = parts_folder(local / ".te", os.urandom(5300))  # part-00..04 of 1000 bytes, part-05 of 300: the last is the smallest
    prepared = subprocess.run(["bash", "benchmarks/te_install.sh", "prepare", str(local / ".te")], cwd=REPO, capture_output=True, text=True)
    assert prepared.returncode == 0, prepared.stderr
    (remote / ".te").mkdir(parents=True)
    machine = Machine(tmp_path / "m", build_s=4)
    state = remote / ".te-state"
    results = []
    for i, row in enumerate(calls[:5]):
        r = call(row, machine, local, remote, tmp_path / "out", tmp_path / f"work{i}")
        results.append(r)
        assert r.returncode == 75, r.stdout
        assert problems(tmp_path / "out") == [] and {"session.log", "results.tgz"} <= {p.name for p in (tmp_path / "out").iterdir()}
        assert f"te_install: {i + 1} of 6 parts here; next call: carry [\"{remote / '.te'}/part-0{i}\"]" in r.stdout
    # the first call checked the headers before any large part came: where each was found, and nvcc
    headers = (state / "headers.txt").read_text().splitlines()
    assert headers == [f"header {h}: {machine.site}/nvidia/{p}/include" for p, h in
                       (("nccl", "nccl.h"), ("cudnn", "cudnn.h"), ("cublas", "cublasLt.h"), ("cu13", "cuda_runtime.h"))] + \
        [f"nvcc: {machine.cuda}/bin/nvcc"]
    assert (tmp_path / "out" / "headers.txt").read_text() == (state / "headers.txt").read_text()  # a single file in OUT too
    assert not machine.calls.exists()  # nothing installed before every part was there

    # call 6 brings the last part: reassembled, checked, installed, the build started; it returns while the build runs
    r = call(calls[5], machine, local, remote, tmp_path / "out", tmp_path / "work5", TE_WAIT="1")
    assert r.returncode == 75, r.stdout
    assert "sha256 ok" in r.stdout and "still building transformer_engine_torch (pid " in r.stdout
    pid = int((state / "build.pid").read_text())
    assert alive(pid)  # its session was killed, the build (a session of its own) was not
    assert not (state / "build.rc").exists() and not (remote / ".te" / CORE).exists()  # installed, then removed
    install, build = machine.calls.read_text().splitlines()
    assert install.endswith(f"| install -q --no-index --no-deps {remote / '.te'}/deps/transformer_engine-2.20.2-py3-none-any.whl "
                            f"{remote / '.te'}/{CORE}")
    env, args = build.split(" | ")
    assert env == (f"NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_PYTORCH_FORCE_BUILD=TRUE CUDA_HOME={machine.cuda} "
                   f"CPATH={':'.join(machine.include_dirs())}")
    assert args == f"install --no-index --no-deps --no-build-isolation -v {remote / '.te'}/deps/transformer_engine_torch-2.20.2.tar.gz"
    with tarfile.open(tmp_path / "out" / "results.tgz") as tar:  # the build's state comes back with the call
        assert "results/te-state/build.pid" in tar.getnames() and "results/te-state/headers.txt" in tar.getnames()

    # call 7 carries nothing: it waits for the build an earlier call started, finds it done, and runs the TE tests
    r = call(calls[6], machine, local, remote, tmp_path / "out", tmp_path / "work6")
    assert r.returncode == 0, r.stdout[-3000:]
    assert not alive(pid) and (state / "build.rc").read_text().strip() == "0"
    assert "te_install: transformer_engine_torch built and imports" in r.stdout and "transformer_engine 2.20.2" in r.stdout
    out = tmp_path / "out"
    assert problems(out) == [] and sorted(p.name for p in out.iterdir()) == ["headers.txt", "results.tgz", "session.log", "te.txt"]
    assert re.search(r"\d+ skipped", (out / "te.txt").read_text())  # here the TE cases skip: no CUDA GPU
    with tarfile.open(out / "results.tgz") as tar:
        junit = tar.extractfile("results/te.xml").read().decode()
    assert re.search(r'tests="(\d+)"', junit).group(1) != "0" and 'failures="0"' in junit and 'errors="0"' in junit
    assert len(machine.calls.read_text().splitlines()) == 2  # one install, one build: nothing was done twice
    assert payload  # the parts were what was reassembled (sha256 ok above)
