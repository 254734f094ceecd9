"""The table of known-bad combinations, and the one function that checks a plan against it.

Each rule is data: an id, a severity, the stage it is checked at ("plan": from the spec
alone; "run": needs facts about the machine or the model), a condition, why it is bad
(with its source), and the fix naming the exact spec key to change.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Callable

from .hardware import FP8_MIN_CAPABILITY, capability_text, requirement, supports

if typing.TYPE_CHECKING:
    from .plan import Plan


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


@dataclass(frozen=True, slots=True)
class Finding:
    rule: Rule
    message: str

    @property
    def is_error(self) -> bool:
        return self.rule.severity == "error"

    def __str__(self) -> str:
        return f"{self.rule.severity}[{self.rule.id}]: {self.message} fix: {self.rule.fix}"


def _fp8(f: Facts, backend: str | None = None) -> bool:
    p = f.plan.precision
    return p.mode == "fp8" and (backend is None or p.backend == backend)


def _strategy(f: Facts) -> str:
    return f.plan.distributed.strategy


def _unused_sections(f: Facts) -> list[str]:
    plan, present = f.plan, f.plan.present
    p = plan.precision
    reads = {
        "precision.torchao": p.mode == "fp8" and p.backend == "torchao",
        "precision.te": p.mode == "fp8" and p.backend == "te",
        "precision.msamp": p.mode == "fp8" and p.backend == "msamp",
        "distributed.fsdp2": _strategy(f) == "fsdp2",
        "distributed.deepspeed": _strategy(f) == "deepspeed",
        "launch.slurm": plan.launch.launcher == "slurm",
    }
    return [section for section, read in reads.items() if section in present and not read]


def _ds_both(f: Facts) -> bool:
    import json

    text = f.rendered.get("deepspeed.json")
    if not text:
        return False
    cfg = json.loads(text)
    return bool(cfg.get("fp16", {}).get("enabled")) and bool(cfg.get("bf16", {}).get("enabled"))


def _accelerate_unsupported(f: Facts) -> str:
    p = f.plan.precision
    if p.mode == "fp8" and p.backend == "torchao" and p.torchao.recipe != "tensorwise":
        return f"precision.torchao.recipe = {p.torchao.recipe!r}"
    if p.mode == "fp8" and p.backend == "te" and p.te.recipe not in ("delayed", "mxfp8"):
        return f"precision.te.recipe = {p.te.recipe!r}"
    return ""


def _derived_batch(f: Facts) -> int:
    t, d = f.plan.train, f.plan.distributed
    return t.micro_batch_size * t.grad_accum_steps * d.world_size


RULES: tuple[Rule, ...] = (
    Rule(id="FP8-DDP-COMPILE", severity="error", stage="plan",
         when="fp8 + torchao + strategy ddp + compile.enabled",
         why="torchao float8 under DDP with torch.compile fails in DDPOptimizer's graph splitting (pytorch/ao#2586, ao#1308; Axolotl docs).",
         fix='set distributed.strategy = "fsdp2", or compile.enabled = false',
         condition=lambda f: _fp8(f, "torchao") and _strategy(f) == "ddp" and f.plan.compile.enabled),
    Rule(id="FP8-ALLGATHER-STRATEGY", severity="error", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather and strategy != fsdp2",
         why="float8 all-gather is an FSDP2 feature; other strategies would ignore it (Axolotl validator).",
         fix='set distributed.strategy = "fsdp2", or precision.torchao.fsdp_float8_all_gather = false',
         condition=lambda f: _fp8(f, "torchao") and f.plan.precision.torchao.fsdp_float8_all_gather and _strategy(f) != "fsdp2"),
    Rule(id="FP8-ALLGATHER-RECIPE", severity="error", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather and recipe != tensorwise",
         why="torchao asserts that float8 all-gather needs tensorwise weight scaling.",
         fix='set precision.torchao.recipe = "tensorwise", or precision.torchao.fsdp_float8_all_gather = false',
         condition=lambda f: _fp8(f, "torchao") and f.plan.precision.torchao.fsdp_float8_all_gather and f.plan.precision.torchao.recipe != "tensorwise"),
    Rule(id="FP8-NO-COMPILE", severity="warning", stage="plan",
         when="fp8 + torchao without compile",
         why="without torch.compile, float8 casts are not fused: usually slower and more memory than bf16 (Axolotl docs, ao#2262).",
         fix="set compile.enabled = true",
         condition=lambda f: _fp8(f, "torchao") and not f.plan.compile.enabled),
    Rule(id="FP8-AC-COMPILE-SLOW", severity="warning", stage="plan",
         when="fp8 + fsdp2 + compile + activation_checkpointing != none",
         why="FP8 with FSDP2, compile and activation checkpointing tends to be slower than bf16 (Axolotl docs).",
         fix='measure with `fp8launch bench`; or set activation_checkpointing.mode = "none"',
         condition=lambda f: _fp8(f) and _strategy(f) == "fsdp2" and f.plan.compile.enabled and f.plan.activation_checkpointing.mode != "none"),
    Rule(id="TE-DELAYED-COMPILE", severity="error", stage="plan",
         when='te recipe "delayed" + compile.enabled',
         why='Transformer Engine: "DelayedScaling is not supported under torch.compile" (check_recipe_support).',
         fix='set precision.te.recipe = "current", or compile.enabled = false',
         condition=lambda f: _fp8(f, "te") and f.plan.precision.te.recipe == "delayed" and f.plan.compile.enabled),
    Rule(id="TE-BLOCK-FP8-ATTENTION", severity="error", stage="plan",
         when='te recipe "block" with fp8_dpa or fp8_mha',
         why="Transformer Engine's Float8BlockScaling does not support FP8 attention (its recipe asserts fp8_dpa and fp8_mha are off).",
         fix="set precision.te.fp8_dpa = false and precision.te.fp8_mha = false, or precision.te.recipe = \"current\"",
         condition=lambda f: _fp8(f, "te") and f.plan.precision.te.recipe == "block" and (f.plan.precision.te.fp8_dpa or f.plan.precision.te.fp8_mha)),
    Rule(id="TE-REMOVED-KEY", severity="error", stage="plan",
         when="precision.te.interval or precision.te.override_linear_precision present",
         why="these DelayedScaling arguments were removed in Transformer Engine 2.2; fp8launch says so instead of ignoring them.",
         fix="delete precision.te.interval and precision.te.override_linear_precision",
         condition=lambda f: f.plan.precision.te.interval is not None or f.plan.precision.te.override_linear_precision is not None,
         detail=lambda f: "precision.te." + " and precision.te.".join(
             k for k in ("interval", "override_linear_precision") if getattr(f.plan.precision.te, k) is not None)
             + " was removed in Transformer Engine 2.2."),
    Rule(id="TE-RECIPE-HARDWARE", severity="error", stage="run",
         when="te recipe mxfp8/nvfp4 on a GPU below compute capability 10.0 (mxfp8 also not on 12.0+); block below 9.0",
         why="Transformer Engine's hardware checks: MXFP8/NVFP4 need Blackwell (sm100+), and TE 2.20 refuses MXFP8 on sm120; block scaling needs Hopper (sm90+).",
         fix='set precision.te.recipe = "current" (or "delayed"), or run on a newer GPU',
         condition=lambda f: _fp8(f, "te") and f.capability is not None and f.plan.precision.te.recipe in ("block", "mxfp8", "nvfp4")
             and not supports(f.capability, "fp8", "te", f.plan.precision.te.recipe),
         detail=lambda f: f"TE recipe {f.plan.precision.te.recipe!r} needs {requirement('fp8', 'te', f.plan.precision.te.recipe)}; this GPU has {capability_text(f.capability)}."),
    Rule(id="MSAMP-FSDP2", severity="error", stage="plan",
         when="msamp + strategy fsdp2",
         why="MS-AMP supports FSDP1 only, not FSDP2.",
         fix='set distributed.strategy = "ddp" or "deepspeed"',
         condition=lambda f: _fp8(f, "msamp") and _strategy(f) == "fsdp2"),
    Rule(id="MSAMP-ZERO3", severity="error", stage="plan",
         when="msamp + deepspeed zero_stage 3",
         why="MS-AMP asserts ZeRO stage 1 or 2 (MS-AMP#182, #130).",
         fix="set distributed.deepspeed.zero_stage = 2",
         condition=lambda f: _fp8(f, "msamp") and _strategy(f) == "deepspeed" and f.plan.distributed.deepspeed.zero_stage == 3),
    Rule(id="MSAMP-O3-STRATEGY", severity="error", stage="plan",
         when="msamp opt_level O3 + strategy != deepspeed",
         why="MS-AMP's O3 exists only through its DeepSpeed integration (FP8 ZeRO optimizer).",
         fix='set distributed.strategy = "deepspeed", or precision.msamp.opt_level = "O2"',
         condition=lambda f: _fp8(f, "msamp") and f.plan.precision.msamp.opt_level == "O3" and _strategy(f) != "deepspeed"),
    Rule(id="MSAMP-OPTIMIZER", severity="error", stage="plan",
         when="msamp + optimizer not adam/adamw",
         why="msamp.initialize accepts only Adam and AdamW optimizers.",
         fix='set train.optimizer = "adamw"',
         condition=lambda f: _fp8(f, "msamp") and f.plan.train.optimizer not in ("adam", "adamw")),
    Rule(id="FP16-BF16-BOTH", severity="error", stage="plan",
         when="the rendered deepspeed.json enables both fp16 and bf16",
         why="DeepSpeed asserts that fp16 and bf16 are not both enabled (a hand-edited template can do it).",
         fix="enable one of them in templates/deepspeed.json.j2, or set precision.high_precision to one dtype",
         condition=_ds_both),
    Rule(id="BATCH-MISMATCH", severity="error", stage="plan",
         when="global_batch_size != micro_batch_size * grad_accum_steps * nodes * procs_per_node",
         why="DeepSpeed asserts train_batch_size == micro * accum * world size; checked before launch for every strategy.",
         fix="set distributed.global_batch_size = 0 (derive it), or change train.micro_batch_size / train.grad_accum_steps",
         condition=lambda f: f.plan.distributed.global_batch_size != _derived_batch(f),
         detail=lambda f: f"distributed.global_batch_size = {f.plan.distributed.global_batch_size} but micro_batch_size {f.plan.train.micro_batch_size} * grad_accum_steps {f.plan.train.grad_accum_steps} * world size {f.plan.world_size} = {_derived_batch(f)}."),
    Rule(id="SECTION-UNUSED", severity="warning", stage="plan",
         when="a backend/strategy/launcher section is present that the chosen one never reads",
         why="a section nothing reads is a silent no-op; that is how Accelerate configs go wrong (misnamed keys ignored).",
         fix="delete the section, or choose the backend/strategy/launcher that reads it",
         condition=lambda f: bool(_unused_sections(f)),
         detail=lambda f: "; ".join(f"[{s}] is ignored with this plan" for s in _unused_sections(f)) + "."),
    Rule(id="DS-OFFLOAD-PARAM-STAGE", severity="error", stage="plan",
         when="deepspeed offload_param != none with zero_stage != 3",
         why="DeepSpeed offloads parameters only under ZeRO stage 3.",
         fix='set distributed.deepspeed.zero_stage = 3, or distributed.deepspeed.offload_param = "none"',
         condition=lambda f: _strategy(f) == "deepspeed" and f.plan.distributed.deepspeed.offload_param != "none" and f.plan.distributed.deepspeed.zero_stage != 3),
    Rule(id="DS-ON-NAN-SKIP", severity="error", stage="plan",
         when='train.on_nan = "skip" with strategy deepspeed',
         why="DeepSpeed applies the accumulated gradients inside its own step(), so a non-finite step cannot be skipped from outside.",
         fix='set train.on_nan = "stop", or distributed.strategy = "fsdp2"',
         condition=lambda f: _strategy(f) == "deepspeed" and f.plan.train.on_nan == "skip"),
    Rule(id="CPU-BACKEND", severity="error", stage="plan",
         when='launch.device = "cpu" with backend te or msamp',
         why="Transformer Engine and MS-AMP run only on CUDA GPUs; torchao FP8 is the backend that runs on CPU.",
         fix='set precision.backend = "torchao", or launch.device = "cuda"',
         condition=lambda f: (_fp8(f, "te") or _fp8(f, "msamp")) and f.plan.launch.device == "cpu"),
    Rule(id="ACCELERATE-UNSUPPORTED", severity="error", stage="plan",
         when="export.accelerate with a recipe Accelerate's config file cannot select (torchao rowwise*, TE current/block/nvfp4)",
         why="accelerate.yaml selects torchao's default (tensorwise) and TE's DelayedScaling or MXFP8 only; writing it anyway would train with another recipe than the spec says.",
         fix='set export.accelerate = false (train with `fp8launch run`), or precision.torchao.recipe = "tensorwise" / precision.te.recipe = "delayed" or "mxfp8"',
         condition=lambda f: f.plan.export.accelerate and bool(_accelerate_unsupported(f)),
         detail=lambda f: f"accelerate.yaml cannot express {_accelerate_unsupported(f)}."),
    Rule(id="FP8-HARDWARE", severity="error", stage="run",
         when="fp8 on a CUDA GPU below compute capability 8.9",
         why="FP8 GEMMs need Ada, Hopper or Blackwell (sm89+); fp8launch never falls back silently to bf16/fp16 (Accelerate does).",
         fix='set precision.mode = "bf16", or run on an sm89+ GPU (L4, L40, H100, H200, B200)',
         condition=lambda f: _fp8(f) and f.device == "cuda" and f.capability is not None and f.capability < FP8_MIN_CAPABILITY,
         detail=lambda f: f"FP8 needs {requirement('fp8')}; this GPU has {capability_text(f.capability)}."),
    Rule(id="FP8-NOT-APPLIED", severity="error", stage="run",
         when="fp8 requested but zero Linear layers were converted",
         why="a run that asks for FP8 and trains in high precision is a silent fallback (LlamaFactory #9500).",
         fix="check precision.keep, precision.keep_first_last and precision.torchao.skip_small (or use a model whose Linear dims are multiples of 16)",
         condition=lambda f: _fp8(f) and f.fp8_layers == 0),
    Rule(id="BACKEND-MISSING", severity="error", stage="run",
         when="the chosen backend package is not importable",
         why="the backend package is needed to apply the precision the spec asks for.",
         fix="install it: torchao: pip install 'fp8launch[torchao]'; te: pip install 'fp8launch[te]'; msamp: build MS-AMP from source (github.com/Azure/MS-AMP); deepspeed: pip install 'fp8launch[deepspeed]'",
         condition=lambda f: f.missing_package is not None,
         detail=lambda f: f"the {f.missing_package} package is not importable here."),
    # --- issue 10: real-scale memory and GPU-only faults ---
    Rule(id="MEMORY-EXCEEDS-GPU", severity="warning", stage="plan",
         when="the memory estimate (model states + activations) of a GPU plan exceeds the memory of launch.gpu",
         why="the run would stop with CUDA out-of-memory at the first step; the estimate leaves out temporary buffers and fragmentation, so it is a lower bound.",
         fix='set activation_checkpointing.mode = "full" (or "selective"), add GPUs (distributed.procs_per_node / distributed.nodes), '
             "offload (distributed.fsdp2.cpu_offload = true, or distributed.deepspeed.offload_optimizer), or lower train.micro_batch_size / train.seq_len",
         condition=lambda f: _memory_excess(f) is not None,
         detail=lambda f: _memory_excess(f)),
    Rule(id="TE-FP8-PARAMS-NO-MASTER", severity="error", stage="plan",
         when="precision.te.fp8_params with DDP or FSDP2 (or an fp32 DeepSpeed run)",
         why="quantized_model_init keeps only FP8 weights, and the plain torch optimizer these engines use keeps no fp32 master copy: "
             "every update would be rounded to FP8 and small updates lost. Only DeepSpeed's bf16/fp16 ZeRO optimizer keeps fp32 master weights.",
         fix='set precision.te.fp8_params = false, or distributed.strategy = "deepspeed" with precision.high_precision = "bf16"',
         condition=lambda f: _fp8(f, "te") and f.plan.precision.te.fp8_params and not _has_master_weights(f)),
)

RULES_BY_ID = {r.id: r for r in RULES}


def check(facts: Facts, stage: str = "plan") -> list[Finding]:
    """Every rule of `stage` whose condition holds for `facts`, errors first."""
    found = [Finding(r, r.detail(facts) if r.detail else r.why) for r in RULES if r.stage == stage and r.condition(facts)]
    return sorted(found, key=lambda f: not f.is_error)


def _has_master_weights(f: Facts) -> bool:
    """Whether the engine's optimizer keeps fp32 master weights apart from the stored ones."""
    return _strategy(f) == "deepspeed" and f.plan.precision.compute_dtype in ("bf16", "fp16")


def _memory_excess(f: Facts) -> str | None:
    """'the estimate ... exceeds ...' when a GPU plan's estimated peak does not fit launch.gpu, else None."""
    plan = f.plan
    if plan.launch.device == "cpu":
        return None
    from .gpus import plan_gpu
    from .memory import estimate, model_params

    params = model_params(plan.train.model)
    if not params:
        return None
    est = estimate(plan, params)
    gpu = plan_gpu(plan.launch.gpu)
    peak = est.peak_bytes / 2**30
    if peak <= gpu.memory_gib:
        return None
    acts = f", activations {est.activations.bytes / 2**30:.1f} GiB" if est.activations else ""
    return (f"the estimate is {peak:.1f} GiB per GPU (model states {est.total_bytes / 2**30:.1f} GiB{acts}) "
            f"but a {gpu.name} has {gpu.memory_gib:g} GiB.")
