"""A run owns its folder: an exclusive lock on `train.output_dir` for the run's whole life, and the run's
processes stop with the process that holds it. Torch-free: the launcher and the training entrypoint both use it.

The lock is `flock` on `<folder>/.fp8launch.lock`, which names its holder (pid, host, command, start time) for the
one line a refused run prints. flock belongs to the open file, so it goes with the last process holding that file
open, `kill -9` included: a lock a dead run left is simply free. Two kinds of hold, one rule:

- taking it (`hold`): an exclusive lock, without waiting (refused at once, exit 3, where another holds it); then,
  the holder's name written, the lock turns shared, so that the run's own rank-0 worker can hold it too.
  Nobody can take it while anybody holds it, shared or not.
- joining it (`join`, the rank-0 worker of a run whose launcher holds it): a shared lock, kept only when the
  file names the launcher that started this worker (its token, passed in FP8LAUNCH_RUN_LOCK).

So `fp8launch run` holds it (before it writes the plan), passes the open file to torchrun (which keeps it while it
lives) and tells the workers; global rank 0 joins. A job that no launcher here started (sbatch, Kubernetes,
torchrun.sh by hand) is held by its global rank 0 alone, on the node where that rank runs.

    held = hold("runs/x")                 # RunLock; EnvironmentProblem (exit 3) where another run holds it
    Popen(..., pass_fds=held.fds, env={**os.environ, **held.env}, preexec_fn=stop_with_this_process())
    held.release()                        # and the lock file it created goes, unless a joined worker still holds it

A file system without flock (Lustre mounted without `flock`, NFS without a lock daemon) cannot hold it: the run
goes on, with a warning (`RunLock.warning`). `stop_with_this_process` (Linux's parent-death signal) makes a child's
SIGTERM come when this process dies; elsewhere it is None and a killed launcher leaves its children running.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import secrets
import shlex
import signal
import socket
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from launcher.errors import EnvironmentProblem, with_fix

LOCK_FILE = ".fp8launch.lock"
LOCK_ENV = "FP8LAUNCH_RUN_LOCK"
"""Set for the run's processes by the launcher: its token where it holds the lock, PEER where another node's does."""
PEER = "node-rank-0"
"""LOCK_ENV's value for an agent of node rank > 0: node rank 0's launcher holds the lock for the whole job."""
UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
"""What flock says on a file system that cannot lock."""

_TOKENS: dict[int, str] = {}
"""This process's name in the lock files it holds, by pid (a forked copy is another process)."""


