"""MS-AMP (Azure/MS-AMP): FP8 GEMMs, FP8 weight gradients and communication, and (O2) FP8/FP16
optimizer states.

How MS-AMP is entered depends on the strategy (rules MSAMP-* stop the other combinations):
- ddp, O1/O2: `wrap_optimizer` does what `msamp.initialize(model, optimizer, opt_level)` does, with
  the optimizer built by us: MS-AMP's LinearReplacer (TeReplacer with use_te) swaps nn.Linear for
  its FP8Linear, then its LBAdamW (LBAdam for train.optimizer = "adam") with the opt level's state
  dtypes. msamp.initialize itself cannot take a current torch AdamW: AdamW subclasses Adam there
  (MS-AMP would build LBAdam, Adam with L2 decay) and its defaults carry decoupled_weight_decay,
  which LBAdam rejects (TypeError). The engine wraps with MS-AMP's DDP (importing msamp replaces
  torch.nn.parallel.DistributedDataParallel with its FP8DistributedDataParallel; `Precision.ddp_class`).
- deepspeed, O1/O2/O3: the engine calls `msamp.deepspeed.initialize(...)` with deepspeed.json's
  "msamp" and "optimizer" sections (`deepspeed_section`): DeepSpeed builds its FusedAdam (adam_w_mode
  from train.optimizer) and MS-AMP's engine turns it into its DSAdam (O3: its O2 plus the FP8 ZeRO
  optimizer). `wrap_optimizer` is the identity; call `recount` on the engine's module afterwards to
  report the real conversion.
Kept layers (keep, keep_first_last, dims) get `use_fp32_linear = True`, the attribute MS-AMP's
LinearReplacer honours (msamp/nn/linear.py). With use_te, MS-AMP converts TE modules instead
(msamp/te/replacer.py), so the Linears are swapped to te.Linear first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from typing import Any, Iterable

import torch
from torch import nn

from launcher.errors import BackendMissing, EnvironmentProblem, with_fix
from launcher.planning.install import INSTALL
from launcher.planning.rules import MSAMP_OWN_ENVIRONMENT, RULES_BY_ID, Facts, rule_error
from launcher.train.optim import param_groups

from . import select
from .amp import Precision, amp_settings
from .report import count

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


def initialize_here(plan: Plan) -> bool:
    """True when wrap_optimizer calls msamp.initialize; False when MS-AMP's DeepSpeed engine does."""
    return plan.distributed.strategy != "deepspeed"


def msamp_init_args(plan: Plan) -> dict:
    """Keyword arguments of msamp.initialize(model, optimizer, **args), the call `wrap_optimizer` does
    the work of (kept to check against the installed library's signature)."""
    m = plan.precision.msamp
    if m.opt_level not in ("O1", "O2"):
        raise rule_error("MSAMP-O3-STRATEGY", Facts(plan=plan))  # O3 goes through DeepSpeed, never msamp.initialize
    args = {"opt_level": m.opt_level}
    if m.use_te:  # the use_te argument exists from MS-AMP 0.3 on; older versions take three arguments
        args["use_te"] = True
    return args


STATE_DTYPES = {"O1": ("float32", "float32"), "O2": ("uint8", "float16")}
"""opt_level -> (exp_avg, exp_avg_sq) dtypes of MS-AMP's optimizer, as msamp.initialize sets them."""


def msamp_optimizer_args(plan: Plan) -> tuple[str, dict]:
    """(class name in msamp.optim, its keyword arguments) for the plan's optimizer at its opt level:
    LBAdamW (decoupled weight decay) for adamw, LBAdam for adam; betas and eps from train.adam_betas / adam_eps."""
    level = msamp_init_args(plan)["opt_level"]
    t = plan.train
    if t.optimizer not in ("adam", "adamw"):
        raise rule_error("MSAMP-OPTIMIZER", Facts(plan=plan))  # planning refuses it; a hand-edited plan.json could hold it
    exp_avg, exp_avg_sq = STATE_DTYPES[level]
    return ("LBAdamW" if t.optimizer == "adamw" else "LBAdam"), {
        "lr": t.lr, "betas": tuple(t.adam_betas), "eps": t.adam_eps, "weight_decay": t.weight_decay,
        "exp_avg_dtype": getattr(torch, exp_avg), "exp_avg_sq_dtype": getattr(torch, exp_avg_sq)}


def deepspeed_section(plan: Plan) -> dict:
    """deepspeed.json's "msamp" section (templates/deepspeed.json.j2 writes the same)."""
    m = plan.precision.msamp
    return {"enabled": True, "opt_level": m.opt_level, "use_te": m.use_te}


def mark_kept(model: nn.Module, reasons: dict[str, str | None]) -> int:
    """Set use_fp32_linear on every Linear that stays in high precision; returns how many."""
    n = 0
    for fqn, reason in reasons.items():
        if reason is not None:
            model.get_submodule(fqn).use_fp32_linear = True
            n += 1
    return n


def import_error(error: ImportError, strategy: str, opt_level: str | None = None) -> EnvironmentProblem:
    """What to say when importing MS-AMP failed: "not installed" only when it is not; an MS-AMP that is
    installed but cannot import next to this Transformer Engine / DeepSpeed says so with their versions
    (rule MSAMP-STACK, launcher/planning/stack.py), or with the import error itself when nothing visible explains it.
    With the spec's `opt_level`, the fix also names that level's native equivalent (launcher/planning/levels.py)."""
    from launcher.planning.msamp_levels import native_fix
    from launcher.planning.stack import importable, msamp_problem

    native = f", or use {native_fix(opt_level)}" if opt_level else ""
    if not importable("msamp"):
        return BackendMissing("msamp", INSTALL["msamp"] + native)
    problem = msamp_problem(strategy) or f"MS-AMP is installed but fails to import here: {type(error).__name__}: {error}."
    fix = MSAMP_OWN_ENVIRONMENT + native if native else RULES_BY_ID["MSAMP-STACK"].fix
    return EnvironmentProblem(with_fix(problem, fix), rule="MSAMP-STACK")


