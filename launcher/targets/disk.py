"""A full disk, named in one line: the path that could not be written, the bytes its filesystem has free, where that
filesystem is mounted, and the fix (exit 3). Every writer that can meet ENOSPC or EDQUOT turns its error into
`DiskFull`: the launcher (the plan folder, torchrun.log), the ranks (checkpoints, metrics.jsonl, fp8_stats.jsonl, their
output); a rank's line reaches `fp8launch run` even when its own log files are on the full disk (launcher/errors.py,
ERROR_LINE_FILE_ENV).

The errno is not always there to read: DCP gathers every rank's failure into a CheckpointException after pickling it
(the OSError behind torch's "unexpected pos" RuntimeError is lost on the way), and torch.save to a path reports a full
disk as a C++ stream error. A failed write on a filesystem with less than NEARLY_FULL_BYTES free counts as a full disk
too (`full`).
"""

from __future__ import annotations

import errno
import os
import shutil

from launcher.errors import EnvironmentProblem, with_fix

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_TEXT = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
""""No space left on device", "Disk quota exceeded": the same errors as text, where they reach us inside a message."""
NEARLY_FULL_BYTES = 1 << 20
"""A write that failed where its filesystem has less than this free failed for want of space: a failed write leaves less
than the chunk it could not place (DCP writes a tensor at a time), and no filesystem here runs on less."""
OUTPUT_DIR_FIX = "set train.output_dir to a folder on another filesystem"


def no_space(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from or holds (a CheckpointException's per-rank failures), is ENOSPC
    or EDQUOT, by errno or by its message."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return True
        if any(text in str(e) for text in NO_SPACE_TEXT):
            return True
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)  # torch.distributed.checkpoint's CheckpointException: {rank: (error, traceback)}
        if isinstance(failures, dict):
            todo += [f[0] for f in failures.values() if isinstance(f, tuple) and f and isinstance(f[0], BaseException)]
    return False


def full(error: BaseException, path: str) -> bool:
    """Whether writing `path` failed with `error` for want of space: the error says so, or the filesystem holding `path`
    has less than NEARLY_FULL_BYTES left."""
    if no_space(error):
        return True
    free = free_bytes(path)
    return free is not None and free < NEARLY_FULL_BYTES


def _existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer can still use on the filesystem holding `path` (or its nearest existing folder)."""
    try:
        return shutil.disk_usage(_existing(path)).free
    except OSError:
        return None


def mount_of(path: str) -> str:
    """The mount point of the filesystem holding `path`."""
    path = os.path.realpath(_existing(path))
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


class DiskFull(EnvironmentProblem):
    """Writing `path` failed for want of space: "no space left on device writing PATH (N bytes free on MOUNT)"; with
    `checkpoints`, what is safe to resume from (`newest`, or none yet)."""

    def __init__(self, path: str, *, checkpoints: bool = False, newest: str | None = None, elsewhere: str = OUTPUT_DIR_FIX):
        free = free_bytes(path)
        mount = mount_of(path)
        self.path, self.checkpoints = path, checkpoints
        where = f"{free:,} bytes free on {mount}" if free is not None else f"on {mount}"
        message = f"no space left on device writing {path} ({where})"
        if checkpoints:
            message += f"; the newest complete checkpoint is {newest}" if newest else "; no complete checkpoint was written yet"
        super().__init__(with_fix(message, f"free space on {mount}, or {elsewhere}"))
