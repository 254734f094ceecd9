"""Preemption: a SIGTERM asks the run to stop cleanly instead of dying mid-step.

Who sends it: SLURM before the time limit (`#SBATCH --signal=TERM@N`, launch.slurm.signal_seconds)
and on `scancel --signal=TERM`; Kubernetes and most schedulers when they evict a job; torchrun,
which passes the SIGTERM it gets (from `fp8launch run`, which passes on its own) to every worker.

    install()                      # once, first thing in the process: SIGTERM only sets a flag
    ...                            # the loop adds requested() to the all-reduce it does every step
    raise Preempted(...)           # after the step all ranks agreed on, and its checkpoint

The handler does nothing but set the flag: every rank finishes the step it is in, the flag
rides on the loop's one per-step all-reduce so that all ranks stop after the SAME step, they
write a checkpoint together, and exit with EXIT_PREEMPTED. Running the same command again
(train.resume = "auto") continues from that checkpoint. torchrun gives its workers 30 s
between its SIGTERM and a SIGKILL; SLURM's KillWait is 30 s by default too: a step plus a
checkpoint must fit (on a large model, send the signal earlier: signal_seconds).

A second SIGTERM changes nothing (SLURM and torchrun may both deliver one). Under torchrun the
worker also gets a SIGTERM when torchrun dies (`follow_parent`: kill -9 included), so a killed
launcher or agent still ends in a checkpoint.

SIGINT (Ctrl-C; torchrun passes the terminal's on to every worker) keeps its usual meaning: stop
now, without a checkpoint. It is recorded (`interrupted`) before it raises KeyboardInterrupt, so the
entrypoint can tell it from the errors it causes on the way out (a peer gone mid-collective) and
exit 130 with one line instead of a traceback per rank.
"""

from __future__ import annotations

import os
import signal
import threading

# EXIT_PREEMPTED (75) is EX_TEMPFAIL in sysexits.h: "preempted, resumable"; 143 = 128 + SIGTERM would mean it died without a checkpoint.
from launcher.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, LauncherError

SIGNALS = (signal.SIGTERM,)
"""The signals that ask for a checkpoint and a clean stop."""

_received: list[str] = []
_interrupted: list[int] = []


class Preempted(LauncherError):
    """The run stopped on a signal, after a checkpoint every rank finished writing."""

    exit_code = EXIT_PREEMPTED
    label = None  # "preempted: ..." is a clean stop, not an error


class Interrupted(LauncherError):
    """Ctrl-C stopped the run: no new checkpoint; the message says where it stopped and what continues it."""

    exit_code = EXIT_INTERRUPTED
    label = None


def _handler(signum, frame) -> None:  # noqa: ARG001 - the signal module's signature
    if not _received:
        _received.append(signal.Signals(signum).name)


def _on_interrupt(signum, frame) -> None:  # noqa: ARG001
    _interrupted.append(signum)
    raise KeyboardInterrupt


def install() -> bool:
    """Make SIGTERM set the stop flag in this process, and record a SIGINT before it raises KeyboardInterrupt.
    Only the main thread can install handlers: elsewhere (a test harness's thread) returns False and leaves
    the signals alone."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for s in SIGNALS:
        signal.signal(s, _handler)
    signal.signal(signal.SIGINT, _on_interrupt)
    return True


def follow_parent() -> bool:
    """A SIGTERM (a stop after a checkpoint) when the process that started this one dies, kill -9 included
    (Linux's parent-death signal; False elsewhere). For torchrun's workers, which torchrun starts in
    sessions of their own: nothing else would stop them."""
    from launcher.targets.runlock import die_with_parent

    parent = os.getppid()
    if not die_with_parent(signal.SIGTERM):
        return False
    if os.getppid() != parent:  # it died before the kernel was asked
        request()
    return True


def interrupted() -> bool:
    """Whether a SIGINT (Ctrl-C) reached this process."""
    return bool(_interrupted)


def requested() -> str | None:
    """The name of the signal that asked this process to stop ("SIGTERM"), or None."""
    return _received[0] if _received else None


def request(name: str = "SIGTERM") -> None:
    """Ask for a stop as the signal would (tests, and callers with their own notion of preemption)."""
    if not _received:
        _received.append(name)


def reset() -> None:
    """Forget a request (a new run in the same process, e.g. in tests)."""
    _received.clear()
    _interrupted.clear()
