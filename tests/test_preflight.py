"""`fp8launch run` refuses a run that cannot work before starting torchrun, without importing torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from launcher.commands.preflight import gpu_present
from launcher.planning.install import INSTALL

CPU_SPEC = """\
version = 1
name = "p"
[launch]
device = "{device}"
[precision]
mode = "{mode}"
backend = "{backend}"
[distributed]
strategy = "ddp"
procs_per_node = 1
[train]
output_dir = "{output_dir}"
"""


def _run(tmp_path, **keys):
    spec = tmp_path / "p.toml"
    spec.write_text(CPU_SPEC.format(**{"device": "cpu", "mode": "bf16", "backend": "torchao", "output_dir": "runs/p", **keys}))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", "run", str(spec)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if not line.startswith("import time:")]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if line.startswith("import time:")}
    return r, lines, imported


def test_missing_backend_package_exits_3_before_torch(tmp_path):
    r, lines, imported = _run(tmp_path, device="cuda", mode="fp8", backend="te")
    assert r.returncode == 3, r.stderr[-2000:]
    lines = [line for line in lines if "warning[" not in line]  # the debug model also gets FP8-NO-GAIN's warning
    assert lines == ["error[BACKEND-MISSING]: the transformer_engine package is not importable here; fix: install it: "
                     f"{INSTALL['transformer_engine']}"]
    assert "jinja2" in imported and "torch" not in imported
    assert not (tmp_path / "runs" / "p" / "plan").exists()  # nothing planned, nothing started


@pytest.mark.skipif(gpu_present(os.environ), reason="this machine has a GPU")
def test_cuda_spec_without_a_gpu_exits_3_before_torch(tmp_path):
    r, lines, imported = _run(tmp_path, device="cuda")
    assert r.returncode == 3, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith('error: launch.device = "cuda" but this machine shows no GPU'), lines
    assert "torch" not in imported


def test_unwritable_output_dir_exits_3_before_torch(tmp_path):
    (tmp_path / "afile").write_text("x")
    r, lines, imported = _run(tmp_path, output_dir="afile/run")
    assert r.returncode == 3, r.stderr[-2000:]
    assert lines == [f"error: train.output_dir = 'afile/run' cannot be created: {tmp_path / 'afile'} is a file, not a folder; "
                     "fix: set train.output_dir to a folder you can write"]
    assert "torch" not in imported


def test_gpu_detection_without_torch(tmp_path):
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    empty = {"PATH": str(tmp_path / "bin")}
    assert not gpu_present(empty, str(root))
    (root / "proc" / "driver" / "nvidia" / "gpus" / "0000:17:00.0").mkdir(parents=True)
    assert gpu_present(empty, str(root))
    assert not gpu_present({**empty, "CUDA_VISIBLE_DEVICES": ""}, str(root))
    assert not gpu_present({**empty, "CUDA_VISIBLE_DEVICES": "-1"}, str(root))
    assert gpu_present({**empty, "CUDA_VISIBLE_DEVICES": "0,1"}, str(root))
    bare = tmp_path / "bare"
    (bare / "dev").mkdir(parents=True)
    (bare / "dev" / "nvidia0").write_text("")
    assert gpu_present(empty, str(bare))
    # a container with only nvidia-smi to go by
    smi_only = tmp_path / "smi-only"
    smi_only.mkdir()
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)'\n")
    smi.chmod(0o755)
    assert gpu_present(empty, str(smi_only))
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    assert not gpu_present(empty, str(smi_only))


def test_slurm_inside_an_allocation_does_not_look_for_a_gpu_here(tmp_path):
    """salloc's shell may sit on a login node without GPUs: the job's nodes have them."""
    from launcher.commands.plan import plan_one
    from launcher.commands.preflight import check

    (tmp_path / "s.toml").write_text('version = 1\nname = "s"\n[launch]\ndevice = "cuda"\nlauncher = "slurm"\n'
                                     f'[train]\noutput_dir = "{tmp_path}/runs/s"\n')
    plan = plan_one(str(tmp_path / "s.toml"), str(tmp_path / "out")).plan
    check(plan, local=True, gpu_here=False, environ={"CUDA_VISIBLE_DEVICES": ""})  # no error
    with pytest.raises(Exception, match="shows no GPU"):
        check(plan, local=True, environ={"CUDA_VISIBLE_DEVICES": ""})
