"""The table of known-bad combinations, one module per domain, and the one registry built from them.

Each rule is data (core.Rule): an id, a severity, the stage it is checked at ("plan": from the spec alone; "run":
needs facts about the machine or the model), a condition, why it is bad (with its source), and the fix naming the
exact spec key to change. Each domain module holds its rules as RULES, with the predicates they use beside them
(predicates.py: those more than one domain asks). A new rule goes into its domain's RULES and its id at the end
of ORDER; an id defined twice, or a rule missing from ORDER, fails at import.
"""

from __future__ import annotations

from types import MappingProxyType, ModuleType
from typing import Iterable, Mapping

from launcher.planning.rules import (
    context,
    engines,
    hardware_speed,
    launch,
    levels,
    moe,
    msamp,
    parallelism,
    pipeline,
    precision,
    schedule,
    selection,
    te,
)
from launcher.planning.rules.core import Facts, Finding, Rule, findings
from launcher.planning.rules.msamp import MSAMP_OWN_ENVIRONMENT
from launcher.planning.rules.precision import backend_missing_fix

__all__ = ["RULES", "RULES_BY_ID", "MSAMP_OWN_ENVIRONMENT", "Facts", "Finding", "Rule", "backend_missing_fix", "check",
           "rule_error"]

DOMAINS: tuple[ModuleType, ...] = (precision, moe, te, msamp, engines, parallelism, launch, hardware_speed, selection, schedule,
                                   levels, pipeline, context)

ORDER: tuple[str, ...] = (
    "FP8-DDP-COMPILE", "FP8-ALLGATHER-STRATEGY", "FP8-ALLGATHER-RECIPE", "MOE-ROUTER-FP8", "MOE-ROWWISE-CPU", "MOE-ROWWISE-HARDWARE",
    "MOE-EXPERTS-HP", "MOE-ALLGATHER-EXPERTS", "FP8-NO-COMPILE", "FP8-AC-COMPILE-SLOW", "TE-DELAYED-COMPILE", "TE-BLOCK-FP8-ATTENTION",
    "TE-REMOVED-KEY", "TE-RECIPE-HARDWARE", "MSAMP-FSDP2", "MSAMP-ZERO3", "MSAMP-O3-STRATEGY", "MSAMP-OPTIMIZER", "FP16-BF16-BOTH",
    "BATCH-MISMATCH", "EP-DIVIDES-WORLD", "EP-DIVIDES-EXPERTS", "EP-DENSE-MODEL", "EP-STRATEGY", "EP-TENSOR-PARALLEL",
    "SECTION-UNUSED", "EVAL-NOT-HELD-OUT", "DS-OFFLOAD-PARAM-STAGE", "DS-ON-NAN-SKIP", "CPU-BACKEND", "ACCELERATE-UNSUPPORTED",
    "FP8-HARDWARE", "FP8-NOT-APPLIED", "BACKEND-MISSING", "MEMORY-EXCEEDS-GPU",
    "TP-DIVIDES-PROCS", "TP-HEADS", "TP-SEQ-LEN", "TP-STRATEGY", "TP-MODEL", "TP-BACKEND", "TP-ROWWISE-BF16-COMM", "TP-COMPILE-CPU",
    "TP-ASYNC-COMPILE", "TP-ASYNC-CPU", "TP-ASYNC-NO-TP",
    "FP8-NO-GAIN",
    "K8S-IMAGE-MISSING", "K8S-NO-SHARED-OUTPUT", "K8S-RESERVED-ENV", "K8S-GPUS-FEWER",
    "DS-NVME-PATH", "DS-NVME-STAGE", "DS-OFFLOAD-STAGE0", "DS-NVME-AIO", "DS-FP16-CPU", "DS-ZERO3-COMPILE", "FULLGRAPH-TE",
    "FULLGRAPH-MONITOR", "TE-TOKENS-DIV8", "TE-FP8-PARAMS-DEEPSPEED", "FP8-PRECOMPUTE-OFFLOAD", "MONITOR-NO-FP8", "MSAMP-UNMAINTAINED",
    "EFFECT-MISSING", "MSAMP-STACK",
    "TORCHAO-BLOCK-HARDWARE", "TORCHAO-NVFP4-CPU", "TORCHAO-BLOCK-TOKENS", "TORCHAO-BLOCK-PAD", "TORCHAO-BLOCK-DEEPSPEED",
    "TORCHAO-BLOCK-TP", "LAUNCH-GPU-PRECISION", "PRECISION-RULE-RECIPE", "PRECISION-RULE-MODE", "FP8-NONE-SELECTED",
    "PRECISION-KEEP-UNMATCHED", "PRECISION-RULE-UNMATCHED", "SCHEDULE-STEPS", "SCHEDULE-DIRECTION", "SCHEDULE-SUPPORT", "MONITOR-BLOCK",
    "TORCHAO-MX-TORCH",
    "TE-AC-COMPILE", "TE-FP8-ATTENTION-MODEL", "TE-FP8-MHA", "TE-FP8-DPA-BACKEND", "TE-FP8-DPA-GPU", "TE-FP8-PARAMS-OPTIMIZER",
    "TE-FP8-PARAMS-FSDP2-BLOCK", "TE-FP8-PARAMS-DEEPSPEED-FP32",
    "OPTIMIZER-STATES-SGD", "MASTER-WEIGHTS-OPTIMIZER", "MASTER-WEIGHTS-COMPUTE", "LEVELS-DEEPSPEED", "GRAD-REDUCE-DEEPSPEED",
    "GRAD-REDUCE-FSDP2-FP32", "LEVELS-BACKEND",
    "PP-DIVIDES-WORLD", "PP-LAYERS", "PP-MICROBATCHES", "PP-STRATEGY", "PP-MODEL", "PP-BACKEND",
    "PP-PRECISION-SCHEDULE", "PP-FP16", "PP-GRAD-REDUCE", "PP-MONITOR", "PP-EXPERT-PARALLEL",
    "CP-DIVIDES-WORLD", "CP-SEQ", "CP-STRATEGY", "CP-MODEL", "CP-PIPELINE", "CP-TENSOR-PARALLEL", "CP-EXPERT-PARALLEL", "CP-BACKEND",
    "CP-COMPILE", "PP-STAGES-PER-RANK", "PP-ZBV-COMPILE", "PP-ZBV-RESHARD", "PP-ZBV-EVAL",
    "MEMORY-EXCEEDS-HOST",
)
"""The order `fp8launch explain` lists the rules in, and findings of one severity print in: the order they were added
in, so that the listing and every plan's output stay as they were when the table was split by domain. New ids go last."""