@dataclass(eq=False)
class RunLock:
    """A hold on a folder's lock: the open lock file (None where nothing is held here)."""

    folder: str
    fd: int | None = None
    token: str | None = None
    """What the lock file's `token` says while this holds it; the workers check it (LOCK_ENV)."""
    warning: str | None = None
    """Why nothing is held though it was asked for (a file system without locks), for the caller to print."""
    peer: bool = False
    """An agent of node rank > 0: nothing held here, node rank 0's launcher holds it."""
    made: tuple[str, ...] = ()
    """What taking the lock created (the lock file, then the folders, innermost first): what `release` removes."""
    _closed: bool = field(default=False, repr=False)

    @property
    def fds(self) -> tuple[int, ...]:
        """For Popen's pass_fds: the child keeps the lock while it lives, even after this process is gone."""
        return (self.fd,) if self.fd is not None and not self._closed else ()

    @property
    def env(self) -> dict[str, str]:
        """For the run's processes: tells the rank-0 worker to join this hold rather than take one (see `for_worker`)."""
        if self.peer:
            return {LOCK_ENV: PEER}
        return {LOCK_ENV: self.token} if self.fds else {}

    def release(self) -> None:
        """Let go of this process's copy (a child given `fds` holds the lock until it exits), and remove what taking it
        created, the lock file and the folders left empty, unless another process holds the lock still (a joined worker
        that outlived torchrun): a command leaves no lock file behind, a refused one nothing at all. A process that opened
        the file just before finds it gone once it holds it (`hold` checks) and takes the lock anew."""
        if self.fd is None or self._closed:
            return
        self._closed = True
        try:
            if self.made:
                import fcntl

                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else holds it
                os.unlink(self.made[0])
                for folder in self.made[1:]:
                    os.rmdir(folder)
        except OSError:  # held by another process, or something else is in the folder: kept
            pass
        finally:
            os.close(self.fd)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def hold(folder: str, *, key: str = "train.output_dir", elsewhere: str = "set train.output_dir to another folder",
         make: Callable[[str], None] | None = None) -> RunLock:
    """Take `folder`'s lock for this process (creating the folder, with `make` where given, and the lock file where
    missing), or raise EnvironmentProblem (exit 3) naming the run that holds it. `key` and `elsewhere` word the message:
    "{key} {folder} is in use by another run: ...; fix: wait for it to end or stop it, or {elsewhere}"."""
    import fcntl

    missing = []
    for _ in range(5):  # a lock file removed between our open and our lock (`RunLock.release`) is opened anew
        missing = missing or _missing(folder)
        fd, made = _create(folder, key, make)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(fd, folder, key, elsewhere) from None
        except OSError as e:
            return _unsupported(fd, folder, key, e)
        if _same_file(fd, os.path.join(folder, LOCK_FILE)):
            break
        os.close(fd)
    else:
        raise EnvironmentProblem(with_fix(f"{key} {folder}: {LOCK_FILE} keeps being removed", "stop what removes it"))
    token = _token()
    try:
        data = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": _this_command(),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "token": token}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, data.encode(), 0)
    except OSError as e:
        os.close(fd)
        raise EnvironmentProblem(with_fix(f"{key} {folder}: cannot write {LOCK_FILE} ({e.strerror})",
                                          "free space on that file system or make the folder writable")) from None
    try:  # shared from now on: the run's rank-0 worker joins it; an exclusive lock is still refused
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # another run took it in the instant the lock changed kind: that run has it
        raise _in_use(fd, folder, key, elsewhere) from None
    return RunLock(folder, fd=fd, token=token, made=(*made, *missing))


def join(folder: str, token: str, *, key: str = "train.output_dir") -> RunLock:
    """Hold `folder`'s lock alongside the launcher whose token is `token` (a shared lock); raise EnvironmentProblem
    (exit 3) where the lock is another run's."""
    import fcntl

    fd = _open(folder, key)
    if fd is None:
        return RunLock(folder, warning=f"warning: {key} {folder}: {LOCK_FILE} is gone; this run holds no lock on the folder")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(fd, folder, key, "set train.output_dir to another folder") from None
    except OSError as e:
        return _unsupported(fd, folder, key, e)
    if _holder(fd).get("token") != token:  # held, shared, by a run that did not start this process
        raise _in_use(fd, folder, key, "set train.output_dir to another folder")
    return RunLock(folder, fd=fd, token=token)


_KEPT: list[RunLock] = []
"""The training entrypoint's hold: kept until the process exits."""


def for_worker(folder: str, environ: Mapping[str, str] | None = None) -> RunLock | None:
    """What the training process of global rank 0 does: join the launcher's hold (LOCK_ENV names its token), leave it to
    node rank 0's launcher (PEER), or, started by no launcher that holds it (sbatch, Kubernetes, torchrun.sh by hand),
    take it. The hold lasts as long as this process. Raises EnvironmentProblem (exit 3) where another run holds it."""
    environ = os.environ if environ is None else environ
    value = environ.get(LOCK_ENV, "")
    if value == PEER:
        return None
    held = join(folder, value) if value else hold(folder)
    _KEPT.append(held)
    return held


