"""Text the CLI shows about plans and rules. Pure formatting: no printing, no torch."""

from __future__ import annotations

import os

from launcher.errors import UsageError
from launcher.planning.init_cost import init_time
from launcher.planning.levels import native_line, reduce_payload
from launcher.planning.memory import estimate, model_config, model_params
from launcher.planning.plan import Plan
from launcher.planning.precision_table import ROWS, precision_table
from launcher.planning.rules import RULES, RULES_BY_ID
from launcher.planning.selection import default_recipe
from launcher.planning.suggest import did_you_mean
from launcher.targets.files import Change


def pipeline_words(plan: Plan) -> str:
    """", pipeline parallel 2 (1F1B, 4 micro-batches; mesh pp 2 x dp 2)" (Interleaved1F1B: "(Interleaved1F1B, 2 stages a
    rank, ...") or "" without pipeline parallelism."""
    d = plan.distributed
    if d.pipeline_parallel <= 1:
        return ""
    n = plan.pipeline_microbatches
    split = f", blocks {'/'.join(map(str, d.pipeline.layers_per_stage))}" if d.pipeline.layers_per_stage else ""
    several = f", {d.pipeline.local_stages} stages a rank" if d.pipeline.local_stages > 1 else ""
    return (f", pipeline parallel {d.pipeline_parallel} ({d.pipeline.schedule}{several}, {n} micro-batches{split}; "
            f"mesh pp {d.pipeline_parallel} x dp {d.data_parallel}{f' x tp {d.tensor_parallel}' if d.tensor_parallel > 1 else ''})")


def context_words(plan: Plan) -> str:
    """", context parallel 2 (each sequence over 2 ranks; mesh dp 1 x cp 2)" or "" without context parallelism."""
    d = plan.distributed
    if d.context_parallel <= 1:
        return ""
    return (f", context parallel {d.context_parallel} (each sequence over {d.context_parallel} ranks; "
            f"mesh dp {d.data_parallel} x cp {d.context_parallel})")


def plan_summary(plan: Plan, folder: str, changes: list[Change], params: int | None = None, prediction=None) -> str:
    p, d, t = plan.precision, plan.distributed, plan.train
    written = [c for c in changes if c.status in ("create", "update")]
    status = f"{len(written)} written, {len(changes) - len(written)} unchanged" if written else "unchanged"
    precision = f"fp8 ({p.backend} {default_recipe(plan)}, rest in {p.high_precision})" if p.fp8 else p.mode
    spec_folder = os.path.normpath(os.path.join(folder, plan.spec_dir))  # plan.spec_dir is relative to the plan's folder
    ep = d.expert_parallel
    expert = f", expert parallel {ep} (mesh efsdp {d.layout().expert_shards} x ep {ep})" if ep > 1 else ""
    split = d.tensor_parallel > 1 or d.pipeline_parallel > 1 or d.context_parallel > 1
    dp_ranks = f"{d.data_parallel} {'data-parallel ' if split else ''}ranks"
    lines = [
        f"{plan.name}: {folder}/ ({status})",
        f"  precision   {precision}",
        *([f"  MS-AMP      {native_line(plan)}"] if plan.msamp_native else []),
        *selection_lines(plan, spec_folder),
        f"  engine      {d.strategy}{f' ZeRO-{d.deepspeed.zero_stage}' if d.strategy == 'deepspeed' else ''}, "
        f"{d.nodes} node{'s' * (d.nodes != 1)} x {d.procs_per_node} = world size {plan.world_size}"
        f"{f', tensor parallel {d.tensor_parallel} (mesh dp {d.data_parallel} x tp {d.tensor_parallel})' if d.tensor_parallel > 1 else ''}"
        f"{', async TP' if d.async_tp else ''}"
        f"{expert}"
        f"{context_words(plan)}"
        f"{pipeline_words(plan)}"
        f"{', compiled' if plan.compile.enabled else ''}"
        f"{f', activation checkpointing {plan.activation_checkpointing.mode}' if plan.activation_checkpointing.mode != 'none' else ''}",
        f"  batch       {t.micro_batch_size} micro x {t.grad_accum_steps} accum x {dp_ranks} = {d.global_batch_size} sequences"
        f" = {plan.tokens_per_step:,} tokens/step (seq_len {t.seq_len})",
        "  what runs in which dtype:",
    ]
    table = precision_table(plan)
    width = max(len(k) for k, _ in ROWS)
    lines += [f"    {key:<{width}}  {table[key]}" for key, _ in ROWS if key in table]
    params = params or model_params(plan.train.model, spec_folder)
    if params:
        lines += ["  " + line for line in estimate(plan, params, spec_folder).lines()]
        lines.append("  " + init_time(plan, params, model_config(plan.train.model, spec_folder)).line())
    else:
        lines.append(f"  model states per GPU: pass --params N to estimate them "
                     f"({plan.train.model.split(':')[0]}: models are sized when built)")
    if prediction is not None:
        lines.append(f"  {prediction.line()}")
        if prediction.grad_comm_bytes:
            lines.append(f"  gradient reduction: {prediction.grad_comm_bytes / 2**20:,.1f} MiB sent per rank and step in "
                         f"{reduce_payload(plan)} (each step record's grad_comm_bytes measures it)")
    lines += phase_lines(plan, params)
    return "\n".join(lines)


