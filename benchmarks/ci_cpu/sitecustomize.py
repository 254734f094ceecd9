"""Per-process CPU accounting for benchmarks/ci_cpu.sh (on PYTHONPATH there, never in the package): every Python process
writes its own CPU seconds, command line and the test that started it (PYTEST_CURRENT_TEST, which the processes a test
starts inherit) to $CI_CPU_DIR when it exits, through os._exit too (the training entrypoint leaves that way)."""

import atexit
import json
import os
import resource
import sys
import time

_DIR = os.environ.get("CI_CPU_DIR")
_START = time.time()
_written = False


def _record() -> None:
    global _written
    if _written:
        return
    _written = True
    try:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        record = {"argv": sys.argv[:4], "cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "wall_s": round(time.time() - _START, 3),
                  "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]}
        with open(os.path.join(_DIR, f"{os.getpid()}-{int(_START * 1000)}.json"), "w", encoding="utf-8") as f:
            json.dump(record, f)
    except Exception:  # noqa: BLE001 - accounting never fails the process it watches
        pass


if _DIR:
    atexit.register(_record)
    _exit = os._exit

    def _record_then_exit(code: int) -> None:
        _record()
        _exit(code)

    os._exit = _record_then_exit
