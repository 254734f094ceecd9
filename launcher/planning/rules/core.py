"""What a rule is, what it is checked against, what it finds, and how a plan is checked against a table of rules
(launcher/planning/rules/__init__.py runs it over the registry it builds from the domain modules: check, rule_error)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Callable, Iterable

from launcher.errors import EnvironmentProblem, LauncherError, with_fix

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


@dataclass(frozen=True, kw_only=True, slots=True)
class Facts:
    """What is known when rules are checked. Planning knows only the plan; a run adds the machine."""

    plan: Plan
    rendered: dict[str, str] = field(default_factory=dict)
    """Generated files by name (checked after rendering, e.g. deepspeed.json)."""
    device: str | None = None
    """cuda | cpu, once resolved at run time."""
    capability: tuple[int, int] | None = None
    """CUDA compute capability of the GPU, at run time."""
    missing_package: str | None = None
    """The backend package that failed to import, at run time."""
    fp8_layers: int | None = None
    """Linear layers converted to FP8, at run time."""
    kept: tuple[str, ...] = ()
    """Why each Linear the run keeps in high precision was kept (one reason per layer), at run time."""
    foreign_matmuls: tuple[str, ...] = ()
    """Type names of the model's weight-matrix layers that are not nn.Linear (no backend converts them), at run time."""
    prediction: typing.Any = None
    """The speed prediction (launcher.planning.predict.Prediction) when planning made one."""
    spec_folder: str | None = None
    """The spec file's folder, absolute, where planning knows it (an hf: model's relative path is read from there)."""
    msamp_stack: str | None = None
    """Why the installed MS-AMP cannot run next to the installed packages (launcher.planning.stack), at run time."""
    libaio: bool | None = None
    """Whether libaio (DeepSpeed's NVMe offload) is on this machine, at run time; None: not looked."""
    missing_effects: tuple[str, ...] = ()
    """Features the spec asks for that the run's setup did not take (launcher/train/effects.py), at run time."""
    torchao_mx_supported: bool | None = None
    """Whether the installed torch has what torchao's MXFP8 training asserts, at run time; None: not looked."""
    host_memory: int | None = None
    """Bytes of memory this machine has available (MemAvailable) for a CPU run whose ranks all run on it, at run time;
    None: not looked (a GPU run, several nodes, not launched here)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    id: str
    severity: str
    """error | warning"""
    stage: str
    """plan | run"""
    when: str
    """The condition in words (for `fp8launch explain`)."""
    why: str
    fix: str
    condition: Callable[[Facts], bool] = field(repr=False)
    detail: Callable[[Facts], str] | None = field(default=None, repr=False)
    """Optional: a message specific to these facts (else `why`)."""
    fix_for: Callable[[Facts], str] | None = field(default=None, repr=False)
    """Optional: the fix for these facts, naming only what would change something; "" for the rule's own `fix`."""

    def fix_of(self, facts: Facts | None) -> str:
        return (self.fix_for(facts) if self.fix_for and facts is not None else "") or self.fix

    def error(self, facts: Facts | None = None) -> LauncherError:
        """The error this rule reports (its message and fix), for a run-time guard that meets the rule's condition where
        the rule check itself cannot be called. Plan-stage rules exit 2, run-stage 3."""
        message = self.detail(facts) if self.detail and facts is not None else self.why
        fix = self.fix_of(facts)
        if self.stage == "run":
            return EnvironmentProblem(with_fix(message, fix), rule=self.id)
        return LauncherError(with_fix(message, fix), rule=self.id)


@dataclass(frozen=True, slots=True)
class Finding:
    rule: Rule
    message: str
    fix: str = ""
    """The fix for these facts (the rule's own when empty)."""

    @property
    def is_error(self) -> bool:
        return self.rule.severity == "error"

    def __str__(self) -> str:
        return f"{self.rule.severity}[{self.rule.id}]: {self.text}"

    @property
    def text(self) -> str:
        """The message and the rule's fix, as every error line says them."""
        return with_fix(self.message, self.fix or self.rule.fix)


def findings(rules: Iterable[Rule], facts: Facts, stage: str = "plan") -> list[Finding]:
    """Every rule of `stage` among `rules` whose condition holds for `facts`, errors first. With a `[[precision.schedule]]`,
    the error rules also hold each later phase's precision to account (e.g. a phase that turns FP8 on where it cannot run)."""
    rules = tuple(rules)
    found = [Finding(r, r.detail(facts) if r.detail else r.why, r.fix_of(facts))
             for r in rules if r.stage == stage and r.condition(facts)]
    seen = {f.rule.id for f in found}
    if facts.plan.precision.schedule:
        from launcher.planning.schedule import phases

        for phase in phases(facts.plan)[1:]:
            later = dataclasses.replace(facts, plan=phase.plan, prediction=None)
            for r in rules:
                if (r.stage == stage and r.severity == "error" and r.id not in seen and not r.id.startswith("SCHEDULE-")
                        and r.condition(later)):
                    seen.add(r.id)
                    found.append(Finding(r, f"in the precision phase from step {phase.first_step}: "
                                            + (r.detail(later) if r.detail else r.why), r.fix_of(later)))
    return sorted(found, key=lambda f: not f.is_error)
