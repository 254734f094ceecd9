"""What many tests need, in one place: a free port, specs written as TOML (launcher's own writer, so strings
are escaped), and a Plan from a spec held in memory."""

from __future__ import annotations

import contextlib
import copy
import socket
import subprocess
from pathlib import Path

import pytest

from launcher.planning.plan import Plan, resolve
from launcher.planning.read import SpecSource, nested, validate
from launcher.targets.toml_text import toml_text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def tmpfs(mnt: Path, size: str):
    """A tmpfs of `size` (e.g. "64k", "20m") mounted at `mnt` for the block, to fill a disk for real: root only, the test
    skipped where `mount` is refused. Unmounted after (lazily: a run's last handle may still be closing)."""
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def spec_toml(flat: dict) -> str:
    """A spec's TOML text from dotted keys."""
    return toml_text(nested(flat))


def write_toml_spec(path: Path, flat: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec_toml(flat))
    return path


def plan_from(data: dict, path: str = "spec.toml") -> Plan:
    """The Plan of a spec held in memory (nested sections; "version" and "name" default to 1 and "t"),
    validated like a file."""
    source = SpecSource(path=path, data={"version": 1, "name": "t", **copy.deepcopy(data)}, sha256="")
    validate(source)
    return resolve(source)


def skip_without_torch_mx() -> None:
    """Skip a test of torchao's MXFP8 training on a torch that lacks what it asserts (torch < 2.13: rule
    TORCHAO-MX-TORCH refuses such runs; `make test-compat TORCH=2.11.0` runs the tests there)."""
    from launcher.train.precision.torchao_fp8 import mx_torch_supported

    if not mx_torch_supported():
        pytest.skip("torchao's MXFP8 training needs torch >= 2.13 (rule TORCHAO-MX-TORCH)")
