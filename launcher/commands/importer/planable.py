"""Make an imported spec plan: plan it exactly as `fp8launch plan` would; where a rule refuses the literal
translation, move to the nearest setting that plans and report the entry as approximated, naming the rule.

Each fix is a record: the rule it answers and the spec keys it changes, given the draft (so it can read what
the spec holds); FIXES' order is the order of preference, one move per planning round. A fix that moves a number
(a sequence length, a degree, a placeholder's model or world size) is a Nearest: it proposes candidate values, nearest
first, and the rule itself (its condition, through probe.firing) says which is the first that no longer fires it and
makes no other rule fire that did not: no second copy of the rules' arithmetic here, and two interacting rules (MXFP8's
token blocks and context parallel's 2 x cp chunks) meet at the nearest value both accept. A placeholder (the model,
the world size) moves before any degree the source states. A rule with no fix here stops the import with the
planner's own message.

Warnings the import can answer without changing what the source asked for (a placeholder world too small for the
model's memory) are answered the same way, so that the spec also plans with `--strict`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from launcher.errors import SpecError
from launcher.planning.rules import RULES_BY_ID

from . import placeholders, probe
from .draft import Draft
from .report import shown

MAX_ROUNDS = 16


@dataclass(frozen=True, slots=True)
class Fix:
    rule: str
    change: Callable[[Draft], list[tuple]]
    """(spec key, new value) pairs, each refused by the rule; or (spec key, new value, note) for a key set along with them,
    which the rule did not refuse (the note says why); [] when this fix cannot help any more."""


@dataclass(frozen=True, slots=True)
class Nearest:
    """The fix of a rule that a number (or a placeholder) decides: for each (spec key, candidates) in order, the candidate
    values nearest first; the first one the rule's own condition accepts, with no rule firing that did not fire before,
    is the move (else the first the rule accepts). [] when no candidate stops the rule."""

    rule: str
    keys: tuple[tuple[str, Callable[[Draft], Iterable[Any]]], ...]

    def change(self, d: Draft) -> list[tuple]:
        folder = d.folder or os.path.dirname(os.path.abspath(d.path))
        now = probe.firing(d.spec, folder) or {}
        if self.rule not in now:  # nothing to answer: a fix that changes nothing is no fix
            return []
        errors_now = {r for r, sev in now.items() if sev == "error"}
        fallback = None
        for key, candidates in self.keys:
            held = None
            for value in candidates(d):
                if value == probe.value_of(d.spec, key):
                    continue
                fired = probe.firing(probe.with_value(d.spec, key, value), folder)
                if fired is None or self.rule in fired:
                    continue
                new = {r for r, sev in fired.items() if sev == "error"} - errors_now
                if not new:
                    return [(key, value)]
                if key in PLACEHOLDER_KEYS and held is None and not new & placeholders.MODEL_RULES:
                    held = (key, value)
                fallback = fallback or (key, value)
            if held:  # a placeholder that holds the source's degrees moves before any of them is lowered: what else it
                return [held]  # trips is a rule about the source's own settings, answered in its turn
        return [fallback] if fallback else []


def seq_ladder(d: Draft) -> list[int]:
    """train.seq_len rounded up to multiples of 2, 4, ..., 4096, nearest first: the rules decide which one holds."""
    seq = int(d.used("train.seq_len"))
    return sorted({m * math.ceil(seq / m) for m in (2 ** i for i in range(1, 13))} - {seq})


def lower(key: str) -> Callable[[Draft], list[int]]:
    """The degree at `key` lowered, nearest first (its divisors, then the rest): only where no placeholder can move instead."""
    def candidates(d: Draft) -> list[int]:
        n = int(d.value(key, 1) or 1)
        return sorted((k for k in range(1, n) if n % k == 0), reverse=True) + sorted((k for k in range(2, n) if n % k), reverse=True)
    return candidates


def _model(d: Draft) -> list[str]:
    return placeholders.model_candidates(d)


PLACEHOLDER_MODEL = (placeholders.MODEL, _model)
PLACEHOLDER_WORLD = (probe.WORLD, placeholders.world_candidates)
PLACEHOLDER_KEYS = (placeholders.MODEL, probe.WORLD)


@dataclass(frozen=True, slots=True)
class First:
    """The first of several fixes of one rule that moves anything (a placeholder before a degree the source states)."""

    rule: str
    fixes: tuple

    def change(self, d: Draft) -> list[tuple]:
        if self.rule not in (probe.firing(d.spec, d.folder or os.path.dirname(os.path.abspath(d.path))) or {}):
            return []
        return next((c for f in self.fixes if (c := f.change(d))), [])


def _v(d: Draft, key: str, default: Any) -> Any:
    return d.value(key, default)


def _no_tp(d: Draft) -> list[tuple[str, Any]]:
    return [("distributed.tensor_parallel", 1)] + ([("distributed.async_tp", False)] if _v(d, "distributed.async_tp", False) else [])


def _off(key: str) -> Callable[[Draft], list[tuple[str, Any]]]:
    """Pipeline or context parallelism (`key`) off: its ranks become data-parallel ranks (the batch entries say what that
    does to the global batch: a fixed one is kept, a per-rank one grows by their number)."""
    def change(d: Draft) -> list[tuple[str, Any]]:
        n = _v(d, key, 1)
        if n <= 1:
            return []
        d.split_batch(n, f"{key.rsplit('.', 1)[1]} {n}")
        return [(key, 1)]
    return change


_no_cp = _off("distributed.context_parallel")


def _no_pp(d: Draft) -> list[tuple[str, Any]]:
    """No pipeline, and none of its virtual stages (a source's several stages a rank: their entry goes with it)."""
    changes = _off("distributed.pipeline_parallel")(d)
    if changes and _v(d, "distributed.pipeline.stages_per_rank", 0):
        changes += [("distributed.pipeline.schedule", "1F1B"), ("distributed.pipeline.stages_per_rank", 0)]
    return changes


def _pp_shape(d: Draft):
    from launcher.planning.layout import stages_a_rank
    from launcher.planning.models import builtin_config

    cfg, pp = builtin_config(str(_v(d, "train.model", ""))), _v(d, "distributed.pipeline_parallel", 1)
    return cfg, pp, stages_a_rank(_v(d, "distributed.pipeline.schedule", "1F1B"), _v(d, "distributed.pipeline.stages_per_rank", 0))


def _pp_split(d: Draft) -> list[tuple[str, Any]]:
    """The blocks split over the stages as evenly as they go (the first stages one more): every stage the source states kept."""
    from launcher.planning.plan import even_split

    cfg, pp, per_rank = _pp_shape(d)
    if cfg is None or cfg.n_layers < pp * per_rank or _v(d, "distributed.pipeline.layers_per_stage", []):
        return []
    return [("distributed.pipeline.layers_per_stage", list(even_split(cfg.n_layers, pp * per_rank)))]


def _pp_fewer_stages(d: Draft) -> list[tuple[str, Any]]:
    """A model (the source's own: a placeholder moves instead, see FIXES) with fewer blocks than the stages: fewer stages a
    rank, then one (1F1B)."""
    cfg, pp, per_rank = _pp_shape(d)
    if placeholders.MODEL in d.placeholders or cfg is None or not (per_rank > 1 and pp <= cfg.n_layers < pp * per_rank):
        return []
    fewer = cfg.n_layers // pp  # ZBV's 2 never get here with fewer >= 2
    return ([("distributed.pipeline.stages_per_rank", fewer)] if fewer >= 2 else
            [("distributed.pipeline.schedule", "1F1B"), ("distributed.pipeline.stages_per_rank", 0)])


def _pp_microbatches(d: Draft) -> list[tuple[str, Any]]:
    """One sequence per pipeline micro-batch (microbatches = 0), or no pipeline where a rank's step has fewer sequences."""
    if _v(d, "distributed.pipeline.microbatches", 0):
        return [("distributed.pipeline.microbatches", 0)]
    return _no_pp(d)


def _to_fsdp2(d: Draft) -> list[tuple]:
    """The strategy FSDP2; DeepSpeed's CPU / NVMe offload (of parameters or optimizer states) carried over as FSDP2's CPU
    offload (parameters, gradients and the optimizer step on the CPU), which holds at least as little on the GPU."""
    changes: list[tuple] = [("distributed.strategy", "fsdp2")]
    keys = (f"distributed.deepspeed.offload_{what}" for what in ("param", "optimizer"))
    offloaded = [f"{key} = {where!r}" for key in keys if (where := _v(d, key, "none")) != "none"]
    if d.used("distributed.strategy") == "deepspeed" and offloaded and not _v(d, "distributed.fsdp2.cpu_offload", False):
        changes.append(("distributed.fsdp2.cpu_offload", True,
                        f"DeepSpeed's offload ({', '.join(offloaded)}) carried to FSDP2 as its CPU offload (parameters, "
                        "gradients and the optimizer step on the CPU)"))
    return changes


FIXES = {f.rule: f for f in (
    # compile vs a recipe: keep the numerics the source asked for, give up compile
    Fix("TE-DELAYED-COMPILE", lambda d: [("compile.enabled", False)]),
    Fix("FP8-DDP-COMPILE", lambda d: [("compile.enabled", False)]),
    Fix("FULLGRAPH-TE", lambda d: [("compile.fullgraph", False)]),
    Fix("FULLGRAPH-MONITOR", lambda d: [("compile.fullgraph", False)]),
    Fix("DS-ZERO3-COMPILE", lambda d: [("compile.enabled", False)]),
    Fix("TP-ASYNC-COMPILE", lambda d: [("distributed.async_tp", False)]),
    Fix("TP-ASYNC-CPU", lambda d: [("distributed.async_tp", False)]),
    # torchao float8 all-gather: an FSDP2 + tensorwise feature
    Fix("FP8-ALLGATHER-STRATEGY", lambda d: [("precision.torchao.fsdp_float8_all_gather", False)]),
    Fix("FP8-ALLGATHER-RECIPE", lambda d: [("precision.torchao.fsdp_float8_all_gather", False)]),
    Fix("FP8-PRECOMPUTE-OFFLOAD", lambda d: [("precision.torchao.precompute_scale", False)]),
    Fix("TORCHAO-BLOCK-PAD", lambda d: [("precision.torchao.pad_inner_dim", False)]),
    # Transformer Engine
    Fix("TE-FP8-PARAMS-DEEPSPEED", lambda d: [("precision.te.fp8_params", False)]),
    Fix("TE-BLOCK-FP8-ATTENTION", lambda d: [("precision.te.fp8_dpa", False), ("precision.te.fp8_mha", False)]),
    Nearest("TE-TOKENS-DIV8", (("train.seq_len", seq_ladder),)),
    Nearest("TORCHAO-BLOCK-TOKENS", (("train.seq_len", seq_ladder),)),
    Fix("CPU-BACKEND", lambda d: [("launch.device", "auto")]),
    # MS-AMP
    Fix("MSAMP-FSDP2", lambda d: [("distributed.strategy", "ddp")]),
    Fix("MSAMP-ZERO3", lambda d: [("distributed.deepspeed.zero_stage", 2)]),
    Fix("MSAMP-O3-STRATEGY", lambda d: [("precision.msamp.opt_level", "O2")]),
    Fix("MSAMP-OPTIMIZER", lambda d: [("train.optimizer", "adamw")]),
    # parallelism fp8launch runs only in some combinations
    Fix("TP-BACKEND", lambda d: _no_tp(d)),
    Fix("TP-MODEL", lambda d: _no_tp(d)),
    Nearest("TP-DIVIDES-PROCS", (("distributed.tensor_parallel", lower("distributed.tensor_parallel")),)),
    Nearest("TP-HEADS", (PLACEHOLDER_MODEL, ("distributed.tensor_parallel", lower("distributed.tensor_parallel")))),
    Nearest("TP-SEQ-LEN", (("train.seq_len", seq_ladder), ("distributed.tensor_parallel", lower("distributed.tensor_parallel")))),
    Fix("TORCHAO-BLOCK-TP", lambda d: _no_tp(d)),
    Fix("TP-COMPILE-CPU", lambda d: [("compile.enabled", False)]),
    Nearest("EP-DENSE-MODEL", (PLACEHOLDER_MODEL, ("distributed.expert_parallel", lambda d: [1]))),
    Fix("EP-TENSOR-PARALLEL", lambda d: _no_tp(d)),
    Nearest("EP-DIVIDES-WORLD", (("distributed.expert_parallel", lower("distributed.expert_parallel")),)),
    Nearest("EP-DIVIDES-EXPERTS", (PLACEHOLDER_MODEL, ("distributed.expert_parallel", lower("distributed.expert_parallel")))),
    # pipeline parallel: its layout first, then off where fp8launch does not compose it (its ranks become data-parallel)
    Fix("PP-MICROBATCHES", _pp_microbatches),
    # the blocks split over the stages; a placeholder model with blocks enough for them (never fewer stages to fit a
    # placeholder); the source's own model: fewer stages a rank; else no pipeline
    First("PP-LAYERS", (Fix("PP-LAYERS", _pp_split), Nearest("PP-LAYERS", (PLACEHOLDER_MODEL,)), Fix("PP-LAYERS", _pp_fewer_stages),
                        Fix("PP-LAYERS", _no_pp))),
    *(Fix(rule, _no_pp) for rule in ("PP-DIVIDES-WORLD", "PP-MODEL", "PP-EXPERT-PARALLEL", "PP-BACKEND",
                                     "PP-PRECISION-SCHEDULE", "PP-FP16", "PP-GRAD-REDUCE", "PP-MONITOR")),
    # context parallel: off where fp8launch does not compose it (its ranks become data-parallel), then what it needs of the
    # rest of the spec where it stays
    *(Fix(rule, _no_cp) for rule in ("CP-DIVIDES-WORLD", "CP-MODEL", "CP-PIPELINE", "CP-TENSOR-PARALLEL", "CP-EXPERT-PARALLEL",
                                     "CP-BACKEND")),
    Nearest("CP-SEQ", (("train.seq_len", seq_ladder),)),
    Fix("CP-COMPILE", lambda d: [("compile.enabled", False)]),
    Fix("PP-ZBV-RESHARD", lambda d: [("distributed.fsdp2.reshard_after_forward", False)]),
    *(Fix(rule, lambda d: [("distributed.pipeline.schedule", "Interleaved1F1B")]) for rule in ("PP-ZBV-COMPILE", "PP-ZBV-EVAL")),
    Fix("PP-STAGES-PER-RANK", lambda d: [("distributed.pipeline.stages_per_rank", 0)]),
    # a strategy change last: the moves above may have made it moot
    *(Fix(rule, _to_fsdp2) for rule in ("TP-STRATEGY", "PP-STRATEGY", "EP-STRATEGY", "CP-STRATEGY")),
    Fix("FP8-PRECOMPUTE-OFFLOAD", lambda d: [("precision.torchao.precompute_scale", False)]),
    # DeepSpeed offload
    Fix("DS-OFFLOAD-PARAM-STAGE", lambda d: [("distributed.deepspeed.offload_param", "none")]),
    Fix("DS-OFFLOAD-STAGE0", lambda d: [("distributed.deepspeed.offload_optimizer", "none")]),
    Fix("DS-NVME-STAGE", lambda d: [("distributed.deepspeed.offload_optimizer", "cpu")]),
    Fix("DS-NVME-PATH", lambda d: [(k, "cpu") for k in ("distributed.deepspeed.offload_optimizer", "distributed.deepspeed.offload_param")
                                   if _v(d, k, "none") == "nvme"]),
    Fix("DS-ON-NAN-SKIP", lambda d: [("train.on_nan", "stop")]),
    Fix("LEVELS-DEEPSPEED", lambda d: [(k, "fp32") for k in ("precision.optimizer_states", "precision.master_weights")
                                       if _v(d, k, "fp32") != "fp32"]),
    # a model whose every Linear the selection keeps
    Fix("FP8-NONE-SELECTED", lambda d: [("precision.torchao.skip_small", False)] if _v(d, "precision.torchao.skip_small", True)
        else [("precision.keep_first_last", False)] if _v(d, "precision.keep_first_last", True) else []),
)}


WARNING_FIXES = {f.rule: f for f in (
    # a placeholder world too small for the model states: more data-parallel ranks (the source's degrees kept)
    Nearest("MEMORY-EXCEEDS-GPU", (PLACEHOLDER_WORLD,)),
)}
"""Warnings the import answers by moving a placeholder only: the source's own settings stay as they are."""


def settle(draft: Draft, render: Callable[[Draft], str], folder: str, label: str) -> str:
    """The spec's text once it plans: render, plan in `folder` (a temporary file beside where it will be written, so relative
    paths resolve as they will), fix what a rule refuses, again; then answer the warnings a placeholder can answer
    (WARNING_FIXES). Raises SpecError (its problems naming `label`) when a refusal has no fix."""
    from launcher.commands.plan import plan_one

    draft.folder = folder
    tmp = os.path.join(folder, f".fp8launch-import.{os.getpid()}.tmp.toml")
    refused: list = []
    for _ in range(MAX_ROUNDS):
        draft.finish()
        text = render(draft)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            planned = plan_one(tmp, out_dir=os.path.join(folder, "generated"))
        except SpecError as e:
            refused = [dataclasses.replace(p, file=label) for p in e.problems if p.severity == "error"]
            if not apply_fixes(draft, [p.rule for p in refused]):
                raise SpecError(refused) from None
            continue
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        warned = [w.rule.id for w in planned.warnings if w.rule.id in WARNING_FIXES]
        if not warned or not apply_fixes(draft, warned, WARNING_FIXES):
            return text
    if refused:
        raise SpecError(refused)
    return text


def apply_fixes(draft: Draft, rules: list[str | None], fixes: dict = FIXES) -> bool:
    """Apply the fix of the first refused rule in `fixes`' order (one move at a time: a later refusal may be gone after it,
    e.g. TP-STRATEGY once TP-BACKEND has set tensor_parallel = 1); False when a refused rule has no fix, or the fix no move."""
    if not rules or any(r not in fixes for r in rules):
        return False
    rule = next(r for r in fixes if r in rules)
    changes = fixes[rule].change(draft)
    if not changes:
        return False
    for key, value, *note in changes:
        old = probe.value_of(draft.spec, key) if key == probe.WORLD else draft.used(key)
        if key == probe.WORLD:
            placeholders.set_world(draft, value, f" (not {old}: rule {rule}, {RULES_BY_ID[rule].when}, computed on the placeholder)")
        elif key in draft.placeholders:
            moved_placeholder(draft, key, old, value, rule)
        else:
            draft.set(key, value)
            if note:
                draft.report.carried(key, old, value, rule, note[0])
            else:
                draft.report.refused(key, old, value, rule, RULES_BY_ID[rule].when)
    return True


def moved_placeholder(draft: Draft, key: str, old: Any, value: Any, rule: str) -> None:
    """A placeholder moved by a rule (not a setting of the source): its entry's line says the new value and why."""
    draft.set(key, value)
    options = str(value).partition("?")[2] if key == placeholders.MODEL else ""
    whose = {"layers": "blocks, a multiple of the source's pipeline stages", "experts": "experts, a multiple of its expert_parallel"}
    held = "".join(f"; ?{k}={n}: {n} {whose[k]}" for k, _, n in (o.partition("=") for o in options.split("&") if o))
    for e in draft.report.setting(key):
        e.sets = [(k, value if k == key else v) for k, v in e.sets]
        e.note = e.note.replace(f"{key} = {shown(old)} is a PLACEHOLDER",
                                f"{key} = {shown(value)} is a PLACEHOLDER (not {shown(old)}: rule {rule} refuses it, "
                                f"{RULES_BY_ID[rule].when}{held})")