def phase_lines(plan: Plan, params: int | None) -> list[str]:
    """The `[[precision.schedule]]` phases: steps, precision, peak memory and predicted speed of each."""
    if not plan.precision.schedule:
        return []
    out = ["  precision phases:"]
    for phase in phase_records(plan, params):
        memory = f", peak {phase['peak_bytes_per_gpu'] / 2**30:.3g} GiB per GPU" if phase["peak_bytes_per_gpu"] else ""
        speed = phase["fp8_vs_bf16"]
        speed = f", predicted {speed:.2f}x bf16's tokens/s" if speed is not None else ""
        out.append(f"    {phase['phase']}: steps {phase['first_step']}-{phase['last_step']}: {phase['precision']}{memory}{speed}")
    return out


SHOWN_BEYOND = 3
"""The kept layers `selection_lines` names one by one; beyond that it counts them by reason."""


def selection_lines(plan: Plan, spec_folder: str) -> list[str]:
    """For an FP8 plan whose model planning knows: how many layers run in FP8 and their share of the GEMM FLOPs, and
    which layers it keeps beyond the field's default (every Linear but the output layer: torchtitan, Megatron), why."""
    from launcher.planning.predict import selection
    from launcher.planning.predict.shapes import model_shape
    from launcher.planning.selection import reason_key

    shape = model_shape(plan.train.model, spec_folder)[0] if plan.precision.fp8 else None
    if shape is None:
        return []
    sel = selection(plan, shape)
    line = f"  fp8 layers  {sel.fp8} of {sel.total}, {sel.flop_share:.0%} of the layers' GEMM FLOPs"
    if not sel.beyond:
        return [line + ("; the output layer kept too (the field's default)" if sel.head_kept else "; the output layer too")]
    if len(sel.beyond) <= SHOWN_BEYOND:
        kept = ", ".join(f"{name} ({reason_key(why)})" for name, why in sel.beyond)
    else:
        counts: dict[str, int] = {}
        for _, why in sel.beyond:
            counts[why] = counts.get(why, 0) + 1
        kept = ", ".join(f"{n} by {reason_key(why)}" for why, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return [line, f"              kept beyond every Linear but the output layer (torchtitan's, Megatron's default): {kept}"]


def phase_records(plan: Plan, params: int | None = None) -> list[dict]:
    """One record per precision phase (plan --format json's `phases`)."""
    from launcher.planning.predict import predict
    from launcher.planning.schedule import phases

    params = params or model_params(plan.train.model)
    all_phases = phases(plan)
    out = []
    for phase, following in zip(all_phases, all_phases[1:] + [None]):
        p = phase.plan.precision
        pr = predict(phase.plan, plan.spec_dir) if params else None
        out.append({"phase": phase.index, "first_step": phase.first_step,
                    "last_step": following.first_step - 1 if following else plan.train.steps,
                    "precision": f"fp8 {p.backend} {default_recipe(phase.plan)}" if p.fp8 else p.mode,
                    "peak_bytes_per_gpu": int(estimate(phase.plan, params).peak_bytes) if params else None,
                    "fp8_vs_bf16": pr.fp8_vs_bf16 if pr is not None and p.fp8 else (1.0 if params else None)})
    return out


def rules_table() -> str:
    width = max(len(r.id) for r in RULES)
    lines = [f"{'ID':<{width}}  SEVERITY  STAGE  WHEN"]
    lines += [f"{r.id:<{width}}  {r.severity:<8}  {r.stage:<5}  {r.when}" for r in RULES]
    lines.append("\n`fp8launch explain ID` explains one rule. Errors stop plan and run (exit 2); warnings do not, unless --strict.")
    return "\n".join(lines)


def explain_rule(rule_id: str) -> str:
    rule = RULES_BY_ID.get(rule_id.upper())
    if rule is None:
        hint = did_you_mean(rule_id.upper(), RULES_BY_ID, show=str)
        raise UsageError(f"no rule {rule_id!r}{hint}; `fp8launch explain` lists them")
    checked = "when planning (fp8launch plan and run)" if rule.stage == "plan" else "at run time, on the machine that trains"
    return "\n".join([
        f"{rule.id} ({rule.severity}, checked {checked})",
        f"  when: {rule.when}",
        f"  why:  {rule.why}",
        f"  fix:  {rule.fix}",
    ])


def schema_markdown(schema: dict) -> str:
    """The spec reference as Markdown, generated from the schema (docs/spec-reference.md)."""
    import json

    lines = ["# Spec reference (version 1)", "",
             "Generated from the JSON Schema by `fp8launch schema --format markdown`; do not edit by hand.", ""]

    def walk(node: dict, prefix: str) -> None:
        rows = []
        for key, sub in node.get("properties", {}).items():
            if key == "$schema" or sub.get("deprecated"):
                continue
            if sub.get("type") == "object" and "properties" in sub:
                continue
            if "enum" in sub:
                kind = " \\| ".join(json.dumps(v) for v in sub["enum"])
            else:
                kind = sub.get("type", "const " + json.dumps(sub.get("const")))
            default = json.dumps(sub["default"]) if "default" in sub else "required"
            rows.append(f"| `{key}` | {kind} | `{default}` | {sub['description'].replace('|', '/')} |")
        if rows:
            lines.extend([f"## `[{prefix}]`" if prefix else "## top level", "", node.get("description", ""), "",
                          "| key | type | default | meaning |", "|---|---|---|---|", *rows, ""])
        for key, sub in node.get("properties", {}).items():
            if sub.get("type") == "object" and "properties" in sub:
                walk(sub, f"{prefix}.{key}" if prefix else key)

    walk(schema, "")
    return "\n".join(lines).rstrip() + "\n"
