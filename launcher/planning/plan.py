"""Resolve a validated spec into one frozen, typed Plan: defaults filled, `{name}` expanded,
derived values computed. Everything after validation takes a Plan, never a raw dict."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Literal

from launcher.errors import Problem, SpecError
from launcher.planning.layout import Layout, stages_a_rank
from launcher.planning.layout import even_split as even_split  # the importer reads it here (commands/importer/planable.py)
from launcher.planning.models import MAX_LAYERS
from launcher.planning.msamp_levels import as_native, native_level
from launcher.planning.read import MAX_RANKS, SpecSource, defaults, dotted, one_line

frozen = dataclass(frozen=True, kw_only=True, slots=True)

# The values of schema.json's enums, as the types of the fields that hold them (an alias where a field's type is long
# or shared). tests/test_plan_types.py holds every Literal to its schema enum and every enum to a Literal field.
Mode = Literal["fp32", "fp16", "bf16", "fp8"]
"""precision.mode, precision.schedule[].mode."""
HighPrecision = Literal["bf16", "fp16", "fp32"]
"""precision.high_precision, precision.rules[].mode."""
Backend = Literal["torchao", "te", "msamp"]
TorchaoRecipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8", "nvfp4"]
TERecipe = Literal["delayed", "current", "block", "mxfp8", "nvfp4"]
TESwap = Literal["linear", "layernorm", "rmsnorm"]
MsampLevel = Literal["O1", "O2", "O3"]
OptimizerStates = Literal["fp32", "bf16", "fp8", "int8"]
GradReduce = Literal["auto", "fp32", "bf16", "fp8"]
MasterWeights = Literal["fp32", "bf16"]
Strategy = Literal["ddp", "fsdp2", "deepspeed"]
Offload = Literal["none", "cpu", "nvme"]
"""distributed.deepspeed.offload_optimizer / offload_param."""
ZeroStage = Literal[0, 1, 2, 3]
PipelineSchedule = Literal["1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
ACMode = Literal["none", "full", "selective"]
Launcher = Literal["torchrun", "slurm", "kubernetes"]
Device = Literal["auto", "cuda", "cpu"]
GPU = Literal["auto", "h100", "h200", "b200", "a100", "l40s", "mi300x"]
KubernetesAPI = Literal["trainjob", "pytorchjob"]
Optimizer = Literal["adamw", "adam", "sgd"]
WandbMode = Literal["", "online", "offline"]


@frozen
class TorchaoConfig:
    recipe: TorchaoRecipe
    """tensorwise | rowwise | rowwise_with_gw_hp (Float8LinearConfig) | mxfp8 | nvfp4 (block-scaled, Blackwell)"""
    fsdp_float8_all_gather: bool
    """FSDP2 all-gathers weights in float8."""
    precompute_scale: bool
    """precompute_float8_dynamic_scale_for_fsdp after each optimizer step."""
    skip_small: bool
    """Keep small Linears and dims not divisible by 16 in high precision."""
    pad_inner_dim: bool
    """Pad the inner GEMM dim to a multiple of 16."""


@frozen
class TEConfig:
    recipe: TERecipe
    """delayed | current | block | mxfp8 | nvfp4"""
    fp8_format: Literal["HYBRID", "E4M3"]
    """HYBRID (E4M3 forward, E5M2 gradients) | E4M3"""
    margin: int
    amax_history_len: int
    amax_compute_algo: Literal["max", "most_recent"]
    reduce_amax: bool
    fp8_dpa: bool
    fp8_mha: bool
    fp8_params: bool
    """Weights kept in FP8 (quantized_model_init)."""
    swap: tuple[TESwap, ...]
    """Module kinds replaced by TE modules: linear, layernorm, rmsnorm."""
    interval: int | None = None
    """Removed in TE 2.2; present only so rule TE-REMOVED-KEY can name it."""
    override_linear_precision: typing.Any = None
    """Removed in TE 2.2; present only so rule TE-REMOVED-KEY can name it."""


@frozen
class MsampConfig:
    opt_level: MsampLevel
    """O1 | O2 | O3"""
    use_te: bool


@frozen
class PrecisionRule:
    """One `[[precision.rules]]` entry: the Linears whose name matches `match` keep `mode` or run `recipe`."""

    match: str
    mode: HighPrecision | None = None
    """bf16 | fp16 | fp32: kept in this precision."""
    recipe: str | None = None
    """Another recipe of precision.backend."""


@frozen
class PrecisionPhase:
    """One `[[precision.schedule]]` entry: from `at_step` (or `at_fraction` of train.steps) on, the fields it
    sets (not None) replace the precision's."""

    at_step: int | None = None
    at_fraction: float | None = None
    mode: Mode | None = None
    recipe: str | None = None
    keep_last_blocks: int | None = None
    rules: tuple[PrecisionRule, ...] | None = None


