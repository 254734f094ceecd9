"""Why a torchrun run failed, said in one line, from what torchrun and the ranks printed (`fp8launch run`'s `execute`).

- A rank killed by a signal (SIGKILL from the kernel's out-of-memory killer, a SIGSEGV, a `kill`): torchrun's failure
  table names its rank, pid and exit code (-9); the other ranks then fail their collectives ("Connection closed by
  peer") and print tracebacks that say nothing of the cause. The line names the rank, the signal, the last logged
  step and the newest complete checkpoint; the survivors' tracebacks and error lines stay in torchrun.log. A pid that
  torchrun signalled itself while stopping the other ranks ("Sending process N closing signal SIGTERM", "forcefully
  exiting via SIGKILL") is a consequence, and SIGINT is a Ctrl-C (the run's own business), so neither is a cause.
- torchrun that never started a rank because the rendezvous failed: its traceback becomes one line naming the endpoint.

`Held` keeps back, while the run goes on, the lines of a rank that is failing (its traceback, its one-line error), until
the run's end says whether they are the news or a consequence.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass, field
from typing import Callable, Mapping

from launcher.errors import ENTRYPOINT_CODES, EnvironmentProblem, LauncherError, with_fix
from launcher.targets.checkpoint_record import complete
from launcher.targets.disk import DiskFull, no_space

TRACEBACK_HEAD = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception", "The above exception was the direct cause", TRACEBACK_HEAD)
ERROR_LINE = re.compile(r"(\[rank \d+\] )?(error(\[[A-Z0-9-]+\])?|preempted): ")
"""The shape of the entrypoint's one-line report (launcher/train/main.py `_report`)."""
_PREFIX = re.compile(r"^(\[rank \d+\] )?(\[rank\d+\]: ?)?")
_FAILURE = re.compile(r"rank\s*: (\d+) \(local_rank: (\d+)\)\s*\n\s*exitcode\s*: (-?\d+) \(pid: (\d+)\)")
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_SIGNALLED = re.compile(r"(?:Sending process (\d+) closing signal|Unable to shutdown process (\d+) via)")


@dataclass
class Held:
    """The lines of failing ranks, held back: a rank's traceback from its first line to its exception line (and any
    chained one), and its one-line error. Everything else is echoed at once."""

    lines: list[tuple[str, str, Callable[[str], None]]] = field(default_factory=list)
    """(kind: traceback | error, the line, where it goes), in the order they came."""
    _inside: dict[int, bool] = field(default_factory=dict)
    """Ranks inside a traceback: True once its exception line came (what follows may chain another, or go on)."""
    restarts: int = 0
    """launch.max_restarts: how many times torchrun starts the ranks again after a failure."""
    _failed: tuple[int, int, int] | None = None
    """(exit code, local rank, pid) of the worker whose failure torchrun restarts the ranks for, until they speak again."""
    _signalled: set[int] = field(default_factory=set)
    _note: Callable[[str], None] | None = None

    def agent(self, text: str, echo: Callable[[str], None]) -> None:
        """One of torchrun's own lines: the pids it signals itself, and a worker's failure (which, when the ranks speak
        again after it, torchrun restarted: launch.max_restarts)."""
        self._signalled.update(int(a or b) for a, b in _SIGNALLED.findall(text))
        failed = _FAILED.search(text)
        if failed and self.restarts > 0:
            self.restarts -= 1
            self._failed, self._note = (int(failed.group(1)), int(failed.group(2)), int(failed.group(3))), echo

    def _restarted(self) -> None:
        """The ranks speak again after a failure: the failed attempt's held lines are shown, or, where a signal killed a
        worker, replaced by one note (the survivors' tracebacks are in torchrun.log)."""
        code, local_rank, pid = self._failed
        self._failed = None
        if code < 0 and pid not in self._signalled and -code != signal.SIGINT:
            self.release(kinds=())
            k = Killed(local_rank, -code)
            self._note(f"note: local rank {local_rank} was killed by {k.name} (signal {k.signal}); torchrun restarted the ranks "
                       "(launch.max_restarts), which resume from the newest complete checkpoint\n")
        else:
            self.release()
        self._inside.clear()

    def line(self, rank: int, text: str, echo: Callable[[str], None]) -> None:
        if self._failed is not None:
            self._restarted()
        body = _PREFIX.sub("", text.rstrip("\n"))
        ended = self._inside.get(rank)
        if ended is False:  # a frame, or the exception line that ends the traceback
            self.lines.append(("traceback", text, echo))
            self._inside[rank] = bool(body.strip()) and not body.startswith((" ", TRACEBACK_HEAD))
            return
        if ended:
            if not body.strip() or body.startswith(CHAINED):
                self.lines.append(("traceback", text, echo))
                self._inside[rank] = not body.startswith(TRACEBACK_HEAD)
                return
            del self._inside[rank]  # the traceback is over and the rank goes on: a library logged it
        if body.startswith(TRACEBACK_HEAD):
            self._inside[rank] = False
            self.lines.append(("traceback", text, echo))
        elif ERROR_LINE.match(text):
            self.lines.append(("error", text, echo))
        else:
            echo(text)

    def errors(self) -> list[str]:
        return [_PREFIX.sub("", text).strip() for kind, text, _ in self.lines if kind == "error"]

    def release(self, kinds: tuple[str, ...] = ("traceback", "error")) -> None:
        """Echo the held lines of `kinds` (in their order); forget the others."""
        for kind, text, echo in self.lines:
            if kind in kinds:
                echo(text)
        self.lines = []


