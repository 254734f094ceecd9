"""The run-stage rules, checked inside the training with what only the run knows (the device, its compute
capability, how many layers the backend converted); the message and fix come from the rule table."""

from __future__ import annotations

import typing

import torch

from launcher.errors import EnvironmentProblem
from launcher.planning.rules import Facts, check

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


def capability(device: torch.device) -> tuple[int, int] | None:
    """CUDA compute capability of `device`; None on CPU (torchao FP8 runs there for real)."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


def raise_run_errors(plan: Plan, device: torch.device, **facts) -> None:
    """Check the run-stage rules with what is known now; raise the first error as
    EnvironmentProblem with its rule id (the message and fix come from the rule table)."""
    found = check(Facts(plan=plan, device=device.type, **facts), stage="run")
    for finding in found:
        if finding.is_error:
            raise EnvironmentProblem(finding.text, rule=finding.rule.id)