@frozen
class PrecisionConfig:
    mode: Mode
    """fp32 | fp16 | bf16 | fp8"""
    backend: Backend
    """torchao | te | msamp (fp8 only)"""
    high_precision: HighPrecision
    """bf16 | fp16 | fp32: dtype of everything not in FP8."""
    keep_first_last: bool
    keep_first_blocks: int
    """Transformer blocks at the start whose Linears stay in high precision."""
    keep_last_blocks: int
    """Transformer blocks at the end whose Linears stay in high precision."""
    rules: tuple[PrecisionRule, ...]
    """Per-module precision, first match wins (before keep, keep_first_last and the kept blocks)."""
    schedule: tuple[PrecisionPhase, ...]
    """Later precision phases (launcher/planning/schedule.py)."""
    keep: tuple[str, ...]
    """fnmatch globs of module FQNs kept in high precision."""
    optimizer_states: OptimizerStates = "fp32"
    """fp32 | bf16 | fp8 | int8: dtype of Adam's moments (launcher/train/optim_lowbit.py)."""
    grad_reduce: GradReduce = "auto"
    """auto | fp32 | bf16 | fp8: payload of the gradient all-reduce / reduce-scatter (launcher/train/parallel/grad_reduce.py)."""
    master_weights: MasterWeights = "fp32"
    """fp32 | bf16: bf16 parameters updated with stochastic rounding, no fp32 copy."""
    torchao: TorchaoConfig
    te: TEConfig
    msamp: MsampConfig

    @property
    def fp8(self) -> bool:
        return self.mode == "fp8"

    @property
    def compute_dtype(self) -> str:
        """dtype of activations and of everything that is not an FP8 GEMM."""
        return self.high_precision if self.fp8 else self.mode


@frozen
class FSDP2Config:
    reshard_after_forward: bool
    reduce_dtype: Literal["fp32", "bf16"]
    cpu_offload: bool


@frozen
class DeepSpeedConfig:
    zero_stage: ZeroStage
    offload_optimizer: Offload
    """none | cpu | nvme: where optimizer states live (cpu: DeepSpeed's CPU Adam steps them)."""
    offload_param: Offload
    """none | cpu | nvme (ZeRO-3)."""
    nvme_path: str = ""
    """The folder DeepSpeed swaps to with "nvme" (required then)."""
    overlap_comm: bool
    contiguous_gradients: bool
    reduce_bucket_size: int


def stage_blocks(split: typing.Sequence[int], stage: int) -> range:
    """The indices of the blocks pipeline stage `stage` holds, from the blocks per stage."""
    first = sum(split[:stage])
    return range(first, first + split[stage])


def block_ranges(indices: list[int]) -> str:
    """[0, 1, 4, 5] -> "0-1, 4-5"; [3] -> "3-3" (as a single stage's blocks have always read)."""
    out, start = [], 0
    for i in range(1, len(indices) + 1):
        if i == len(indices) or indices[i] != indices[i - 1] + 1:
            out.append(f"{indices[start]}-{indices[i - 1]}")
            start = i
    return ", ".join(out)