def registry(domains: Iterable[ModuleType], order: Iterable[str]) -> tuple[tuple[Rule, ...], Mapping[str, Rule]]:
    """Every domain's rules in `order`, and the same by id. Refuses an id defined twice (in one domain or in two) and an
    id missing from `order` or named there without a rule."""
    where: dict[str, str] = {}
    by_id: dict[str, Rule] = {}
    for module in domains:
        for rule in module.RULES:
            if rule.id in by_id:
                raise ValueError(f"rule id {rule.id} is defined twice: in {where[rule.id]} and in {module.__name__}")
            where[rule.id], by_id[rule.id] = module.__name__, rule
    order = tuple(order)
    if len(set(order)) != len(order):
        raise ValueError(f"ORDER names {next(i for i in order if order.count(i) > 1)} twice")
    if set(order) != set(by_id):
        unlisted, unknown = sorted(set(by_id) - set(order)), sorted(set(order) - set(by_id))
        raise ValueError(f"rules not in ORDER (append them): {unlisted}; ORDER ids no domain defines: {unknown}")
    rules = tuple(by_id[i] for i in order)
    return rules, MappingProxyType({r.id: r for r in rules})


RULES, RULES_BY_ID = registry(DOMAINS, ORDER)


def check(facts: Facts, stage: str = "plan") -> list[Finding]:
    """Every rule of `stage` whose condition holds for `facts`, errors first. With a `[[precision.schedule]]`, the
    error rules also hold each later phase's precision to account (e.g. a phase that turns FP8 on where it cannot run)."""
    return findings(RULES, facts, stage)


def rule_error(rule_id: str, facts: Facts | None = None):
    """The error a rule reports (message and fix from this table), for a run-time guard that meets the
    rule's condition where the rule check itself cannot be called. Plan-stage rules exit 2, run-stage 3."""
    return RULES_BY_ID[rule_id].error(facts)
