"""tests/e2e/helpers.native_crash: which failed runs the e2e fixtures run once more. torchrun's own failure report
(torch.distributed.elastic's ChildFailedError, as torchrun.log ends with it) for a rank killed by a signal and for a rank
that raised: only the first is a native crash."""

from __future__ import annotations

import signal

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from tests.e2e.helpers import native_crash


def _torchrun_log(folder, *failures: tuple[int, int]) -> None:
    """folder/logs/torchrun.log ending as torchrun ends it, for (rank, exit code) failures, the first the root cause."""
    report = ChildFailedError("fp8launch-train", {rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code,
                                                                       error_file="<N/A>")
                                                  for rank, code in failures})
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "torchrun.log").write_text("[fp8launch-rank0]:step 1/2 | loss 7.3\n" + report.format_msg() + "\n")


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT])
def test_a_rank_killed_by_a_native_crash_is_one(tmp_path, sig):
    _torchrun_log(tmp_path, (3, -int(sig)), (1, -int(signal.SIGTERM)))
    cause = native_crash(tmp_path)
    assert cause is not None and f"({sig.name})" in cause and "rank : 3" in cause


@pytest.mark.parametrize("failures", [[(1, 1)], [(0, -int(signal.SIGTERM)), (2, -int(signal.SIGSEGV))], [(0, -int(signal.SIGKILL))]],
                         ids=["python-error", "segfault-not-first", "killed"])
def test_anything_else_is_not(tmp_path, failures):
    """A Python error (exit 1), a crash that was not the first failure, and a rank killed from outside fail the test."""
    _torchrun_log(tmp_path, *failures)
    assert native_crash(tmp_path) is None


def test_a_run_without_a_log_is_not(tmp_path):
    assert native_crash(tmp_path) is None