@frozen
class PipelineConfig:
    schedule: PipelineSchedule
    """1F1B | GPipe: torch.distributed.pipelining's Schedule1F1B / ScheduleGPipe."""
    microbatches: int
    """Pipeline micro-batches per optimizer step (0 = one sequence each)."""
    layers_per_stage: tuple[int, ...]
    """Blocks on each stage, first stage first; () = an even split."""
    stages_per_rank: int = 0
    """Stages each pipeline rank holds; 0 = the schedule's own (1, or 2 for Interleaved1F1B / ZBVZeroBubble). Defaulted: a
    plan.json written before the key existed reads as 0."""

    @property
    def local_stages(self) -> int:
        """Stages on each pipeline rank, resolved."""
        return stages_a_rank(self.schedule, self.stages_per_rank)


@frozen
class DistributedConfig:
    strategy: Strategy
    """ddp | fsdp2 | deepspeed"""
    nodes: int
    procs_per_node: int
    global_batch_size: int
    """Resolved: micro_batch_size * grad_accum_steps * world_size when the spec says 0."""
    tensor_parallel: int
    """Tensor-parallel degree inside a node; FSDP2 shards over world_size / tensor_parallel."""
    async_tp: bool
    """torch's async tensor parallel (compile + CUDA)."""
    expert_parallel: int
    """MoE expert-parallel degree: divides the number of experts and the world size; 1 = off."""
    context_parallel: int
    """Ranks each sequence is split over (torch's context_parallel); 1 = off. The mesh is pp x dp_shard x cp x tp."""
    pipeline_parallel: int
    """Pipeline stages (torch.distributed.pipelining); 1 = off. The mesh is pp x dp_shard x cp x tp."""
    pipeline: PipelineConfig
    fsdp2: FSDP2Config
    deepspeed: DeepSpeedConfig

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def layout(self, world_size: int | None = None) -> Layout:
        """The parallel layout of `world_size` ranks (default: the plan's nodes x procs_per_node) under these degrees."""
        return Layout.of_degrees(self.world_size if world_size is None else world_size, tp=self.tensor_parallel,
                                 cp=self.context_parallel, pp=self.pipeline_parallel, ep=self.expert_parallel,
                                 schedule=self.pipeline.schedule, stages_per_rank=self.pipeline.stages_per_rank,
                                 layers_per_stage=tuple(self.pipeline.layers_per_stage))

    @property
    def data_parallel(self) -> int:
        """Ranks that hold different data (the layout's dp: at least 1; a layout the degrees do not divide is refused by
        TP-DIVIDES-PROCS / PP-DIVIDES-WORLD / CP-DIVIDES-WORLD, whose messages are computed from it)."""
        return self.layout().dp

    @property
    def pipeline_stages(self) -> int:
        """Pipeline stages in all: pipeline_parallel x the stages each pipeline rank holds."""
        return self.layout().pipeline_stages

    def stage_split(self, n_layers: int) -> tuple[int, ...]:
        """Blocks on each pipeline stage, first stage first: layers_per_stage, or an even split (rule PP-LAYERS refuses
        an uneven one at plan time)."""
        return self.layout().stage_split(n_layers)


@frozen
class CompileConfig:
    enabled: bool
    mode: CompileMode
    """default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs (torch.compile's mode)"""
    fullgraph: bool


@frozen
class ActivationCheckpointingConfig:
    mode: ACMode
    """none | full | selective"""


@frozen
class SlurmConfig:
    partition: str
    account: str
    time: str
    extra_sbatch: tuple[str, ...]
    gpus_per_node: int
    """0: procs_per_node on a GPU plan, none on CPU."""
    cpus_per_task: int
    signal_seconds: int
    """SIGTERM this many seconds before the time limit (#SBATCH --signal); 0: none."""


@frozen
class KubernetesConfig:
    api: KubernetesAPI
    """trainjob (Kubeflow Trainer v2) | pytorchjob (training-operator v1)"""
    image: str
    namespace: str
    runtime: str
    """The ClusterTrainingRuntime a TrainJob refers to."""
    gpus_per_node: int
    """0: procs_per_node (none on CPU)."""
    volume_claim: str
    """PersistentVolumeClaim mounted at train.output_dir on every node."""
    workdir: str
    """The container's working directory: relative spec paths resolve from it (absolute)."""


