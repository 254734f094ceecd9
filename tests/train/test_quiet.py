"""Known-harmless library noise is dropped by its exact text; a real warning still gets through."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
import warnings
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
out = torch.zeros(4)
dist.all_gather_into_tensor(out, torch.ones(4))  # what DeepSpeed's ZeRO calls every step
warnings.warn("a real FutureWarning", FutureWarning)
dist.destroy_process_group()
"""


def _stderr(*modes: str) -> list[str]:
    """Each mode's script in its own fresh interpreter (the messages come at import), run side by side."""
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mode in modes]
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        errs.append(err)
    return errs


@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
def test_harmless_messages_are_dropped_and_real_ones_get_through():
    noisy, quiet = _stderr("noisy", "quiet")
    assert "torchao/_C_mxfp8" in noisy and "<enum 'KernelPreference'> is an Enum subclass" in noisy  # what a worker would print
    assert "torchao/_C_mxfp8" not in quiet and "_C_cutlass_90a" not in quiet and "KernelPreference" not in quiet
    assert "all_gather_into_tensor` is deprecated" in noisy and "all_gather_into_tensor" not in quiet
    for real in ("Failed to load /opt/x/torchao/_C_other.so: undefined symbol: foo", "<enum 'Mine'> is an Enum subclass",
                 "a real torchao warning", "a real FutureWarning"):
        assert real in quiet and real in noisy