@dataclass(frozen=True, slots=True)
class Killed:
    rank: int
    signal: int

    @property
    def name(self) -> str:
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    @property
    def exit_code(self) -> int:
        """128 + the signal, as a shell reports a process a signal killed."""
        return 128 + self.signal


def killed(agent_lines: list[str]) -> Killed | None:
    """The rank a signal killed, from torchrun's failure table: the root cause if a signal killed it, else the first
    failure that a signal other than torchrun's own and other than SIGINT ended; None when there is none."""
    text = "".join(agent_lines)
    ours = {int(a or b) for a, b in _SIGNALLED.findall(text)}
    found = [Killed(int(rank), -int(code)) for rank, _, code, pid in _FAILURE.findall(text)
             if int(code) < 0 and int(pid) not in ours and -int(code) != signal.SIGINT]
    if "Root Cause" in text:  # torchrun prints the root cause last; a killed one there comes first
        root = _FAILURE.findall(text.split("Root Cause", 1)[1])
        first = [k for k in found if root and k.rank == int(root[0][0])]
        found = first + [k for k in found if k not in first]
    return found[0] if found else None


def killed_line(k: Killed, output_dir: str, newest: str | None, world: int | None) -> str:
    """The one line of a rank a signal killed (without the "error: " prefix)."""
    step = last_step(output_dir)
    when = f"after step {step}" if step is not None else "before its first logged step"
    others = "the other ranks stopped with it" if world is None or world > 1 else ""
    where = f"the newest complete checkpoint is {newest}" if newest else "no complete checkpoint was written yet"
    why = (f"find what sent it ({k.name}: most often the kernel's out-of-memory killer, which `dmesg` names; lower "
           "train.micro_batch_size or use fewer ranks if so)" if k.signal == signal.SIGKILL else
           f"find what sent it, or why the rank crashed ({k.name})")
    again = "; then run the same command again to continue from that checkpoint" if newest else ""
    return with_fix("; ".join(p for p in (f"rank {k.rank} was killed by {k.name} (signal {k.signal}) {when}", others, where) if p),
                    why + again)


def last_step(output_dir: str) -> int | None:
    """The last step this run (the last start record on) logged to metrics.jsonl, or None."""
    from launcher.train.metrics import read_records

    try:
        records, _ = read_records(os.path.join(output_dir, "metrics.jsonl"))
    except OSError:
        return None
    step = None
    for r in records:
        if r.get("event") == "start":
            step = None
        elif r.get("event") == "step" and isinstance(r.get("step"), int):
            step = r["step"]
    return step