@frozen
class LaunchConfig:
    launcher: Launcher
    """torchrun | slurm | kubernetes"""
    device: Device
    """auto | cuda | cpu"""
    gpu: GPU
    """The GPU planned for (speed prediction, memory check): auto (= h100) | h100 | h200 | b200 | a100 | l40s | mi300x."""
    rdzv_endpoint: str
    rdzv_backend: Literal["c10d"]
    max_restarts: int
    env: dict[str, str]
    slurm: SlurmConfig
    kubernetes: KubernetesConfig


@frozen
class TrainConfig:
    model: str
    data: str
    tokenizer: str
    """A tokenizer.json or a folder holding one; "" = none."""
    seq_len: int
    micro_batch_size: int
    grad_accum_steps: int
    steps: int
    optimizer: Optimizer
    """adamw | adam | sgd"""
    lr: float
    weight_decay: float
    weight_decay_exclude: Literal["none", "norms_and_biases"]
    """none | norms_and_biases: one-dimensional parameters (norm weights, biases) get no weight decay."""
    adam_betas: tuple[float, ...]
    """Adam / AdamW (beta1, beta2)."""
    adam_eps: float
    warmup_steps: int
    min_lr_ratio: float
    """The cosine decay ends at this fraction of lr."""
    max_grad_norm: float
    seed: int
    output_dir: str
    """With `{name}` replaced by the spec name."""
    log_every: int
    checkpoint_every: int
    checkpoint_at_end: bool
    """Write a checkpoint after the last step."""
    keep_checkpoints: int
    resume: str
    on_nan: Literal["stop", "skip"]
    """stop | skip: on a non-finite loss or grad norm, stop all ranks or skip the optimizer step."""


@frozen
class MonitorConfig:
    fp8_stats_every: int
    """Steps between FP8 numerics samples (fp8_stats.jsonl); 0 = off."""
    underflow_warn: float
    """Warn when a layer's share of nonzero values flushed to zero in FP8 exceeds this."""
    overflow_warn: float
    """Warn when a layer's share of values saturating at the FP8 max exceeds this."""


@frozen
class EvalConfig:
    data: str
    """Held-out data in the forms of train.data; "" = no evaluation."""
    every: int
    """Steps between evaluations; 0 = once after the last step."""
    steps: int
    """Batches per evaluation."""

    @property
    def enabled(self) -> bool:
        return bool(self.data)

    def due(self, step: int, total_steps: int) -> bool:
        """Whether an evaluation follows optimizer step `step`."""
        if not self.data:
            return False
        return step == total_steps or (self.every > 0 and step % self.every == 0)


WANDB_DEFAULTS = {"enabled": False, "project": "", "entity": "", "mode": ""}
"""log.wandb's keys as plan.json keeps them; "" = what the environment says (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE),
else W&B's own default (the spec name for the project, online): the spec wins only where it says something."""


class WandbConfig(typing.TypedDict):
    """log.wandb as plan.json keeps it (normalize_wandb): "" = what the environment says."""

    enabled: bool
    project: str
    entity: str
    mode: WandbMode


