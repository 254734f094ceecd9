"""The one hierarchy of errors a user sees, and every exit code. The CLI turns errors into messages
and exit codes; the training entrypoint leaves its code where `fp8launch run` reads it."""

from __future__ import annotations

from dataclasses import dataclass

EXIT_DRIFT = 1
EXIT_INVALID = 2
EXIT_ENVIRONMENT = 3
EXIT_DIVERGED = 4
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130

EXIT_CODES = {
    0: "success",
    EXIT_DRIFT: "--check found generated files that differ from their spec",
    EXIT_INVALID: "invalid input: usage, an unreadable or invalid spec, an error rule",
    EXIT_ENVIRONMENT: ("this environment cannot run the plan (missing package, GPU too old, no GPU), "
                       "or a requested feature did not take effect"),
    EXIT_DIVERGED: ("the loss diverged (train.on_nan): the message names the step and the last complete checkpoint; "
                    "or bench's held-out eval loss is further from its baseline's than --max-loss-gap"),
    EXIT_PREEMPTED: "preempted: a SIGTERM stopped every rank after a complete checkpoint; run the same command again to continue",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); what bench and tune measured is written",
}
"""Every exit code fp8launch chooses, with its meaning (the --help epilog, README and PRODUCT.md say the same)."""

ENTRYPOINT_CODES = (EXIT_INVALID, EXIT_ENVIRONMENT, EXIT_DIVERGED, EXIT_PREEMPTED)
"""The codes the training entrypoint chooses after printing its own one-line message (launcher/train/main.py)."""

EXIT_FILE_ENV = "FP8LAUNCH_EXIT_FILE"
"""The entrypoint writes its exit code to this file on a reported error (torchrun itself exits 1), where
`fp8launch run` and slurm.sbatch read it."""
ERROR_LINE_FILE_ENV = "FP8LAUNCH_ERROR_LINE_FILE"
"""`fp8launch run` sets it; the entrypoint writes its one-line error there too (the first rank to write wins): torchrun's
--tee writes each rank's output into files under train.output_dir, and a full disk there loses the line on its way."""


def os_error_text(e: OSError) -> str:
    """An OSError as one line: the path and the system's reason, with the fix where the reason says it
    (a full disk: the bytes still free there)."""
    import errno
    import os
    import shutil

    path = e.filename if isinstance(e.filename, str) else None
    what = f"{path}: {e.strerror or e}" if path else str(e.strerror or e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT) and path:
        folder = os.path.dirname(os.path.abspath(path))
        while folder and not os.path.exists(folder):
            folder = os.path.dirname(folder)
        try:
            free = f" ({shutil.disk_usage(folder).free:,} bytes free on {folder})"
        except OSError:
            free = ""
        return with_fix(what + free, "free space there, or write elsewhere")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return with_fix(what, "write to a folder you can write")
    return what


def with_fix(message: str, fix: str) -> str:
    """The one way a message names its fix: "what is wrong; fix: what to change"."""
    return f"{message.rstrip().rstrip('.;')}; fix: {fix}"


@dataclass(frozen=True, slots=True)
class Problem:
    """One located problem in a spec: `FILE:LINE: error: $.path: message`."""

    file: str
    message: str
    path: str = ""
    line: int | None = None
    rule: str | None = None
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        tag = f"{self.severity}[{self.rule}]" if self.rule else self.severity
        path = f"{self.path}: " if self.path and not self.rule else ""
        return f"{where}: {tag}: {path}{self.message}"


class LauncherError(Exception):
    """Base of every error fp8launch reports to a user without a traceback. The message is the text
    after the prefix: `str(error)` adds "error: " (or "error[RULE]: "), here and nowhere else."""

    exit_code = EXIT_INVALID
    label: str | None = "error"
    """The prefix; None for a message that is not an error (a preemption's clean stop)."""

    def __init__(self, message: str = "", *, rule: str | None = None, exit_code: int | None = None):
        self.message = message
        self.rule = rule
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(message)

    def __str__(self) -> str:
        if self.label is None:
            return self.message
        return f"{self.label}[{self.rule}]: {self.message}" if self.rule else f"{self.label}: {self.message}"


class SpecError(LauncherError):
    """A spec (or a --set override) is unreadable or invalid; carries every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __str__(self) -> str:
        return self.message  # each Problem line carries its own location and severity


class InputError(LauncherError):
    """A plan key names something this run cannot use (a missing file, a bad factory, ...)."""

    def __init__(self, key: str, message: str, fix: str):
        self.key = key
        self.detail = message
        self.fix = fix
        super().__init__(with_fix(f"{key}: {message}", fix))


class UsageError(LauncherError):
    """Bad command-line usage that Click itself cannot see."""


class SourceError(LauncherError):
    """`fp8launch import`: the config to import cannot be read, or is of no kind fp8launch knows (one line)."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {' '.join(message.split())}")


class EnvironmentProblem(LauncherError):
    """This machine cannot run the plan (missing package, GPU too old, no GPU)."""

    exit_code = EXIT_ENVIRONMENT

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message, rule=rule)


class BackendMissing(EnvironmentProblem):
    """An optional backend package is not importable."""

    def __init__(self, package: str, install: str):
        super().__init__(with_fix(f"the {package} package is not importable here", f"install it: {install}"), rule="BACKEND-MISSING")


class TrainingFailed(LauncherError):
    """A training run that fp8launch started (bench) ended with a non-zero code; that code is the exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message, exit_code=exit_code)
