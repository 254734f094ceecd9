"""The support matrix: which options run together, generated from the spec's schema and checked by
really running it (tests/e2e/test_support_matrix.py on CPU, tests/gpu/test_support_matrix_gpu.py on a GPU).

Every key of the schema is either an option of a matrix (its values from the schema: enum members,
booleans, or the values listed here for a number) or listed in ELSEWHERE with the test that covers
it; a test holds the schema to that, so an option added to the schema joins the matrix the day it lands.

An option applies only where what it `requires` holds (a recipe needs precision.mode = "fp8", an FSDP2
setting needs the fsdp2 strategy). `generate` covers every pair of values of any two options that can
apply together, pairwise:
- a pair that some spec trains with appears in a run that trains (2 steps, tiny shapes): runs are
  built greedily, each taking the values that cover the most pairs not yet covered, among the values
  the rule table lets train;
- a pair the rule table refuses (its smallest spec already meets an error rule) gets a run of its own
  that must stop before torchrun with that rule's id (exit 2; 3 for a run-stage rule).

Torch-free and deterministic: `render_markdown` writes docs/support-matrix.md from it, and CI checks
that file is current (`python -m tools.support_matrix --check`).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from launcher.planning.backends import BACKENDS
from launcher.planning.plan import Plan, resolve
from launcher.planning.read import SpecSource, defaults, nested, schema
from launcher.planning.rules import Facts, check

DOC = Path("docs") / "support-matrix.md"
ROWS = Path("docs") / "support-matrix.json"
"""The generated runs of every matrix, committed beside the doc: the tests read them (generating takes ~15 s) and CI
checks both are current."""
MODEL = "builtin:llama-debug?layers=2"


@dataclass(frozen=True)
class Option:
    key: str
    """The spec key (dotted path)."""
    values: tuple = ()
    """Values tried; empty: all of the schema's (enum members, or false/true)."""
    requires: tuple[tuple[str, tuple], ...] = ()
    """(key, allowed values) that must hold for this option to be read at all."""

    def applies(self, config: dict[str, Any]) -> bool:
        return all(config.get(k, _default(k)) in allowed for k, allowed in self.requires)


FP8 = (("precision.mode", ("fp8",)),)
FSDP2 = (("distributed.strategy", ("fsdp2",)),)
DEEPSPEED = (("distributed.strategy", ("deepspeed",)),)

CPU_OPTIONS: tuple[Option, ...] = (
    Option("distributed.strategy"),
    Option("precision.mode"),
    Option("precision.torchao.recipe", requires=FP8),
    Option("precision.torchao.fsdp_float8_all_gather", requires=FP8),
    Option("precision.torchao.precompute_scale", requires=FP8 + FSDP2 + (("precision.torchao.recipe", ("tensorwise",)),
                                                                       ("precision.torchao.fsdp_float8_all_gather", (True,)))),
    Option("compile.enabled"),
    Option("compile.fullgraph", requires=(("compile.enabled", (True,)),)),
    Option("activation_checkpointing.mode"),
    Option("distributed.fsdp2.reshard_after_forward", requires=FSDP2),
    Option("distributed.fsdp2.reduce_dtype", requires=FSDP2),
    Option("distributed.fsdp2.cpu_offload", requires=FSDP2),
    Option("distributed.deepspeed.zero_stage", requires=DEEPSPEED),
    Option("distributed.deepspeed.offload_optimizer", requires=DEEPSPEED),
    Option("distributed.deepspeed.offload_param", requires=DEEPSPEED),
    Option("distributed.tensor_parallel", values=(1, 2)),
    Option("distributed.context_parallel", values=(1, 2), requires=FSDP2),
    Option("distributed.pipeline_parallel", values=(1, 2), requires=FSDP2),
    Option("train.grad_accum_steps", values=(1, 2)),
    Option("train.optimizer"),
    Option("train.on_nan"),
    Option("monitor.fp8_stats_every", values=(0, 1)),
)
"""What the CPU runs for real: 2 processes over gloo, builtin:llama-debug with 2 blocks, 2 steps. Context and pipeline
parallel apply under FSDP2 (DDP and DeepSpeed are refused by CP-STRATEGY / PP-STRATEGY, tests/test_rules.py); each takes
both processes (a pipeline of 2 one-block stages, 1F1B over the step's micro-batches of one sequence; each sequence split
over 2), so neither pairs with tensor parallel or the other here."""

MOE_OPTIONS: tuple[Option, ...] = (
    Option("precision.mode", values=("bf16", "fp8")),
    Option("precision.torchao.recipe", requires=FP8),
    Option("compile.enabled"),
    Option("distributed.expert_parallel", values=(1, 2)),
)
"""What the CPU runs for real with Mixture-of-Experts blocks: builtin:moe-debug (2 MoE blocks, 8 experts, grouped
GEMMs) over FSDP2: each recipe's experts with and without compile and expert parallelism. (An MoE block compiles in
parts: fullgraph and activation checkpointing around them are tests/train/test_moe.py's; ~20 s a compiled run.)"""

TE = FP8 + (("precision.backend", ("te",)),)
GPU_OPTIONS: tuple[Option, ...] = (
    Option("distributed.strategy"),
    Option("precision.mode", values=("bf16", "fp8")),
    Option("precision.backend"),
    Option("precision.torchao.recipe", requires=FP8 + (("precision.backend", ("torchao",)),)),
    Option("precision.te.recipe", requires=TE),
    Option("precision.te.fp8_format", requires=TE),
    Option("precision.msamp.opt_level", requires=FP8 + (("precision.backend", ("msamp",)),)),
    Option("compile.enabled"),
    Option("activation_checkpointing.mode", values=("none", "full")),
    Option("distributed.tensor_parallel", values=(1, 2)),
    Option("distributed.async_tp", requires=(("distributed.tensor_parallel", (2,)),)),
)
"""What tests/gpu/test_support_matrix_gpu.py runs on CUDA (tensor parallel with 2 GPUs or more): the
backends the CPU cannot run (Transformer Engine, MS-AMP), and async TP."""