@frozen
class LogConfig:
    tensorboard: bool
    wandb: WandbConfig
    """{"enabled", "project", "entity", "mode"}: the spec's `true` / `false` / [log.wandb] table, normalized."""
    mlflow: bool

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers this run writes to, in a fixed order."""
        on = {"tensorboard": self.tensorboard, "wandb": self.wandb["enabled"], "mlflow": self.mlflow}
        return tuple(name for name, enabled in on.items() if enabled)


def normalize_wandb(value) -> WandbConfig:
    """log.wandb as written (a bool, or a table that turns it on) -> the one dict form plan.json keeps."""
    if isinstance(value, dict):
        return {**WANDB_DEFAULTS, "enabled": True, **value} if "enabled" not in value else {**WANDB_DEFAULTS, **value}
    return {**WANDB_DEFAULTS, "enabled": bool(value)}


@frozen
class ExportConfig:
    accelerate: bool
    """Also write accelerate.yaml."""


@frozen
class Plan:
    """The fully resolved spec plus what is derived from it; what plan.json holds."""

    version: int
    name: str
    precision: PrecisionConfig
    distributed: DistributedConfig
    compile: CompileConfig
    activation_checkpointing: ActivationCheckpointingConfig
    launch: LaunchConfig
    train: TrainConfig
    monitor: MonitorConfig
    eval: EvalConfig
    log: LogConfig
    export: ExportConfig
    spec_sha256: str = ""
    """sha256 of the spec file's bytes (before --set overrides)."""
    spec_dir: str = "."
    """The spec's folder, relative to the folder plan.json is written to (for user factories and data)."""
    overrides: tuple[str, ...] = ()
    """The --set KEY=VALUE arguments applied on top of the file, in order."""
    present: frozenset[str] = field(default_factory=frozenset)
    """Dotted paths of the sections the spec file wrote explicitly (rule SECTION-UNUSED reads it)."""
    msamp_native: str = ""
    """The MS-AMP opt level a `backend = "msamp"` spec named, where the plan gives it natively (its precision is then
    torchao with the level's keys: launcher/planning/levels.py); "" for every other plan."""

    @property
    def world_size(self) -> int:
        return self.distributed.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.distributed.global_batch_size * self.train.seq_len

    @property
    def pipeline_microbatches(self) -> int:
        """Pipeline micro-batches per optimizer step: distributed.pipeline.microbatches, or (0) one sequence each of the
        train.micro_batch_size x train.grad_accum_steps a data-parallel rank reads per step."""
        return self.distributed.pipeline.microbatches or self.train.micro_batch_size * self.train.grad_accum_steps


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) and base.get(k) else v
    return out


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _optional_tuple(hint):
    """`tuple[X, ...]` when `hint` is `tuple[X, ...] | None`, else None."""
    args = typing.get_args(hint)
    if type(None) in args:
        return next((a for a in args if typing.get_origin(a) is tuple), None)
    return None


def _int_literal(hint) -> bool:
    """Whether `hint` is a Literal of ints only (distributed.deepspeed.zero_stage): a float such as 2.0 becomes 2."""
    args = typing.get_args(hint)
    return typing.get_origin(hint) is Literal and all(type(a) is int for a in args)


@functools.cache
def _fields(cls) -> tuple[tuple[str, str, typing.Any], ...]:
    """(name, kind, type) of each field of dataclass `cls`: kind "class" (a nested config), "tuple" (of the type, or
    None), "int", "float" or "" (taken as it is). Worked out once per class: `resolve` runs thousands of times when the
    support matrix is generated."""
    hints, out = _hints(cls), []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.append((f.name, "class", hint))
        elif typing.get_origin(hint) is tuple or _optional_tuple(hint):
            hint = hint if typing.get_origin(hint) is tuple else _optional_tuple(hint)
            out.append((f.name, "tuple", typing.get_args(hint)[0]))
        else:
            out.append((f.name, "int" if hint is int or _int_literal(hint) else "float" if hint is float else "", hint))
    return tuple(out)


def _build(cls, data: dict):
    """Construct dataclass `cls` from `data`, recursing into nested config classes."""
    kwargs = {}
    for name, kind, hint in _fields(cls):
        if name not in data:
            continue
        value = data[name]
        if kind == "class":
            value = _build(hint, value)
        elif kind == "tuple":
            value = None if value is None else tuple(_build(hint, v) if dataclasses.is_dataclass(hint) else v for v in value)
        elif kind == "int" and isinstance(value, float):
            value = int(value)
        elif kind == "float" and isinstance(value, int):
            value = float(value)
        kwargs[name] = value
    return cls(**kwargs)


