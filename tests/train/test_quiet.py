"""Known-harmless library noise is dropped by its exact text; a real warning still gets through."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import enum, logging, sys
if sys.argv[1] == "quiet":
    from launcher.train import quiet
    quiet.install()
import torchao, torchao.float8  # the real imports a worker does
from launcher.train.quiet import PYTREE_ENUM

class Mine(enum.Enum):
    A = 1

logging.getLogger("torchao").warning("Failed to load /opt/x/torchao/_C_other.so: undefined symbol: foo")
logging.getLogger("torch.utils._pytree").warning(PYTREE_ENUM, Mine)
logging.getLogger("torchao").warning("a real torchao warning")
"""


def _stderr(mode: str) -> str:
    r = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_harmless_messages_are_dropped_and_real_ones_get_through():
    noisy, quiet = _stderr("noisy"), _stderr("quiet")
    assert "torchao/_C_mxfp8" in noisy and "<enum 'KernelPreference'> is an Enum subclass" in noisy  # what a worker would print
    assert "torchao/_C_mxfp8" not in quiet and "_C_cutlass_90a" not in quiet and "KernelPreference" not in quiet
    for real in ("Failed to load /opt/x/torchao/_C_other.so: undefined symbol: foo", "<enum 'Mine'> is an Enum subclass",
                 "a real torchao warning"):
        assert real in quiet and real in noisy