ELSEWHERE: dict[str, str] = {
    "$schema": "an editor hint, not read",
    "version": "the spec version; only 1 exists",
    "name": "names the output folder",
    "precision.high_precision": "tests/train/test_precision_amp.py (fp16 and fp32: autocast, the grad scaler, a torchao model kept "
                                "in fp16); tests/test_render.py (deepspeed.json of a TE run in fp16)",
    "precision.keep_first_last": "tests/train/test_precision_select.py: which Linear layers are kept",
    "precision.rules": "tests/train/test_precision_torchao.py (mixed recipes); "
                       "tests/e2e/test_runs.py::test_precision_rules_train_each_layer_as_the_layers_map_shows; "
                       "tests/test_rules.py (PRECISION-RULE-*)",
    "precision.schedule": "tests/e2e/test_resume.py::test_a_precision_schedule_resumes_bit_identically_between_two_switches; "
                          "tests/train/test_precision_switch.py; tests/test_schedule.py; tests/test_rules.py (SCHEDULE-*)",
    "precision.keep_first_blocks": "tests/train/test_precision_select.py; "
                                   "tests/e2e/test_runs.py::test_kept_blocks_train_in_bf16_as_the_layers_map_shows",
    "precision.keep_last_blocks": "tests/train/test_precision_select.py; "
                                  "tests/e2e/test_runs.py::test_kept_blocks_train_in_bf16_as_the_layers_map_shows",
    "precision.keep": "tests/train/test_precision_select.py",
    "precision.torchao.skip_small": "tests/train/test_precision_select.py (the matrix turns it off: llama-debug is all small)",
    "precision.torchao.pad_inner_dim": "tests/train/test_precision_torchao.py",
    "precision.te.margin": "tests/train/test_precision_te.py: the recipe arguments against TE's signatures",
    "precision.te.amax_history_len": "tests/train/test_precision_te.py",
    "precision.te.amax_compute_algo": "tests/train/test_precision_te.py",
    "precision.te.reduce_amax": "tests/train/test_precision_te.py",
    "precision.te.fp8_dpa": "tests/train/test_precision_te.py (and rule TE-BLOCK-FP8-ATTENTION)",
    "precision.te.fp8_mha": "tests/train/test_precision_te.py (and rule TE-BLOCK-FP8-ATTENTION)",
    "precision.te.swap": "tests/train/test_precision_te.py",
    "precision.te.fp8_params": "tests/train/test_te_features.py (TE's FP8 weights with FusedAdam's fp32 master copy on DDP and FSDP2, "
                               "stand-in TE); tests/gpu/test_te_gpu.py; rules TE-FP8-PARAMS-*",
    "precision.te.interval": "removed in Transformer Engine 2.2; rule TE-REMOVED-KEY refuses it",
    "precision.te.override_linear_precision": "removed in Transformer Engine 2.2; rule TE-REMOVED-KEY refuses it",
    "precision.msamp.use_te": "tests/train/test_precision_msamp.py",
    "precision.optimizer_states": "tests/e2e/test_levels.py (fp8 under DDP and FSDP2 with resume; int8 and bf16 trained by "
                                  "test_every_level_value_trains; each against its measured bytes); tests/train/test_levels.py; "
                                  "rules OPTIMIZER-STATES-SGD, LEVELS-DEEPSPEED, LEVELS-BACKEND",
    "precision.grad_reduce": "tests/e2e/test_levels.py (fp8 under DDP and FSDP2, bf16 and fp32 by test_every_level_value_trains; "
                             "auto: every run of the matrix above, its effects.grad_reduce checked); tests/train/test_levels.py "
                             "(the FP8 collectives on two ranks); rules GRAD-REDUCE-DEEPSPEED, GRAD-REDUCE-FSDP2-FP32",
    "precision.master_weights": "tests/e2e/test_levels.py (bf16 under FSDP2 with float8 all-gather, resumed and exported; under "
                                "DDP by test_every_level_value_trains); tests/train/test_levels.py (stochastic rounding); rules "
                                "MASTER-WEIGHTS-OPTIMIZER, MASTER-WEIGHTS-COMPUTE, LEVELS-DEEPSPEED",
    "distributed.nodes": "tests/e2e/test_runs.py::test_two_nodes_on_loopback, tests/test_slurm.py (two SLURM nodes)",
    "distributed.procs_per_node": "every run (the CPU matrix uses 2)",
    "distributed.expert_parallel": "tests/e2e/test_moe.py (builtin:moe-debug, expert_parallel = 2 on 2 processes; resume); "
                                   "rules MOE-*, EP-*",
    "distributed.pipeline.schedule": "tests/e2e/test_pipeline.py (1F1B on pp 2, GPipe on pp 2 x dp 2, Interleaved1F1B and "
                                     "ZBVZeroBubble on pp 2); tests/train/test_pipeline_stage.py; rules PP-ZBV-*",
    "distributed.pipeline.stages_per_rank": "tests/e2e/test_pipeline.py (2 stages a rank, Interleaved1F1B and ZBVZeroBubble); "
                                            "tests/test_pipeline_plan.py (the stages of each rank against torch's); "
                                            "rule PP-STAGES-PER-RANK",
    "distributed.pipeline.microbatches": "tests/e2e/test_pipeline.py (4 and 2 per step); rule PP-MICROBATCHES",
    "distributed.pipeline.layers_per_stage": "tests/e2e/test_pipeline.py (1 + 3 blocks); tests/train/test_pipeline_stage.py; "
                                             "rule PP-LAYERS",
    "distributed.global_batch_size": "rule BATCH-MISMATCH (tests/test_rules.py)",
    "distributed.deepspeed.nvme_path": "every run with offload \"nvme\" in the matrix; rule DS-NVME-PATH",
    **{f"distributed.deepspeed.{k}": "tests/test_render.py: read back by DeepSpeed's own config parser" for k in
       ("overlap_comm", "contiguous_gradients", "reduce_bucket_size")},
    "compile.mode": "tests/train/test_models.py; reduce-overhead uses CUDA graphs (GPU only)",
    "launch.launcher": "tests/test_launch.py, tests/test_slurm.py, tests/test_kubernetes.py",
    "launch.device": "every run (the CPU matrix: cpu; the GPU matrix: cuda)",
    "launch.gpu": "tests/test_predict.py (what the speed prediction is made for)",
    "launch.rdzv_endpoint": "tests/e2e/test_runs.py::test_two_nodes_on_loopback",
    "launch.rdzv_backend": "every run (c10d is the only value)",
    "launch.max_restarts": "tests/e2e/test_resume.py::test_a_killed_worker_is_restarted_and_resumes_to_the_same_losses",
    "launch.env": "tests/test_render.py, every run (the CPU matrix sets OMP_NUM_THREADS)",
    **{f"launch.slurm.{k}": "tests/test_render.py::test_slurm_script_fields (the #SBATCH lines)" for k in
       ("partition", "account", "extra_sbatch", "cpus_per_task")},
    "launch.slurm.time": "tests/test_render.py::test_slurm_script_fields; tests/test_slurm.py (a real two-node SLURM cluster in CI)",
    **{f"launch.slurm.{k}": "tests/test_render.py::test_slurm_gpus_per_node_and_signal_seconds" for k in
       ("gpus_per_node", "signal_seconds")},
    **{f"launch.kubernetes.{k}": "tests/test_kubernetes.py (manifests validated against the Kubeflow CRDs)" for k in
       ("api", "image", "namespace", "runtime", "gpus_per_node", "volume_claim", "workdir")},
    "train.model": "tests/train/test_models.py, tests/e2e/test_meta_init.py (builtin, hf:, py:)",
    "train.data": "tests/train/test_data.py, tests/e2e/test_runs.py (text and token files)",
    "train.seq_len": "a shape (rules TP-SEQ-LEN, TE-TOKENS-DIV8)",
    "train.micro_batch_size": "a shape",
    "train.steps": "every run",
    "train.lr": "tests/train/test_loop.py",
    "train.weight_decay": "tests/train/test_optim.py (the optimizer's groups)",
    "train.weight_decay_exclude": "tests/train/test_optim.py (the optimizer's two parameter groups, one step of AdamW's decay; "
                                  "the ZeRO-0 export reads them back)",
    "train.adam_betas": "tests/train/test_optim.py (torch's Adam / AdamW, deepspeed.json's optimizer, MS-AMP's optimizer arguments)",
    "train.adam_eps": "tests/train/test_optim.py",
    "train.warmup_steps": "tests/train/test_loop.py",
    "train.min_lr_ratio": "tests/train/test_optim.py (the lr the scheduler sets at given steps)",
    "train.max_grad_norm": "tests/train/test_engines.py::test_max_grad_norm_clips_the_gradients_and_zero_leaves_them; "
                           "tests/test_render.py (DeepSpeed's gradient_clipping)",
    "train.seed": "tests/e2e/test_meta_init.py (the same weights at any world size)",
    "train.output_dir": "every run",
    "train.log_every": "tests/train/test_loop.py",
    "train.checkpoint_every": "tests/e2e/test_resume.py, tests/train/test_checkpoint.py",
    "train.checkpoint_at_end": "tests/train/test_checkpoint.py::test_the_manager_of_a_plan_takes_its_train_keys, "
                               "tests/train/test_preempt.py (false: none after the last step)",
    "train.keep_checkpoints": "tests/train/test_checkpoint.py, tests/e2e/test_resume.py",
    "train.resume": "tests/e2e/test_resume.py",
    "monitor.underflow_warn": "tests/train/test_monitor.py",
    "monitor.overflow_warn": "tests/train/test_monitor.py",
    "export.accelerate": "tests/test_accelerate_export.py",
    "train.tokenizer": "tests/train/test_data_formats.py (hf-dataset:, megatron:'s EOS, text:), tests/e2e/test_run_to_model.py",
    "eval.data": "tests/train/test_eval.py; tests/e2e/test_run_to_model.py (held-out loss in metrics.jsonl, bench's gate)",
    "eval.every": "tests/train/test_eval.py",
    "eval.steps": "tests/train/test_eval.py",
    "log.tensorboard": "tests/train/test_trackers.py (TensorBoard's EventAccumulator reads the scalars); tests/e2e/test_run_to_model.py",
    "log.wandb": "tests/train/test_trackers.py (the offline run file holds the history; resume continues the run id)",
    "log.mlflow": "tests/train/test_trackers.py (MLflow's client reads the metrics)",
}
"""Schema keys that are not options of a matrix, with where they are tested instead."""


