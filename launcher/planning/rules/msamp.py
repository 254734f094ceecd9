"""MS-AMP 0.4: what its integrations support, the stack it needs, and the native levels (launcher/planning/levels.py)
each refusal offers instead."""

from __future__ import annotations

from launcher.planning.backends import MSAMP
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import fp8, strategy

MSAMP_OWN_ENVIRONMENT = ("run MS-AMP in its own environment (torch 2.1-2.2, Transformer Engine 1.1-1.7, DeepSpeed 0.13.1: "
                         "its Docker image ghcr.io/azure/msamp)")
"""Where MS-AMP 0.4 still runs (rule MSAMP-STACK)."""


def msamp_level_fix(f: Facts, first: str) -> str:
    """`first`, or MS-AMP's opt level natively (launcher/planning/levels.py)."""
    from launcher.planning.msamp_levels import native_fix

    return f"{first}, or use {native_fix(f.plan.precision.msamp.opt_level)}"


RULES: tuple[Rule, ...] = (
    Rule(id="MSAMP-FSDP2", severity="error", stage="plan",
         when="msamp + strategy fsdp2",
         why="MS-AMP supports FSDP1 only, not FSDP2.",
         fix='set distributed.strategy = "ddp" or "deepspeed"',
         condition=lambda f: fp8(f, MSAMP) and strategy(f) == "fsdp2"),
    Rule(id="MSAMP-ZERO3", severity="error", stage="plan",
         when="msamp + deepspeed zero_stage 3",
         why="MS-AMP asserts ZeRO stage 1 or 2 (MS-AMP#182, #130).",
         fix="set distributed.deepspeed.zero_stage = 2",
         condition=lambda f: fp8(f, MSAMP) and strategy(f) == "deepspeed" and f.plan.distributed.deepspeed.zero_stage == 3),
    Rule(id="MSAMP-O3-STRATEGY", severity="error", stage="plan",
         when="msamp opt_level O3 + strategy != deepspeed",
         why="MS-AMP's O3 exists only through its DeepSpeed integration (FP8 ZeRO optimizer).",
         fix='set distributed.strategy = "deepspeed", or precision.msamp.opt_level = "O2"',
         condition=lambda f: fp8(f, MSAMP) and f.plan.precision.msamp.opt_level == "O3" and strategy(f) != "deepspeed"),
    Rule(id="MSAMP-OPTIMIZER", severity="error", stage="plan",
         when="msamp + optimizer not adam/adamw",
         why="msamp.initialize accepts only Adam and AdamW optimizers.",
         fix='set train.optimizer = "adamw"',
         condition=lambda f: fp8(f, MSAMP) and f.plan.train.optimizer not in ("adam", "adamw")),
    Rule(id="MSAMP-UNMAINTAINED", severity="warning", stage="plan",
         when="backend msamp",
         why="MS-AMP's last release is 0.4.0 (2024-02); it needs Transformer Engine <= 1.7 and, through DeepSpeed, DeepSpeed 0.13 "
             "(it pins 0.13.1), and Accelerate marks it deprecated. Plan for torchao or Transformer Engine.",
         fix='set precision.backend = "torchao" (or "te")',
         condition=lambda f: fp8(f, MSAMP),
         fix_for=lambda f: msamp_level_fix(f, 'set precision.backend = "te"')),
    Rule(id="MSAMP-STACK", severity="error", stage="run",
         when="MS-AMP is installed next to packages it cannot run with (Transformer Engine >= 1.8, or DeepSpeed > 0.13 for its "
              "DeepSpeed integration, or neither installed)",
         why="MS-AMP 0.4 imports transformer_engine_extensions (renamed transformer_engine_torch in TE 1.8) and, for DeepSpeed, "
             "AMP from deepspeed.runtime.engine (removed after DeepSpeed 0.13).",
         fix=MSAMP_OWN_ENVIRONMENT + ', or set precision.backend = "torchao" (or "te")',
         condition=lambda f: fp8(f, MSAMP) and f.msamp_stack is not None,
         detail=lambda f: f.msamp_stack,
         fix_for=lambda f: msamp_level_fix(f, MSAMP_OWN_ENVIRONMENT)),
)
