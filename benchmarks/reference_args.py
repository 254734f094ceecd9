"""The flags that make benchmarks/reference_loop.py train what a spec trains: the same model shape, batch, seed, steps,
lr schedule, optimizer settings, activation checkpointing, compile, device and number of processes.

    python benchmarks/reference_args.py benchmarks/specs/llama3-8b-ac-fp8.toml [--set KEY=VALUE ...]

prints the number of processes on the first line, then one flag a line (bash: `mapfile -t ref < <(...)`), without
--precision (the caller runs it once per precision) and without --warmup (the steps the tokens/s median leaves out).
The spec is planned as `fp8launch bench` plans it (pass the same --set overrides, `--set train.steps=N` for
`bench --steps N`), so a bench run and the reference agree.

The FP8 layer filter is torchtitan's, translated: keep_first_last = true -> the lm_head "output" left alone (torchtitan
keeps only that one; fp8launch also keeps the first Linear), false -> nothing by name; skip_small -> torchtitan's
auto_filter_small_kn (torchao's same size rule). A spec the reference loop cannot follow (gradient accumulation,
another optimizer or data, selective checkpointing, an hf: or MoE model, tensor parallelism) stops with the reason.
"""

from __future__ import annotations

import argparse
import sys

from launcher.commands.run import plan_for_run
from launcher.errors import LauncherError
from launcher.planning.models import LlamaConfig, parse_builtin


def reference_flags(spec: str, overrides: list[str]) -> tuple[int, list[str]]:
    """(processes, flags) for `spec` planned with `overrides`; raises ValueError naming what the loop cannot follow."""
    plan = plan_for_run(spec, list(overrides)).plan
    t, p, d = plan.train, plan.precision, plan.distributed
    problems = []
    if not t.model.startswith("builtin:"):
        problems.append(f"train.model = {t.model!r} (the loop builds the builtin Llama shape only)")
    if t.data != "synthetic":
        problems.append(f"train.data = {t.data!r} (the loop trains on the synthetic stream)")
    if t.grad_accum_steps != 1:
        problems.append(f"train.grad_accum_steps = {t.grad_accum_steps} (no accumulation in the loop)")
    if t.optimizer != "adamw" or t.weight_decay_exclude != "none":
        problems.append(f"train.optimizer = {t.optimizer!r}, weight_decay_exclude = {t.weight_decay_exclude!r} (AdamW, one group)")
    if plan.activation_checkpointing.mode not in ("none", "full"):
        problems.append(f"activation_checkpointing.mode = {plan.activation_checkpointing.mode!r} (none or full)")
    if d.strategy != "fsdp2" or d.tensor_parallel != 1 or d.nodes != 1:
        problems.append(f"distributed: {d.strategy}, tensor_parallel {d.tensor_parallel}, nodes {d.nodes} (FSDP2 on one node)")
    if p.fp8 and (p.backend != "torchao" or p.torchao.recipe not in ("tensorwise", "rowwise")):
        problems.append(f"precision: {p.backend} {p.torchao.recipe if p.backend == 'torchao' else ''} (torchao tensorwise or rowwise)")
    cfg = parse_builtin(t.model) if not problems else None
    if cfg is not None and not isinstance(cfg, LlamaConfig):
        problems.append(f"train.model = {t.model!r} is a Mixture-of-Experts shape (the loop is dense)")
    if problems:
        raise ValueError(f"benchmarks/reference_loop.py cannot train {spec} as planned: " + "; ".join(problems))
    flags = [
        "--dim", str(cfg.dim), "--layers", str(cfg.n_layers), "--heads", str(cfg.n_heads), "--kv-heads", str(cfg.kv_heads),
        "--ffn", str(cfg.ffn_dim), "--vocab", str(cfg.vocab_size), "--norm-eps", repr(cfg.norm_eps), "--rope-theta", repr(cfg.rope_theta),
        "--seq-len", str(t.seq_len), "--batch", str(t.micro_batch_size), "--steps", str(t.steps), "--seed", str(t.seed),
        "--lr", repr(t.lr), "--warmup-steps", str(t.warmup_steps), "--min-lr-ratio", repr(t.min_lr_ratio),
        "--betas", *(repr(float(b)) for b in t.adam_betas), "--eps", repr(t.adam_eps), "--weight-decay", repr(t.weight_decay),
        "--max-grad-norm", repr(t.max_grad_norm), "--ac", plan.activation_checkpointing.mode,
        "--compile" if plan.compile.enabled else "--no-compile",
        "--filter-fqns", "output" if p.keep_first_last else "",
        "--auto-filter" if p.torchao.skip_small else "--no-auto-filter",
    ]
    if p.fp8:
        flags += ["--recipe", p.torchao.recipe]
    if plan.launch.device in ("cuda", "cpu"):
        flags += ["--device", plan.launch.device]
    return d.procs_per_node, flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        procs, flags = reference_flags(args.spec, args.overrides)
    except (ValueError, LauncherError) as e:
        print(f"reference_args: {e}", file=sys.stderr)
        return 2
    print(procs)
    for flag in flags:
        print(flag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