def schema_keys(node: dict | None = None, prefix: str = "") -> list[str]:
    """Every leaf key of the spec's schema, dotted."""
    node = schema() if node is None else node
    out = []
    for key, sub in node.get("properties", {}).items():
        if sub.get("type") == "object" and "properties" in sub:
            out += schema_keys(sub, prefix + key + ".")
        else:
            out.append(prefix + key)
    return out


def _schema_node(key: str) -> dict:
    node = schema()
    for part in key.split("."):
        node = node["properties"][part]
    return node


@functools.cache
def _default(key: str) -> Any:
    value: Any = defaults()
    for part in key.split("."):
        value = value[part]
    return value


def values_of(option: Option) -> tuple:
    if option.values:
        return option.values
    node = _schema_node(option.key)
    if "enum" in node:
        return tuple(node["enum"])
    if node.get("type") == "boolean":
        return (False, True)
    raise ValueError(f"{option.key}: give the values to try (the schema lists none)")


# --- the specs ------------------------------------------------------------------------------------

CPU_BASE = {
    "launch.device": "cpu",
    "launch.env": {"OMP_NUM_THREADS": "1"},
    "distributed.procs_per_node": 2,
    "train.model": MODEL,
    "train.seq_len": 32,
    "train.micro_batch_size": 1,
    "train.steps": 2,
    "train.lr": 1e-3,
    "train.log_every": 1,
    "train.checkpoint_at_end": False,
    "precision.keep_first_last": False,
}
"""Every CPU run: the smallest shapes that still train every engine (2 blocks of llama-debug, 32 tokens). keep_first_last
off: both blocks then hold the same layers, so a compiled FP8 run builds one graph per block kind instead of two (the
first block's kept wq would recompile it: benchmarks/results/tooling_notes.md). Which
layers it keeps is tests/train/test_precision_select.py's; a compiled FP8 run with it on (two graphs):
tests/e2e/test_moe.py's compiled MXFP8 run."""

