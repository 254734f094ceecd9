"""Make an imported spec plan: plan it exactly as `fp8launch plan` would; where a rule refuses the literal
translation, move to the nearest setting that plans and report the entry as approximated, naming the rule.

Each fix is a record: the rule it answers and the spec keys it changes, given the draft (so it can read what
the spec holds); FIXES' order is the order of preference, one move per planning round. A rule with no fix here
stops the import with the planner's own message.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from launcher.errors import SpecError
from launcher.planning.rules import RULES_BY_ID

from .draft import Draft

MAX_ROUNDS = 12


@dataclass(frozen=True, slots=True)
class Fix:
    rule: str
    change: Callable[[Draft], list[tuple]]
    """(spec key, new value) pairs, each refused by the rule; or (spec key, new value, note) for a key set along with them,
    which the rule did not refuse (the note says why); [] when this fix cannot help any more."""


def _v(d: Draft, key: str, default: Any) -> Any:
    return d.value(key, default)


def _world(d: Draft) -> int:
    return _v(d, "distributed.nodes", 1) * _v(d, "distributed.procs_per_node", 8)


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


def _cp_seq(d: Draft) -> list[tuple[str, Any]]:
    """The sequence rounded up to a multiple of 2 x context_parallel (torch's load balancer deals each rank two of 2 x cp
    chunks), as Axolotl pads each batch to a multiple of context_parallel_size for its ring."""
    step, seq = 2 * _v(d, "distributed.context_parallel", 1), d.used("train.seq_len")
    return [("train.seq_len", step * math.ceil(seq / step))] if step > 2 and seq % step else []


def _pp_layers(d: Draft) -> list[tuple[str, Any]]:
    """The blocks split over the stages as evenly as they go (the first stages one more), or no pipeline."""
    from launcher.planning.models import builtin_config
    from launcher.planning.plan import even_split, stages_a_rank

    cfg, pp = builtin_config(str(_v(d, "train.model", ""))), _v(d, "distributed.pipeline_parallel", 1)
    per_rank = stages_a_rank(_v(d, "distributed.pipeline.schedule", "1F1B"), _v(d, "distributed.pipeline.stages_per_rank", 0))
    if cfg is not None and per_rank > 1 and pp <= cfg.n_layers < pp * per_rank:  # fewer stages a rank first, then one (1F1B)
        fewer = cfg.n_layers // pp  # ZBV's 2 never get here with fewer >= 2
        return ([("distributed.pipeline.stages_per_rank", fewer)] if fewer >= 2 else
                [("distributed.pipeline.schedule", "1F1B"), ("distributed.pipeline.stages_per_rank", 0)])
    if cfg is None or cfg.n_layers < pp * per_rank or _v(d, "distributed.pipeline.layers_per_stage", []):
        return _no_pp(d)
    return [("distributed.pipeline.layers_per_stage", list(even_split(cfg.n_layers, pp * per_rank)))]


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


def _halve(key: str) -> Callable[[Draft], list[tuple[str, Any]]]:
    return lambda d: [(key, _v(d, key, 1) // 2)] if _v(d, key, 1) > 1 else []


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
    Fix("TE-TOKENS-DIV8", lambda d: [("train.seq_len", 8 * math.ceil(_v(d, "train.seq_len", 2048) / 8))]),
    Fix("TORCHAO-BLOCK-TOKENS", lambda d: [("train.seq_len", 32 * math.ceil(_v(d, "train.seq_len", 2048) / 32))]),
    Fix("CPU-BACKEND", lambda d: [("launch.device", "auto")]),
    # MS-AMP
    Fix("MSAMP-FSDP2", lambda d: [("distributed.strategy", "ddp")]),
    Fix("MSAMP-ZERO3", lambda d: [("distributed.deepspeed.zero_stage", 2)]),
    Fix("MSAMP-O3-STRATEGY", lambda d: [("precision.msamp.opt_level", "O2")]),
    Fix("MSAMP-OPTIMIZER", lambda d: [("train.optimizer", "adamw")]),
    # parallelism fp8launch runs only in some combinations
    Fix("TP-BACKEND", lambda d: _no_tp(d)),
    Fix("TP-MODEL", lambda d: _no_tp(d)),
    Fix("TP-DIVIDES-PROCS", lambda d: [("distributed.tensor_parallel", math.gcd(_v(d, "distributed.tensor_parallel", 1),
                                                                                 _v(d, "distributed.procs_per_node", 8)))]),
    Fix("TP-HEADS", _halve("distributed.tensor_parallel")),
    Fix("TP-SEQ-LEN", _halve("distributed.tensor_parallel")),
    Fix("TORCHAO-BLOCK-TP", lambda d: _no_tp(d)),
    Fix("TP-COMPILE-CPU", lambda d: [("compile.enabled", False)]),
    Fix("EP-DENSE-MODEL", lambda d: [("distributed.expert_parallel", 1)]),
    Fix("EP-TENSOR-PARALLEL", lambda d: _no_tp(d)),
    Fix("EP-DIVIDES-WORLD", lambda d: [("distributed.expert_parallel", math.gcd(_v(d, "distributed.expert_parallel", 1), _world(d)))]),
    Fix("EP-DIVIDES-EXPERTS", _halve("distributed.expert_parallel")),
    # pipeline parallel: its layout first, then off where fp8launch does not compose it (its ranks become data-parallel)
    Fix("PP-MICROBATCHES", _pp_microbatches),
    Fix("PP-LAYERS", _pp_layers),
    *(Fix(rule, _no_pp) for rule in ("PP-DIVIDES-WORLD", "PP-MODEL", "PP-EXPERT-PARALLEL", "PP-BACKEND",
                                     "PP-PRECISION-SCHEDULE", "PP-FP16", "PP-GRAD-REDUCE", "PP-MONITOR")),
    # context parallel: off where fp8launch does not compose it (its ranks become data-parallel), then what it needs of the
    # rest of the spec where it stays
    *(Fix(rule, _no_cp) for rule in ("CP-DIVIDES-WORLD", "CP-MODEL", "CP-PIPELINE", "CP-TENSOR-PARALLEL", "CP-EXPERT-PARALLEL",
                                     "CP-BACKEND")),
    Fix("CP-SEQ", _cp_seq),
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


def settle(draft: Draft, render: Callable[[Draft], str], folder: str, label: str) -> str:
    """The spec's text once it plans: render, plan in `folder` (a temporary file beside where it will be written, so relative
    paths resolve as they will), fix what a rule refuses, again. Raises SpecError (its problems naming `label`) when a
    refusal has no fix."""
    from launcher.commands.plan import plan_one

    tmp = os.path.join(folder, f".fp8launch-import.{os.getpid()}.tmp.toml")
    for _ in range(MAX_ROUNDS):
        draft.finish()
        text = render(draft)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            plan_one(tmp, out_dir=os.path.join(folder, "generated"))
            return text
        except SpecError as e:
            refused = [dataclasses.replace(p, file=label) for p in e.problems if p.severity == "error"]
            if not apply_fixes(draft, [p.rule for p in refused]):
                raise SpecError(refused) from None
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    raise SpecError(refused)


def apply_fixes(draft: Draft, rules: list[str | None]) -> bool:
    """Apply the fix of the first refused rule in FIXES' order (one move at a time: a later refusal may be gone after it,
    e.g. TP-STRATEGY once TP-BACKEND has set tensor_parallel = 1); False when a refused rule has no fix, or the fix no move."""
    if not rules or any(r not in FIXES for r in rules):
        return False
    rule = next(r for r in FIXES if r in rules)
    changes = FIXES[rule].change(draft)
    if not changes:
        return False
    for key, value, *note in changes:
        old = draft.used(key)
        draft.set(key, value)
        if note:
            draft.report.carried(key, old, value, rule, note[0])
        else:
            draft.report.refused(key, old, value, rule, RULES_BY_ID[rule].when)
    return True