RENDEZVOUS_ERRORS = ("RendezvousConnectionError", "RendezvousTimeoutError", "RendezvousClosedError", "RendezvousError")
_EXCEPTION = re.compile(r"^(?:torch\.[\w.]+|\w+Error): (.+)$")


def rendezvous_line(agent_lines: list[str], endpoint: str, key: str) -> str | None:
    """One line for a torchrun that stopped in its rendezvous before any rank started (its traceback names the error,
    the inner one first); None for another failure."""
    if not any(e in line for line in agent_lines for e in RENDEZVOUS_ERRORS):
        return None
    causes = [m.group(1).strip() for line in agent_lines if (m := _EXCEPTION.match(line.strip()))]
    why = causes[0] if causes else "see torchrun.log"
    return with_fix(f"torchrun could not join the rendezvous at {endpoint} ({key}): {why}",
                    f"check that node 0's agent runs and that {endpoint} reaches it from here (and that no other program holds "
                    f"that port there), or set {key} to node 0's HOST:PORT")


def plan_facts(torchrun_sh: str) -> dict:
    """What the launch needs of the plan beside torchrun.sh (plan.json): the world size, the rendezvous endpoint, the
    restarts."""
    try:
        with open(os.path.join(os.path.dirname(torchrun_sh), "plan.json"), encoding="utf-8") as f:
            plan = json.load(f)
    except (OSError, ValueError):
        return {}
    launch = plan.get("launch", {})
    return {"world": plan.get("derived", {}).get("world_size"), "rdzv_endpoint": launch.get("rdzv_endpoint"),
            "max_restarts": launch.get("max_restarts", 0)}


def told(code: int, shown, *, torchrun_sh: str, logs: str, launch_env: Mapping[str, str], environ: Mapping[str, str] | None,
         line_file: str, err: Callable[[str], None]) -> int:
    """The end of a torchrun run on the terminal (`shown`: run.py's _Shown), and its exit code: the cause in one line where
    the ranks' own lines do not say it (a rank killed by a signal, whose survivors' tracebacks are consequences; a rank's
    error line lost with its log on a full disk; a failed rendezvous), else the held traceback of an unforeseen crash."""
    if code == 0:
        shown.held.release()
        return 0
    facts = plan_facts(torchrun_sh)
    k = killed(shown.agent_lines)
    if k is not None:
        shown.held.release(kinds=())
        output_dir = os.path.dirname(os.path.normpath(logs))
        err(f"{LauncherError(killed_line(k, output_dir, _newest(output_dir), facts.get('world')))}\n")
        return k.exit_code
    if code in ENTRYPOINT_CODES:  # a rank's own error line is the cause: the other ranks' tracebacks follow from it
        shown_errors = shown.held.errors()
        shown.held.release(("error",))
        line = _read_line(line_file)
        if line and line not in shown_errors:
            err(line + "\n")
        return code
    if not shown.worker_lines:  # torchrun itself failed: its lines are all there is
        environ = os.environ if environ is None else environ
        key = ("--rdzv-endpoint" if "RDZV_ENDPOINT" in launch_env else "RDZV_ENDPOINT" if environ.get("RDZV_ENDPOINT")
               else "launch.rdzv_endpoint")
        endpoint = launch_env.get("RDZV_ENDPOINT") or environ.get("RDZV_ENDPOINT") or facts.get("rdzv_endpoint") or "?"
        line = rendezvous_line(shown.agent_lines, endpoint, key)
        if line is not None:
            err(f"{EnvironmentProblem(line)}\n")
            return EnvironmentProblem.exit_code
        for agent_line in shown.agent_lines:
            err(agent_line)
        return code
    shown.held.release()
    if shown.log_error is not None and no_space(shown.log_error):
        err(f"{DiskFull(os.path.join(logs, 'torchrun.log'))}\n")
    return code


def _read_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _newest(output_dir: str) -> str | None:
    """The newest complete checkpoint of the run in `output_dir`."""
    found = complete(os.path.join(output_dir, "checkpoints"))
    return found[-1][1] if found else None
