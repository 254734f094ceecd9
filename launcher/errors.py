"""The one hierarchy of errors a user sees. The CLI turns them into messages and exit codes."""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_DRIFT = 1
EXIT_INVALID = 2
EXIT_ENVIRONMENT = 3


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


class UsageError(LauncherError):
    """Bad command-line usage that Click itself cannot see."""


class EnvironmentProblem(LauncherError):
    """This machine cannot run the plan (missing package, GPU too old, no GPU)."""

    exit_code = EXIT_ENVIRONMENT

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message, rule=rule)


class BackendMissing(EnvironmentProblem):
    """An optional backend package is not importable."""

    def __init__(self, package: str, install: str):
        super().__init__(f"the {package} package is not importable here; install it: {install}", rule="BACKEND-MISSING")


class TrainingFailed(LauncherError):
    """A training run that fp8launch started (bench) ended with a non-zero code; that code is the exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message, exit_code=exit_code)