MOE_MODEL = "builtin:moe-debug"
MOE_BASE = {**CPU_BASE, "train.model": MOE_MODEL, "train.micro_batch_size": 2}
"""Every MoE run: 2 MoE blocks, 64 tokens a step per rank (128 routed rows at top-2)."""

NVME_PATH = "nvme"
"""distributed.deepspeed.nvme_path of the runs that offload to NVMe (relative: inside the run's folder)."""


def spec_of(config: dict[str, Any], name: str, base: dict[str, Any] = CPU_BASE) -> dict:
    """The spec (nested JSON) of one matrix run: the base, the run's options, and what they imply
    (skip_small off for FP8: llama-debug's GEMMs are all below torchao's size rule; an NVMe folder)."""
    flat = {"version": 1, "name": name, **base, **config}
    b = BACKENDS[flat.get("precision.backend", _default("precision.backend"))]
    b = BACKENDS[b.native_as] if b.native_as else b  # MS-AMP's levels run on torchao here (launcher/planning/levels.py)
    if flat.get("precision.mode") == "fp8" and b.shape_rules:
        flat[f"precision.{b.section}.skip_small"] = False
    if flat.get("distributed.tensor_parallel", 1) > flat.get("distributed.procs_per_node", 1):
        flat["distributed.procs_per_node"] = flat["distributed.tensor_parallel"]  # one GPU per TP rank
    if "nvme" in (flat.get("distributed.deepspeed.offload_optimizer"), flat.get("distributed.deepspeed.offload_param")):
        flat["distributed.deepspeed.nvme_path"] = NVME_PATH
    return nested(flat)


@functools.cache
def _refusal(spec_text: str, device: str) -> tuple[str, ...]:
    # Not validated here (thousands of calls): every option's values come from the schema, and
    # tests/test_support_matrix.py validates the spec of every run.
    # the project's own stack, where MS-AMP 0.4 (torch 2.1-2.2) cannot be installed: MS-AMP's levels plan natively
    plan: Plan = resolve(SpecSource(path="<matrix>", data=json.loads(spec_text), sha256=""), msamp_runs=lambda strategy: False)
    facts = Facts(plan=plan, device=device, libaio=False)
    errors = [f.rule.id for f in check(facts, "plan") + check(facts, "run") if f.is_error]
    return tuple(dict.fromkeys(errors))


def refusal(config: dict[str, Any], base: dict[str, Any] = CPU_BASE) -> tuple[str, ...]:
    """The ids of the error rules that refuse this run (plan stage, and run stage as far as the spec
    decides it); empty when it trains."""
    return _refusal(json.dumps(spec_of(config, "m", base), sort_keys=True), base.get("launch.device", "cpu"))


# --- pairwise generation --------------------------------------------------------------------------

Pair = tuple[tuple[str, Any], tuple[str, Any]]


@dataclass(frozen=True)
class Run:
    name: str
    config: dict[str, Any]
    """The options this run sets (the others keep their defaults)."""
    refused_by: tuple[str, ...] = ()
    """Error rule ids it must stop with; empty: it trains."""
    pair: Pair | None = None
    """For a refused run: the pair it stands for."""

    @property
    def exit_code(self) -> int:
        if not self.refused_by:
            return 0
        from launcher.planning.rules import RULES_BY_ID

        return 3 if RULES_BY_ID[self.refused_by[0]].stage == "run" else 2