def _msamp(strategy: str, opt_level: str | None = None):
    try:
        import msamp
        from msamp.nn import ScalingParameter
    except ImportError as e:
        raise import_error(e, strategy, opt_level) from e
    return msamp, ScalingParameter


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class MsampPrecision(Precision):
    msamp: Any
    plan: Plan
    device: torch.device
    scaling_parameter: type | None = None
    te: Any = None
    te_recipe_obj: Any = None

    @contextlib.contextmanager
    def autocast(self):
        with super().autocast():
            if self.te is None:
                yield
            else:
                from .te import te_autocast

                with te_autocast(self.te, self.te_recipe_obj):
                    yield

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        """What msamp.initialize does for O1/O2 outside DeepSpeed, with our optimizer arguments:
        MS-AMP's replacer converts the Linears, then its LBAdamW / LBAdam steps the converted model's
        parameters (`optimizer`, the torch one the engine built, is dropped); then counts what it
        really converted."""
        if not initialize_here(self.plan):
            return model, optimizer
        from .checks import raise_run_errors

        replacer = self.msamp.te.TeReplacer if self.plan.precision.msamp.use_te else self.msamp.nn.LinearReplacer
        model = replacer.replace(model)
        name, kwargs = msamp_optimizer_args(self.plan)
        optimizer = getattr(self.msamp.optim, name)(param_groups(model.parameters(), self.plan.train), **kwargs)
        self.recount(model)
        raise_run_errors(self.plan, self.device, fp8_layers=self.report.fp8_layers)
        return model, optimizer

    def deepspeed(self):
        """MS-AMP's DeepSpeed integration (msamp.deepspeed): its initialize converts the model and builds its FP8
        optimizer (O3: its FP8 ZeRO optimizer) from deepspeed.json's "msamp" and "optimizer" sections."""
        if initialize_here(self.plan):
            return None
        try:
            from msamp import deepspeed
        except ImportError as e:
            raise import_error(e, "deepspeed", self.plan.precision.msamp.opt_level) from e
        return deepspeed

    def fp8_label(self, module: nn.Module) -> str | None:
        """MS-AMP's FP8 layers hold their weight as a ScalingParameter (before it converts: none)."""
        if self.scaling_parameter is None or not isinstance(getattr(module, "weight", None), self.scaling_parameter):
            return None
        return f"fp8 {self.plan.precision.msamp.opt_level}"

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        """MS-AMP's clip_grad_norm_ understands its FP8 (ScalingTensor) gradients."""
        return self.msamp.clip_grad_norm_(parameters, max_norm)


def apply_msamp(model: nn.Module, plan: Plan, device: torch.device, msamp=None, scaling_parameter=None, te=None,
                te_recipe=None) -> MsampPrecision:
    """Mark the kept Linears (and with use_te swap the others to te.Linear); MS-AMP itself converts
    later (wrap_optimizer, or inside DeepSpeed). The fakes are for tests only."""
    if msamp is None:
        msamp, scaling_parameter = _msamp(plan.distributed.strategy, plan.precision.msamp.opt_level)
    reasons = select.classify(model, plan)
    mark_kept(model, reasons)
    te_recipe_obj = None
    if plan.precision.msamp.use_te:
        from .te import _te, swap_modules, te_fp8_classes
        from .te_swap import swap_plan

        if te is None or te_recipe is None:
            te, te_recipe = _te()  # after `import msamp`: te.Linear is MS-AMP's MSAMPLinear now
        linear_only = dataclasses.replace(plan.precision.te, swap=("linear",))
        swap_modules(model, swap_plan(model, linear_only, plan), te, device=device)
        te_recipe_obj = te_recipe.DelayedScaling(fp8_format=te_recipe.Format.HYBRID)
        te_classes = te_fp8_classes(te)
        planned = lambda m: isinstance(m, te_classes)  # noqa: E731
    else:
        planned = lambda m: isinstance(m, nn.Linear) and not getattr(m, "use_fp32_linear", False)  # noqa: E731

    level, hp = plan.precision.msamp.opt_level, plan.precision.high_precision
    when = "when the optimizer is wrapped" if initialize_here(plan) else "inside DeepSpeed"
    report = count(model, backend="msamp", recipe=level, mode="fp8", high_precision=hp,
                   is_fp8=planned, reasons=reasons, note=f"planned: MS-AMP converts {when}")

    def recount(m: nn.Module):
        return count(m, backend="msamp", recipe=level, mode="fp8", high_precision=hp, reasons=reasons,
                     is_fp8=lambda x: isinstance(getattr(x, "weight", None), scaling_parameter))

    s = amp_settings(plan, device)
    return MsampPrecision(
        msamp=msamp, plan=plan, device=device, scaling_parameter=scaling_parameter, te=te if plan.precision.msamp.use_te else None,
        te_recipe_obj=te_recipe_obj, report=report, device_type=device.type, autocast_dtype=s["autocast_dtype"],
        param_dtype=None, grad_scaler=s["grad_scaler"], recounter=recount,
        # importing msamp replaced torch's DDP class with MS-AMP's FP8DistributedDataParallel
        ddp_class=torch.nn.parallel.DistributedDataParallel if plan.distributed.strategy == "ddp" else None,
    )