def _missing(folder: str) -> list[str]:
    """The folders of `folder`'s path that do not exist yet, innermost first."""
    missing, path = [], os.path.abspath(folder)
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _create(folder: str, key: str, make: Callable[[str], None] | None) -> tuple[int, tuple[str, ...]]:
    """The lock file opened (created, with the folder, where missing); also what was created: (path,) or ()."""
    if make is not None:
        make(folder)
    else:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise EnvironmentProblem(with_fix(f"{key} {folder} cannot be created ({e.strerror})",
                                              "set it to a folder you can write")) from None
    fd = _open(folder, key, exclusive=True)
    if fd is not None:
        return fd, (os.path.abspath(os.path.join(folder, LOCK_FILE)),)
    fd = _open(folder, key)
    if fd is None:  # removed between the two opens: once more, creating it
        return _create(folder, key, make)
    return fd, ()


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _open(folder: str, key: str, *, exclusive: bool = False) -> int | None:
    """The lock file, opened for reading and writing (None where it does not exist, or, `exclusive`, where it does);
    never through a symbolic link, never anything but a file."""
    path = os.path.join(folder, LOCK_FILE)
    flags = os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | (os.O_CREAT | os.O_EXCL if exclusive else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except (FileNotFoundError, FileExistsError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise EnvironmentProblem(with_fix(f"{key} {folder}: {LOCK_FILE} is a symbolic link, not the lock file fp8launch writes",
                                              f"remove {path}")) from None
        if e.errno == errno.EISDIR:
            raise EnvironmentProblem(with_fix(f"{key} {folder}: {LOCK_FILE} is a folder, not the lock file fp8launch writes",
                                              f"remove {path}")) from None
        raise EnvironmentProblem(with_fix(f"{key} {folder}: cannot open {LOCK_FILE} ({e.strerror})",
                                          "make the folder and the file writable, or set another folder")) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EnvironmentProblem(with_fix(f"{key} {folder}: {LOCK_FILE} is not a regular file", f"remove {path}"))
    return fd


def _unsupported(fd: int, folder: str, key: str, error: OSError) -> RunLock:
    os.close(fd)
    if error.errno not in UNSUPPORTED:
        raise EnvironmentProblem(with_fix(f"{key} {folder}: cannot lock {LOCK_FILE} ({error.strerror})",
                                          "use a folder on a file system that supports flock")) from None
    return RunLock(folder, warning=f"warning: {key} {folder}: this file system cannot lock files ({error.strerror}); "
                                   "a second run into this folder would not be refused")


def _in_use(fd: int, folder: str, key: str, elsewhere: str) -> EnvironmentProblem:
    holder = _holder(fd)
    os.close(fd)
    if holder.get("pid") and holder.get("host"):
        who = f"pid {holder['pid']} on host {holder['host']}"
        more = ", ".join(str(holder[k]) if k == "command" else f"since {holder[k]}" for k in ("command", "started") if holder.get(k))
        who += f" ({more})" if more else ""
    else:
        who = "a process that has not named itself yet (it is starting)"
    return EnvironmentProblem(with_fix(f"{key} {folder} is in use by another run: {who}",
                                       f"wait for it to end or stop it, or {elsewhere}"))


def _holder(fd: int) -> dict:
    """What the lock file says about its holder ({} where it says nothing readable)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token() -> str:
    pid = os.getpid()
    if pid not in _TOKENS:
        _TOKENS[pid] = f"{socket.gethostname()}:{pid}:{secrets.token_hex(6)}"
    return _TOKENS[pid]


def _this_command() -> str:
    argv = [os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
    text = shlex.join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


# -- the run's processes stop with it -------------------------------------------------------------

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable | None:
    """libc's prctl, where this is Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Have Linux send `signum` to this process when the thread that started it ends (its parent's death, kill -9
    included: prctl PR_SET_PDEATHSIG, which survives exec). False where that is not available."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def stop_with_this_process(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen, called from the thread that lives as long as the child should (the main
    thread): the child gets `signum` when this process dies. None where Linux's prctl is not available."""
    prctl = _prctl()  # resolved here: the child, between fork and exec, only calls it
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:  # this process died between the fork and the prctl: nobody will signal
            os._exit(128 + int(signum))

    return preexec