@dataclass(frozen=True)
class Matrix:
    options: tuple[Option, ...]
    runs: tuple[Run, ...]
    pairs: frozenset
    """Every pair of values of two options that can apply together."""
    refused_pairs: frozenset = field(default_factory=frozenset)

    @property
    def trained(self) -> list[Run]:
        return [r for r in self.runs if not r.refused_by]

    @property
    def refused(self) -> list[Run]:
        return [r for r in self.runs if r.refused_by]

    def covered(self) -> set:
        """The pairs the runs cover: by a run that trains, or by the refused run standing for it."""
        out = set()
        for r in self.trained:
            out |= pairs_in(self.options, r.config)
        out |= {r.pair for r in self.refused}
        return out

    def modelled_cpu_s(self) -> float:
        """The CPU seconds its trained runs cost by `cost`, in order, from an empty compile cache."""
        built: set = set()
        total = 0.0
        for r in self.trained:
            total += cost(r.config, built) * EAGER_CPU_S
            built.add(graph_key(r.config))
        return total

    def graph_keys(self) -> set:
        return {graph_key(r.config) for r in self.trained} - {None}

    def graph_groups(self) -> dict[str, str]:
        """Run name -> the xdist group of the trained runs that share a graph key with another (tests/e2e/
        test_support_matrix.py marks them so): one worker runs them one after another, so every run after the first
        finds the first's graphs in inductor's cache. Two workers building the same graphs side by side both pay for
        them (CI from a cold machine: m01 and m02, 62 s each)."""
        by_key: dict[tuple, list[str]] = {}
        for r in self.trained:
            if (key := graph_key(r.config)) is not None:
                by_key.setdefault(key, []).append(r.name)
        return {name: f"graphs-{names[0]}" for names in by_key.values() if len(names) > 1 for name in names}

    def trains_the_monitor_in_compiled_fp8(self) -> bool:
        """Whether a trained run has the FP8 monitor's hooks inside compiled FP8 blocks (tests/e2e/test_support_matrix.py
        checks such a run's stats: the CPU matrix must keep one)."""
        return any(r.config.get("compile.enabled") and r.config.get("monitor.fp8_stats_every")
                   and r.config.get("precision.mode") == "fp8" for r in self.trained)

    def coverage_line(self) -> str:
        return (f"{len(self.runs)} runs cover all {len(self.pairs)} pairs: {len(self.trained)} train and cover "
                f"{len(self.pairs) - len(self.refused_pairs)}, {len(self.refused)} stop before training with the rule that "
                "refuses their pair")


def _assign(options: tuple[Option, ...], config: dict[str, Any]) -> dict[str, Any]:
    """The value of every option in this config: set, or its default (None where it does not apply)."""
    return {o.key: config.get(o.key, _default(o.key)) if o.applies(config) else None for o in options}


def pairs_in(options: tuple[Option, ...], config: dict[str, Any]) -> set:
    values = _assign(options, config)
    keys = [o.key for o in options if values[o.key] is not None]
    return {((a, values[a]), (b, values[b])) for a, b in itertools.combinations(keys, 2)}


def _requirements(options_by_key: dict[str, Option], key: str, value: Any) -> dict[str, Any] | None:
    """The smallest config that sets key=value and makes it apply (first allowed value of each requirement)."""
    config = {key: value}
    for req, allowed in options_by_key[key].requires:
        config[req] = allowed[0]
    return config