def _present_sections(data: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in data.items():
        if isinstance(v, dict):
            out.add(prefix + k)
            out |= _present_sections(v, prefix + k + ".")
    return out


def resolve(source: SpecSource, *, msamp_runs: typing.Callable[[str], bool] | None = None) -> Plan:
    """Validated spec -> Plan. spec_dir is the spec's absolute folder until the planner knows where
    plan.json goes (pipeline.plan_one makes it relative to that folder). A backend = "msamp" spec is planned as its
    opt level's native keys where MS-AMP's stack is not installed (`msamp_runs(strategy)`, default: this machine's;
    launcher/planning/levels.py)."""
    data = _merge(defaults(), source.data)
    data.pop("$schema", None)
    d, t = data["distributed"], data["train"]
    if not d["global_batch_size"]:
        # Data-parallel ranks only: the ranks of one tensor- or context-parallel group, and the stages of one pipeline, train on
        # the same sequences.
        split = math.prod(max(1, d[k]) for k in ("tensor_parallel", "context_parallel", "pipeline_parallel"))
        dp = d["nodes"] * d["procs_per_node"] // split
        d["global_batch_size"] = t["micro_batch_size"] * t["grad_accum_steps"] * max(1, dp)
    t["output_dir"] = t["output_dir"].replace("{name}", data["name"])
    data["log"]["wandb"] = normalize_wandb(data["log"]["wandb"])
    level = native_level(data, msamp_runs)  # backend = "msamp" where MS-AMP's stack is not installed: its level natively
    if level:
        as_native(data, level)
    plan = _build(Plan, data)
    _check_sizes(source, plan)
    return dataclasses.replace(
        plan,
        msamp_native=level or "",
        spec_sha256=source.sha256,
        spec_dir=spec_dir_from(source.path, None),
        overrides=tuple(source.overridden.values()),
        present=frozenset(_present_sections(source.data)),
    )


def _check_sizes(source: SpecSource, plan: Plan) -> None:
    """Bounds that depend on two keys, checked before anything is sized from them (SpecError): the processes of the job,
    and the pipeline stages (each holds a block, and the plan lists them one by one)."""
    d, problems = plan.distributed, []

    def problem(key: str, message: str) -> None:
        path = tuple(key.split("."))
        origin = source.overridden.get(path)
        suffix = f" (from --set {one_line(origin)})" if origin else ""
        problems.append(Problem(source.path, message + suffix, path=dotted(path), line=source.line(path)))

    if plan.world_size > MAX_RANKS:
        problem("distributed.procs_per_node", f"{d.nodes} nodes x {d.procs_per_node} processes is {plan.world_size} ranks, more "
                f"than torch.distributed's {MAX_RANKS}; fix: lower distributed.nodes or distributed.procs_per_node")
    if d.pipeline_stages > MAX_LAYERS:
        problem("distributed.pipeline_parallel", f"{d.pipeline_parallel} x {d.pipeline.local_stages} stages a rank is "
                f"{d.pipeline_stages} pipeline stages, more than the {MAX_LAYERS} blocks a model may have (each stage holds at "
                "least one); fix: lower distributed.pipeline_parallel or distributed.pipeline.stages_per_rank")
    if problems:
        raise SpecError(sorted(problems, key=lambda p: p.line or 0))


def spec_dir_from(spec_path: str, out_dir: str | None) -> str:
    """The spec's folder relative to `out_dir` (where plan.json goes), or absolute without one."""
    spec_dir = os.path.dirname(os.path.abspath(spec_path))
    rel = os.path.relpath(spec_dir, os.path.abspath(out_dir)) if out_dir else spec_dir
    return rel.replace(os.sep, "/")


def load_plan(path: str) -> Plan:
    """Read a plan.json written by `fp8launch plan` back into a Plan (the entrypoint's way in)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data.pop("derived", None)
    data.pop("fp8launch_version", None)
    data["present"] = frozenset()
    return _build(Plan, data)


def plan_field_paths(cls=Plan, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every config key path the Plan types define (a test compares it with the schema)."""
    hints = typing.get_type_hints(cls)
    out = set()
    for f in dataclasses.fields(cls):
        if prefix == () and f.name in ("spec_sha256", "spec_dir", "overrides", "present", "msamp_native"):
            continue
        out.add(prefix + (f.name,))
        if dataclasses.is_dataclass(hints[f.name]):
            out |= plan_field_paths(hints[f.name], prefix + (f.name,))
    return out