def _merge(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return None
    for k, v in b.items():
        if k in a and a[k] != v:
            return None
    return {**a, **b}


def all_pairs(options: tuple[Option, ...]) -> dict:
    """pair -> the smallest config that holds it, for every pair of values that can apply together."""
    by_key = {o.key: o for o in options}
    out = {}
    for (i, a), (j, b) in itertools.combinations(enumerate(options), 2):
        for va, vb in itertools.product(values_of(a), values_of(b)):
            config = _merge(_requirements(by_key, a.key, va), _requirements(by_key, b.key, vb))
            if config is not None and a.applies(config) and b.applies(config):
                out[((a.key, va), (b.key, vb))] = config
    return out


def trainable(options: tuple[Option, ...], config: dict[str, Any], base: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(a config that holds `config`, the error rules that still refuse it): every key `config` sets
    keeps its value, the other options change one at a time, each time to the value that leaves the
    fewest error rules, until none is left (it trains) or no change helps (the rule table refuses
    what `config` sets, and the config returned shows the fewest rules that do)."""
    config = dict(config)
    fixed = set(config)
    errors = refusal(config, base)
    while errors:
        best, fewest = None, errors
        for option in options:
            if option.key in fixed or not option.applies(config):
                continue
            for v in values_of(option):
                trial = {**config, option.key: v}
                found = refusal(trial, base)
                if len(found) < len(fewest):
                    best, fewest = trial, found
        if best is None:
            break
        config, errors = best, fewest
    return config, errors


SEED = 25
"""The CPU matrix's random choices (candidates' starting pairs, option order, ties); the MoE and GPU matrices keep 0
(the GPU results recorded so far follow their rows' configs). Every seed covers every pair; 25 gives the cheapest
matrix of seeds 0-79 by `Matrix.modelled_cpu_s` that keeps a compiled FP8 run with the monitor's hooks
(benchmarks/matrix_seed.py; the figures: benchmarks/results/matrix_seed.md and tooling_notes.md)."""


CANDIDATES = 16
"""Candidate runs grown per step of `generate` (more: fewer runs, slower generation)."""


WEIGHT = 1.0
"""How much a candidate's cost counts against the pairs it covers while covering the compiled pairs."""
WEIGHT_EAGER = 0.5
"""The same for the rest."""


def graph_key(config: dict[str, Any]) -> tuple | None:
    """What decides the graphs torch.compile builds for a block (None: not compiled). Runs with the same
    key find inductor's FX graph cache warm (one cache for the whole test run): measured, a DDP run and a DeepSpeed
    ZeRO-1/2 run share their graphs, FSDP2's and ZeRO-3's differ; compile.fullgraph and FSDP2's
    reshard_after_forward leave the graph as it is; the FP8 monitor's hooks (monitor.fp8_stats_every > 0 on FP8
    layers) are traced into it (CI from a cold machine: m08 rebuilt what m07 had built, the hooks being the difference);
    expert parallelism puts the token exchange between an MoE block's compiled parts."""
    if not config.get("compile.enabled"):
        return None
    get = lambda key: config.get(key, _default(key))  # noqa: E731
    strategy = get("distributed.strategy")
    if strategy == "deepspeed":
        strategy = "zero3" if get("distributed.deepspeed.zero_stage") == 3 else "ddp"
    fp8_hooks = get("precision.mode") == "fp8" and bool(get("monitor.fp8_stats_every"))
    return (strategy, get("precision.mode"), get("precision.torchao.recipe"), get("activation_checkpointing.mode"), fp8_hooks,
            get("distributed.expert_parallel"))


EAGER_CPU_S, WARM_CPU_S, NEW_GRAPH_CPU_S = 6.4, 16.0, 118.0
"""What a run costs in CPU seconds (user + sys of `fp8launch run` and its processes): an eager row, a compiled row whose
graphs inductor's cache holds, and one building them (how they were measured: benchmarks/results/tooling_notes.md). CPU
seconds, not wall: CI runs two tests at a time on two cores."""


def cost(config: dict[str, Any], built: set) -> float:
    """A run's cost in eager runs (see EAGER_CPU_S): a new graph key is the dear thing."""
    key = graph_key(config)
    if key is None:
        return 1.0
    return (WARM_CPU_S if key in built else NEW_GRAPH_CPU_S) / EAGER_CPU_S


def _grow(options: tuple[Option, ...], seed: dict[str, Any], uncovered: set, base: dict[str, Any], rng,
          rest: set = frozenset(), built: set = frozenset(), weight: float = 0.0) -> dict[str, Any]:
    """`seed` completed option by option (in a shuffled order, parents before the options they enable)
    with the value that covers the most `uncovered` pairs per cost (graphs in `built` are cheap) and
    still trains; then the most of `rest`; ties broken by `rng`."""
    config = dict(seed)
    order = list(options)
    rng.shuffle(order)
    changed = True
    while changed:  # an option becomes applicable once its parents are set: go round until nothing changes
        changed = False
        for option in order:
            if option.key in config or not option.applies(config):
                continue
            scored = []
            for v in values_of(option):
                trial = {**config, option.key: v}
                if refusal(trial, base):
                    continue
                covered = pairs_in(options, trial)
                scored.append((len(covered & uncovered) / cost(trial, built) ** weight, len(covered & rest), rng.random(), v))
            if scored:
                config[option.key] = max(scored)[-1]
                changed = True
    return {k: v for k, v in config.items() if any(o.key == k and o.applies(config) for o in options)}


def _compiled_pairs(pair: Pair) -> bool:
    return ("compile.enabled", True) in pair or any(k == "compile.fullgraph" for k, _ in pair)


def generate(options: tuple[Option, ...] = CPU_OPTIONS, base: dict[str, Any] = CPU_BASE, prefix: str = "m") -> Matrix:
    """The runs that cover every pair (see the module's docstring). Deterministic (and computed once per process)."""
    return _generate(options, json.dumps(base, sort_keys=True), prefix)


@functools.cache
def _generate(options: tuple[Option, ...], base_text: str, prefix: str) -> Matrix:
    base = json.loads(base_text)
    smallest = all_pairs(options)
    seeds, refused_pairs = {}, {}
    for pair, config in smallest.items():
        seed, errors = trainable(options, config, base)
        if errors:
            refused_pairs[pair] = (seed, errors)
        else:
            seeds[pair] = seed
    uncovered = list(seeds)
    runs: list[Run] = []
    rng = random.Random(SEED if prefix == "m" else 0)
    built: set = set()
    # Compiled runs are the dear ones: first cover the pairs only they can (compile on, fullgraph), each
    # run taking as many other pairs as it can; then the rest, where an eager run is the cheap choice.
    for phase, weight in ((_compiled_pairs, WEIGHT), (lambda p: True, WEIGHT_EAGER)):
        while todo := [p for p in uncovered if phase(p)]:
            left, rest = set(todo), set(uncovered)
            starts = [todo[0]] + rng.sample(todo, min(len(todo), CANDIDATES - 1))
            candidates = [_grow(options, seeds[p], left, base, rng, rest, built, weight) for p in starts]
            config = max(candidates, key=lambda c: (len(pairs_in(options, c) & left) + 0.01 * len(pairs_in(options, c) & rest))
                         / cost(c, built) ** weight)
            built.add(graph_key(config))
            covers = pairs_in(options, config)
            uncovered = [p for p in uncovered if p not in covers]
            runs.append(Run(name=f"{prefix}{len(runs) + 1:02d}", config=config))
    for pair, (config, ids) in sorted(refused_pairs.items(), key=lambda kv: (kv[1][1], repr(kv[0]))):
        runs.append(Run(name=f"{prefix}{len(runs) + 1:02d}", config=config, refused_by=ids, pair=pair))
    return Matrix(options=options, runs=tuple(runs), pairs=frozenset(smallest), refused_pairs=frozenset(refused_pairs))


# --- the document ---------------------------------------------------------------------------------

def _short(key: str) -> str:
    return key.split(".", 1)[1] if key.startswith(("distributed.", "precision.")) else key


def _cell(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _table(options: tuple[Option, ...], runs: Iterable[Run], last: str) -> list[str]:
    shown = [o for o in options]
    lines = ["| run | " + " | ".join(_short(o.key) for o in shown) + f" | {last} |",
             "|---" * (len(shown) + 2) + "|"]
    for r in runs:
        values = _assign(options, r.config)
        cells = ["" if values[o.key] is None else _cell(values[o.key]) for o in shown]
        outcome = ", ".join(r.refused_by) if r.refused_by else "trains"
        lines.append(f"| {r.name} | " + " | ".join(cells) + f" | {outcome} |")
    return lines


def _refused_section(matrix: Matrix) -> list[str]:
    """The refused pairs, grouped by the rules that refuse them."""
    by_rules: dict[tuple[str, ...], list[Run]] = {}
    for r in matrix.refused:
        by_rules.setdefault(r.refused_by, []).append(r)
    lines = ["| refused by | pairs (run names in the test ids) |", "|---|---|"]
    for rules, runs in sorted(by_rules.items()):
        pairs = "; ".join(f"{r.name}: `{_short(r.pair[0][0])} = {_cell(r.pair[0][1])}` "
                          f"with `{_short(r.pair[1][0])} = {_cell(r.pair[1][1])}`" for r in runs)
        lines.append(f"| {', '.join(rules)} | {pairs} |")
    return lines


def config_key(config: dict[str, Any]) -> str:
    """A run's identity in recorded results: its option values, not its row name (names follow the
    generation order and move when an option gains a value)."""
    return json.dumps(config, sort_keys=True)


def gpu_status(gpu: Matrix, results: dict[str, Any] | None) -> dict[str, str]:
    """{row name: outcome} for the GPU rows that recorded results name by their config."""
    recorded = {config_key(r["config"]): r["outcome"] for r in (results or {}).get("runs", [])}
    return {r.name: recorded[config_key(r.config)] for r in gpu.trained if config_key(r.config) in recorded}


def render_markdown(cpu: Matrix | None = None, gpu: Matrix | None = None, gpu_results: dict[str, Any] | None = None) -> str:
    cpu = cpu or generate(CPU_OPTIONS, CPU_BASE, "m")
    gpu = gpu or generate(GPU_OPTIONS, GPU_BASE, "g")
    moe = generate(MOE_OPTIONS, MOE_BASE, "e")
    status = gpu_status(gpu, gpu_results)
    out = [
        "# Support matrix",
        "",
        "Generated by `python -m tools.support_matrix --write` (`make support-matrix`) from the spec's schema and the",
        "rule table (tools/support_matrix.py); CI fails when this file is not current. An option is documented",
        "only if a run trained with it or a rule refuses it.",
        "",
        "## On CPU: trained for real in CI",
        "",
        "tests/e2e/test_support_matrix.py runs every row below through `fp8launch run` (torchrun, 2 processes over",
        f"gloo, `{MODEL}`, 32 tokens, 2 steps, inductor for compile, every Linear in FP8 in an FP8 run) and checks that",
        "it trains and that",
        "the start record's `effects` and `layers` follow the spec, computed there from the spec alone. Every refused",
        "pair must stop before torchrun with the rule named: exit 2 at planning, 3 for a run-stage rule.",
        "",
        f"**{cpu.coverage_line()}** (every pair of values of any two options that can apply together; an option",
        "applies only where what it needs holds: a recipe needs `precision.mode = \"fp8\"`, an FSDP2 setting the fsdp2",
        "strategy).",
        "",
        "Options: " + "; ".join(f"`{o.key}` " + "/".join(_cell(v) for v in values_of(o)) for o in cpu.options) + ".",
        "",
        "NVMe offload (`\"nvme\"`) needs libaio: where it is missing, its pairs are refused by DS-NVME-AIO; where it is",
        "installed (CI's machine has it), tests/e2e/test_support_matrix.py::test_nvme_offload_trains_where_libaio_is_installed",
        "trains ZeRO-3 with parameters and optimizer states swapped to NVMe (DeepSpeed builds its async_io op once, ~2.5 min).",
        "",
        "### Runs that train",
        "",
        *_table(cpu.options, cpu.trained, "outcome"),
        "",
        "### Pairs the rule table refuses",
        "",
        *_refused_section(cpu),
        "",
        "## Mixture-of-Experts on CPU: trained for real in CI",
        "",
        f"tests/e2e/test_support_matrix.py runs these rows with `{MOE_MODEL}` (2 MoE blocks of 8 experts, grouped GEMMs,",
        "router and shared expert) over FSDP2, 2 processes, 64 tokens a rank, 2 steps: each must train with its expert groups",
        "in the precision the layers map names (MXFP8 grouped GEMMs for mxfp8, bf16 where torchao has no grouped GEMM),",
        "`effects.compiled_blocks` counting both blocks where compile is on (an MoE block compiles in parts, as torchtitan",
        "compiles one: attention, norms, router, shared expert, and the experts' grouped GEMMs with a dynamic row count;",
        "the token exchange stays eager) and `effects.expert_parallel` the degree asked for.",
        "",
        f"**{moe.coverage_line()}.**",
        "",
        *_table(moe.options, moe.trained, "outcome"),
        "",
        *_refused_section(moe),
        "",
        "## On a CUDA GPU: tests/gpu only",
        "",
        "tests/gpu/test_support_matrix_gpu.py runs these rows where a GPU is present (one process, two for tensor",
        "parallel). Transformer Engine and MS-AMP cannot run on CPU (rule CPU-BACKEND), nor can async TP (TP-ASYNC-CPU).",
        "MS-AMP 0.4 cannot be installed beside this stack (it needs torch 2.1-2.2): a `backend = \"msamp\"` row under DDP",
        "or FSDP2 is planned and trains as its opt level's native keys on torchao (docs/precision.md), which also runs on CPU;",
        "under DeepSpeed (MS-AMP's own integration, which the native levels cannot express) it needs MS-AMP's environment.",
        "",
        f"**{gpu.coverage_line()}.**",
        "",
        *_table(gpu.options, gpu.trained, "outcome"),
        "",
        *_refused_section(gpu),
        "",
    ]
    if not status:
        out += [f"Status: **none of these has run on a GPU yet** (no results in {GPU_RESULTS.as_posix()}).", ""]
    else:
        out += [f"Status, from {GPU_RESULTS.as_posix()} ({gpu_results.get('device', '?')}, {gpu_results.get('date', '?')}): "
                + ", ".join(f"{k} {v}" for k, v in sorted(status.items())) + "; the others have not run on a GPU.", ""]
    rows = {config_key(r.config) for r in gpu.trained}
    earlier = [r for r in (gpu_results or {}).get("runs", []) if config_key(r["config"]) not in rows]
    if earlier:
        out += ["Recorded there for rows of an earlier matrix (the pairs moved to other rows since): "
                + "; ".join(f"{r['outcome']}: " + ", ".join(f"`{k} = {_cell(v)}`" for k, v in sorted(r["config"].items()))
                            for r in sorted(earlier, key=lambda r: config_key(r["config"]))) + ".", ""]
    out += ["## Options outside the matrices", "", "| key | tested in |", "|---|---|",
            *[f"| `{k}` | {v} |" for k, v in ELSEWHERE.items()], ""]
    return "\n".join(out)


GPU_BASE = {
    "launch.device": "cuda",
    "distributed.procs_per_node": 1,
    "train.model": "builtin:llama-debug?layers=2",
    "train.seq_len": 256,
    "train.micro_batch_size": 2,
    "train.steps": 2,
    "train.log_every": 1,
    "train.checkpoint_at_end": False,
}
"""Every GPU run: one process, two for a tensor-parallel run."""

GPU_RESULTS = Path("benchmarks") / "results" / "support_matrix_gpu.json"


def document(root: Path) -> str:
    """docs/support-matrix.md as it should read in the repository at `root`, with its GPU results."""
    results = json.loads((root / GPU_RESULTS).read_text()) if (root / GPU_RESULTS).exists() else None
    return render_markdown(gpu_results=results)


MATRICES: dict[str, tuple[tuple[Option, ...], dict[str, Any], str]] = {
    "cpu": (CPU_OPTIONS, CPU_BASE, "m"),
    "moe": (MOE_OPTIONS, MOE_BASE, "e"),
    "gpu": (GPU_OPTIONS, GPU_BASE, "g"),
}
"""Each matrix: its options, its base spec and the prefix of its run names."""


def rows_text() -> str:
    """docs/support-matrix.json as it should read: every matrix's runs, generated."""
    kinds = []
    for kind, (options, base, prefix) in MATRICES.items():
        matrix = generate(options, base, prefix)
        runs = [json.dumps({"name": r.name, "config": r.config,
                            **({"refused_by": list(r.refused_by), "pair": [list(p) for p in r.pair]} if r.refused_by else {})})
                for r in matrix.runs]
        kinds.append(f' "{kind}": {{"pairs": {len(matrix.pairs)}, "runs": [\n  ' + ",\n  ".join(runs) + "\n ]}")
    return "{\n" + ",\n".join(kinds) + "\n}\n"  # one run a line: diffs show which runs moved


@functools.cache
def load(kind: str, root: Path = Path(__file__).resolve().parents[1]) -> Matrix:
    """The committed runs of one matrix ("cpu", "moe", "gpu") from docs/support-matrix.json, without generating them."""
    options, _, _ = MATRICES[kind]
    data = json.loads((root / ROWS).read_text(encoding="utf-8"))[kind]
    runs = tuple(Run(name=r["name"], config=r["config"], refused_by=tuple(r.get("refused_by", ())),
                     pair=tuple(tuple(p) for p in r["pair"]) if "pair" in r else None) for r in data["runs"])
    return Matrix(options=options, runs=runs, pairs=frozenset(all_pairs(options)),
                  refused_pairs=frozenset(r.pair for r in runs if r.refused_by))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.support_matrix",
                                     description="write or check docs/support-matrix.md and docs/support-matrix.json")
    parser.add_argument("--write", action="store_true", help="write docs/support-matrix.md and .json")
    parser.add_argument("--check", action="store_true", help="exit 1 when either is not current")
    parser.add_argument("--root", default=".", help="the repository root")
    args = parser.parse_args(argv)
    root = Path(args.root)
    files = {root / DOC: document(root), root / ROWS: rows_text()}
    if args.check:
        stale = [path for path, text in files.items() if (path.read_text(encoding="utf-8") if path.exists() else "") != text]
        for path in stale:
            print(f"{path} is not current; regenerate it: python -m tools.support_matrix --write", file=sys.stderr)
        return 1 if stale else 0
    if args.write:
        for path, text in files.items():
            path.write_text(text, encoding="utf-8")
        return 0
    sys.stdout.write(files[root / DOC])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
