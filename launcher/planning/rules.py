"""The table of known-bad combinations, and the one function that checks a plan against it.

Each rule is data: an id, a severity, the stage it is checked at ("plan": from the spec
alone; "run": needs facts about the machine or the model), a condition, why it is bad
(with its source), and the fix naming the exact spec key to change.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Callable

from launcher.errors import with_fix
from launcher.planning.backends import BACKENDS, MSAMP, TE, TORCHAO, Backend, backend_of
from launcher.planning.install import INSTALL
from launcher.planning.hardware import BLOCK_RECIPES, FP8_MIN_CAPABILITY, capability_text, precision_key, requirement, supports
from launcher.planning.hardware import BLOCK_SIZE
from launcher.planning.models import builtin_config, is_moe
from launcher.planning.selection import reason_fix, reason_key, unmatched, unmatched_globs
from launcher.planning import te_attention

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


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
    kept: tuple[str, ...] = ()
    """Why each Linear the run keeps in high precision was kept (one reason per layer), at run time."""
    foreign_matmuls: tuple[str, ...] = ()
    """Type names of the model's weight-matrix layers that are not nn.Linear (no backend converts them), at run time."""
    prediction: typing.Any = None
    """The speed prediction (launcher.planning.predict.Prediction) when planning made one."""
    spec_folder: str | None = None
    """The spec file's folder, absolute, where planning knows it (an hf: model's relative path is read from there)."""
    msamp_stack: str | None = None
    """Why the installed MS-AMP cannot run next to the installed packages (launcher.planning.stack), at run time."""
    libaio: bool | None = None
    """Whether libaio (DeepSpeed's NVMe offload) is on this machine, at run time; None: not looked."""
    missing_effects: tuple[str, ...] = ()
    """Features the spec asks for that the run's setup did not take (launcher/train/effects.py), at run time."""
    torchao_mx_supported: bool | None = None
    """Whether the installed torch has what torchao's MXFP8 training asserts, at run time; None: not looked."""


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
    fix_for: Callable[[Facts], str] | None = field(default=None, repr=False)
    """Optional: the fix for these facts, naming only what would change something (else `fix`)."""

    def fix_of(self, facts: Facts | None) -> str:
        return self.fix_for(facts) if self.fix_for and facts is not None else self.fix


@dataclass(frozen=True, slots=True)
class Finding:
    rule: Rule
    message: str
    fix: str = ""
    """The fix for these facts (the rule's own when empty)."""

    @property
    def is_error(self) -> bool:
        return self.rule.severity == "error"

    def __str__(self) -> str:
        return f"{self.rule.severity}[{self.rule.id}]: {self.text}"

    @property
    def text(self) -> str:
        """The message and the rule's fix, as every error line says them."""
        return with_fix(self.message, self.fix or self.rule.fix)


def _ac_slow(f: Facts) -> str | None:
    """Why activation checkpointing costs FP8 its gain here (the prediction with it below 1.0, without it at or above),
    or None: not FSDP2 + compile + checkpointing, no prediction, a CPU run, or FP8 gains (or loses) either way."""
    p = f.plan
    pr = f.prediction
    if not (_fp8(f) and _strategy(f) == "fsdp2" and p.compile.enabled and p.activation_checkpointing.mode != "none"
            and _speed_matters(f) and pr is not None and pr.fp8_vs_bf16 is not None and pr.fp8_vs_bf16 < 1.0):
        return None
    import dataclasses

    from launcher.planning.predict import predict

    without = predict(dataclasses.replace(p, activation_checkpointing=dataclasses.replace(p.activation_checkpointing, mode="none")),
                      f.spec_folder or p.spec_dir)
    if without.fp8_vs_bf16 is None or without.fp8_vs_bf16 < 1.0:
        return None
    return (f"predicted FP8 tokens/s on {pr.gpus} x {pr.gpu} is {pr.fp8_vs_bf16:.2f}x bf16's with activation_checkpointing.mode = "
            f"\"{p.activation_checkpointing.mode}\" and {without.fp8_vs_bf16:.2f}x without: the recompute of each checkpointed block's "
            "forward, with its casts, costs more than its FP8 GEMMs save.")


def _counted(reasons) -> list[tuple[str, int]]:
    """(reason, how many) for each distinct reason, the most frequent first."""
    counts: dict[str, int] = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


MSAMP_OWN_ENVIRONMENT = ("run MS-AMP in its own environment (torch 2.1-2.2, Transformer Engine 1.1-1.7, DeepSpeed 0.13.1: "
                         "its Docker image ghcr.io/azure/msamp)")
"""Where MS-AMP 0.4 still runs (rule MSAMP-STACK)."""


def _speed_matters(f: Facts) -> bool:
    """A GPU run: on launch.device = "cpu" FP8 runs torch's reference kernels for numerics and the pipeline, and
    advice about GPU speed is noise (a CPU smoke spec would fail `plan --strict` for nothing)."""
    return f.plan.launch.device != "cpu"


def _fp8(f: Facts, backend: Backend | None = None) -> bool:
    """An FP8 plan (with this backend)."""
    b = backend_of(f.plan.precision)
    return b is not None and (backend is None or b is backend)


def _strategy(f: Facts) -> str:
    return f.plan.distributed.strategy


def _unused_sections(f: Facts) -> list[str]:
    plan, present = f.plan, f.plan.present
    p = plan.precision
    reads = {
        **{f"precision.{b.section}": backend_of(p) is b for b in BACKENDS.values()},
        "distributed.fsdp2": _strategy(f) == "fsdp2",
        "distributed.deepspeed": _strategy(f) == "deepspeed",
        "launch.slurm": plan.launch.launcher == "slurm",
        "launch.kubernetes": plan.launch.launcher == "kubernetes",
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
    if p.mode == "fp8" and (p.keep_first_blocks or p.keep_last_blocks):
        return "precision.keep_first_blocks / keep_last_blocks"
    b = backend_of(p)
    if b is not None and b.accelerate_recipes is not None and b.recipe(p) not in b.accelerate_recipes:
        return f"{b.recipe_key} = {b.recipe(p)!r}"
    return ""


def _moe(f: Facts) -> bool:
    """The plan trains a builtin MoE shape (hf:/py: models are only known at run time)."""
    return bool(_builtin_experts(f))


EXPERTS_NAME = "layers.1.moe.experts"
ROUTER_EXAMPLES = ("layers.0.moe.router.gate", "model.layers.0.mlp.gate", "model.layers.0.block_sparse_moe.gate")


def _expert_rule(f: Facts):
    """The [[precision.rules]] entry that decides the builtin MoE's experts, or None."""
    import fnmatch

    return next((r for r in f.plan.precision.rules if fnmatch.fnmatchcase(EXPERTS_NAME, r.match)), None) if _moe(f) else None


def _expert_recipe(f: Facts) -> str | None:
    """The recipe the builtin MoE's experts get (a [[precision.rules]] entry first), None when kept by mode or no MoE."""
    if not _moe(f):
        return None
    p = f.plan.precision
    rule = _expert_rule(f)
    if rule is not None:
        return rule.recipe or None
    b = BACKENDS[p.backend]
    return b.recipe(p) if b.grouped_experts else b.name


def _moe_router_rules(f: Facts) -> list[str]:
    """The match globs of [[precision.rules]] recipe entries that name a router gate: the builtin MoE's
    (for a builtin MoE model), or, for hf:/py: models, a glob that says gate or router."""
    import fnmatch

    model = f.plan.train.model
    names = ROUTER_EXAMPLES[:1] if _moe(f) else ROUTER_EXAMPLES if not model.startswith("builtin:") else ()
    return [r.match for r in f.plan.precision.rules if r.recipe and any(fnmatch.fnmatchcase(n, r.match) for n in names)
            and (_moe(f) or "gate" in r.match or "router" in r.match)]


def _derived_batch(f: Facts) -> int:
    t, d = f.plan.train, f.plan.distributed
    return t.micro_batch_size * t.grad_accum_steps * d.data_parallel


def _batch_ranks(f: Facts) -> str:
    d = f.plan.distributed
    if d.tensor_parallel > 1:
        return f"data-parallel ranks {d.data_parallel} (world size {d.world_size} / tensor_parallel {d.tensor_parallel})"
    return f"world size {d.world_size}"


RULES: tuple[Rule, ...] = (
    Rule(id="FP8-DDP-COMPILE", severity="error", stage="plan",
         when="fp8 + torchao + strategy ddp + compile.enabled",
         why="torchao float8 under DDP with torch.compile fails in DDPOptimizer's graph splitting (pytorch/ao#2586, ao#1308; Axolotl docs).",
         fix='set distributed.strategy = "fsdp2", or compile.enabled = false',
         condition=lambda f: _fp8(f, TORCHAO) and _strategy(f) == "ddp" and f.plan.compile.enabled),
    Rule(id="FP8-ALLGATHER-STRATEGY", severity="error", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather and strategy != fsdp2",
         why="float8 all-gather is an FSDP2 feature; other strategies would ignore it (Axolotl validator).",
         fix='set distributed.strategy = "fsdp2", or precision.torchao.fsdp_float8_all_gather = false',
         condition=lambda f: _fp8(f, TORCHAO) and f.plan.precision.torchao.fsdp_float8_all_gather and _strategy(f) != "fsdp2"),
    Rule(id="FP8-ALLGATHER-RECIPE", severity="error", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather and recipe != tensorwise",
         why="torchao asserts that float8 all-gather needs tensorwise weight scaling.",
         fix='set precision.torchao.recipe = "tensorwise", or precision.torchao.fsdp_float8_all_gather = false',
         condition=lambda f: _fp8(f, TORCHAO) and f.plan.precision.torchao.fsdp_float8_all_gather and f.plan.precision.torchao.recipe != "tensorwise"),
    Rule(id="MOE-ROUTER-FP8", severity="error", stage="plan",
         when="a [[precision.rules]] entry with a recipe matches an MoE router gate (*.moe.router.gate, Hugging Face *.mlp.gate)",
         why="the router's scores pick each token's experts: FP8 noise there flips the top-k choice, so torchtitan computes the gate in fp32 and fp8launch always keeps it in high precision; the rule would be ignored.",
         fix='narrow that precision.rules entry\'s match so it leaves the router gate out (e.g. "*.moe.experts" or "*.attention.*")',
         condition=lambda f: _fp8(f, TORCHAO) and bool(_moe_router_rules(f)),
         detail=lambda f: f"[[precision.rules]] match = {_moe_router_rules(f)[0]!r} puts the MoE router gate into FP8."),
    Rule(id="MOE-ROWWISE-CPU", severity="error", stage="plan",
         when="rowwise FP8 for the grouped experts of an MoE model with launch.device = cpu",
         why="torchao's FP8 rowwise grouped GEMM (Float8TrainingOpConfig) runs torch._scaled_grouped_mm, a CUDA kernel for sm90+; only MXFP8 has emulated grouped GEMMs for the CPU.",
         fix='set precision.torchao.recipe = "mxfp8" (emulated grouped GEMMs on CPU), or launch.device = "cuda"',
         condition=lambda f: _fp8(f, TORCHAO) and f.plan.launch.device == "cpu" and _expert_recipe(f) == "rowwise",
         fix_for=lambda f: (f"set the recipe of the precision.rules entry {_expert_rule(f).match!r} to \"mxfp8\" (emulated grouped GEMMs "
                            'on CPU), or launch.device = "cuda"') if _expert_rule(f) else RULES_BY_ID["MOE-ROWWISE-CPU"].fix),
    Rule(id="MOE-ROWWISE-HARDWARE", severity="error", stage="run",
         when="rowwise FP8 for the grouped experts of an MoE model on a GPU below compute capability 9.0",
         why="torch._scaled_grouped_mm (torchao's FP8 rowwise grouped GEMM) has kernels for sm90 and sm100 only; an sm89 GPU runs FP8 Linears but not grouped FP8 GEMMs.",
         fix='set precision.torchao.recipe = "tensorwise" (experts stay in bf16) or run on an H100 / B200',
         condition=lambda f: _fp8(f, TORCHAO) and f.device == "cuda" and f.capability is not None and f.capability < (9, 0)
         and _expert_recipe(f) == "rowwise"),
    Rule(id="MOE-EXPERTS-HP", severity="warning", stage="plan",
         when="fp8 with an MoE model whose experts' recipe has no grouped GEMM (torchao tensorwise / rowwise_with_gw_hp / nvfp4; te; msamp)",
         why="the expert weights (most of an MoE's FLOPs) stay in bf16: torchao 0.18 has grouped FP8 GEMMs for rowwise and mxfp8 only; Transformer Engine and MS-AMP convert nn.Linear only.",
         fix='set precision.backend = "torchao" and precision.torchao.recipe = "mxfp8" or "rowwise", or add [[precision.rules]] match = "*.moe.experts" recipe = "mxfp8"',
         condition=lambda f: _fp8(f) and _moe(f) and _expert_recipe(f) not in (None, "rowwise", "mxfp8"),
         detail=lambda f: f"the experts of {f.plan.train.model} stay in bf16 with {_expert_recipe(f) or f.plan.precision.backend}."),
    Rule(id="MOE-ALLGATHER-EXPERTS", severity="warning", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather with an MoE model",
         why="torchao's float8 all-gather applies to Float8Linear weights only; the 3D expert weights (torchao's MoE-training wrapper all-gathers them in the param dtype) and tensorwise experts (not converted) are all-gathered in bf16, so most of an MoE's all-gather bytes do not shrink.",
         fix="set precision.torchao.fsdp_float8_all_gather = false, or keep it for the attention and shared-expert Linears knowing the experts gather in bf16",
         condition=lambda f: _fp8(f, TORCHAO) and f.plan.precision.torchao.fsdp_float8_all_gather and _moe(f)),
    Rule(id="FP8-NO-COMPILE", severity="warning", stage="plan",
         when='fp8 + torchao without compile (on a GPU: not for launch.device = "cpu")',
         why="without torch.compile, float8 casts are not fused: usually slower and more memory than bf16 (Axolotl docs, ao#2262).",
         fix="set compile.enabled = true",
         condition=lambda f: _fp8(f, TORCHAO) and not f.plan.compile.enabled and _speed_matters(f)),
    Rule(id="FP8-AC-COMPILE-SLOW", severity="warning", stage="plan",
         when="fp8 + fsdp2 + compile + activation_checkpointing != none, where the prediction says the recompute turns FP8's gain "
              "into a loss (it gains without checkpointing); a GPU run",
         why="FP8 with FSDP2, compile and activation checkpointing tends to be slower than bf16 (Axolotl docs): the recompute "
             "repeats each checkpointed block's forward with its casts. Said where the prediction supports it, not as blanket "
             "advice (torchtitan's and Axolotl's own recommended setups gain).",
         fix='measure with `fp8launch bench --profile`; or set activation_checkpointing.mode = "selective" (or "none" where memory allows)',
         condition=lambda f: _ac_slow(f) is not None, detail=lambda f: _ac_slow(f)),
    Rule(id="TE-DELAYED-COMPILE", severity="error", stage="plan",
         when='te recipe "delayed" + compile.enabled',
         why='Transformer Engine: "DelayedScaling is not supported under torch.compile" (check_recipe_support).',
         fix='set precision.te.recipe = "current", or compile.enabled = false',
         condition=lambda f: _fp8(f, TE) and f.plan.precision.te.recipe == "delayed" and f.plan.compile.enabled),
    Rule(id="TE-BLOCK-FP8-ATTENTION", severity="error", stage="plan",
         when='te recipe "block" with fp8_dpa or fp8_mha',
         why="Transformer Engine's Float8BlockScaling does not support FP8 attention (its recipe asserts fp8_dpa and fp8_mha are off).",
         fix="set precision.te.fp8_dpa = false and precision.te.fp8_mha = false, or precision.te.recipe = \"current\"",
         condition=lambda f: _fp8(f, TE) and f.plan.precision.te.recipe == "block" and (f.plan.precision.te.fp8_dpa or f.plan.precision.te.fp8_mha)),
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
         condition=lambda f: _fp8(f, TE) and f.capability is not None and f.plan.precision.te.recipe in TE.capability
             and not supports(f.capability, "fp8", TE.name, f.plan.precision.te.recipe),
         detail=lambda f: f"TE recipe {f.plan.precision.te.recipe!r} needs {requirement('fp8', TE.name, f.plan.precision.te.recipe)}; this GPU has {capability_text(f.capability)}."),
    Rule(id="MSAMP-FSDP2", severity="error", stage="plan",
         when="msamp + strategy fsdp2",
         why="MS-AMP supports FSDP1 only, not FSDP2.",
         fix='set distributed.strategy = "ddp" or "deepspeed"',
         condition=lambda f: _fp8(f, MSAMP) and _strategy(f) == "fsdp2"),
    Rule(id="MSAMP-ZERO3", severity="error", stage="plan",
         when="msamp + deepspeed zero_stage 3",
         why="MS-AMP asserts ZeRO stage 1 or 2 (MS-AMP#182, #130).",
         fix="set distributed.deepspeed.zero_stage = 2",
         condition=lambda f: _fp8(f, MSAMP) and _strategy(f) == "deepspeed" and f.plan.distributed.deepspeed.zero_stage == 3),
    Rule(id="MSAMP-O3-STRATEGY", severity="error", stage="plan",
         when="msamp opt_level O3 + strategy != deepspeed",
         why="MS-AMP's O3 exists only through its DeepSpeed integration (FP8 ZeRO optimizer).",
         fix='set distributed.strategy = "deepspeed", or precision.msamp.opt_level = "O2"',
         condition=lambda f: _fp8(f, MSAMP) and f.plan.precision.msamp.opt_level == "O3" and _strategy(f) != "deepspeed"),
    Rule(id="MSAMP-OPTIMIZER", severity="error", stage="plan",
         when="msamp + optimizer not adam/adamw",
         why="msamp.initialize accepts only Adam and AdamW optimizers.",
         fix='set train.optimizer = "adamw"',
         condition=lambda f: _fp8(f, MSAMP) and f.plan.train.optimizer not in ("adam", "adamw")),
    Rule(id="FP16-BF16-BOTH", severity="error", stage="plan",
         when="the rendered deepspeed.json enables both fp16 and bf16",
         why="DeepSpeed asserts that fp16 and bf16 are not both enabled (a hand-edited template can do it).",
         fix="enable one of them in templates/deepspeed.json.j2, or set precision.high_precision to one dtype",
         condition=_ds_both),
    Rule(id="BATCH-MISMATCH", severity="error", stage="plan",
         when="global_batch_size != micro_batch_size * grad_accum_steps * nodes * procs_per_node / tensor_parallel",
         why="DeepSpeed asserts train_batch_size == micro * accum * world size; checked before launch for every strategy.",
         fix="set distributed.global_batch_size = 0 (derive it), or change train.micro_batch_size / train.grad_accum_steps",
         condition=lambda f: f.plan.distributed.global_batch_size != _derived_batch(f),
         detail=lambda f: f"distributed.global_batch_size = {f.plan.distributed.global_batch_size} but micro_batch_size {f.plan.train.micro_batch_size} * grad_accum_steps {f.plan.train.grad_accum_steps} * {_batch_ranks(f)} = {_derived_batch(f)}."),
    # -- expert parallelism (distributed.expert_parallel; launcher/train/expert_parallel.py) --
    Rule(id="EP-DIVIDES-WORLD", severity="error", stage="plan",
         when="distributed.expert_parallel does not divide the world size (nodes x procs_per_node)",
         why="the EP mesh is (world_size / ep) x ep: every group of ep adjacent ranks shares the experts of each MoE layer.",
         fix="set distributed.expert_parallel to a divisor of distributed.nodes x procs_per_node",
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and f.plan.world_size % f.plan.distributed.expert_parallel != 0,
         detail=lambda f: f"distributed.expert_parallel = {f.plan.distributed.expert_parallel} does not divide the world size {f.plan.world_size}."),
    Rule(id="EP-DIVIDES-EXPERTS", severity="error", stage="plan",
         when="distributed.expert_parallel does not divide a builtin MoE model's number of experts (hf: / py: models: checked at run time)",
         why="each EP rank holds num_experts / ep whole experts (their weights sharded Shard(0) on the expert dimension).",
         fix="set distributed.expert_parallel to a divisor of the model's number of experts",
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and bool(_builtin_experts(f))
                             and _builtin_experts(f) % f.plan.distributed.expert_parallel != 0,
         detail=lambda f: (f"distributed.expert_parallel = {f.plan.distributed.expert_parallel} does not divide the "
                           f"{_builtin_experts(f)} experts of {f.plan.train.model}.")),
    Rule(id="EP-DENSE-MODEL", severity="error", stage="plan",
         when="distributed.expert_parallel > 1 with a dense builtin model (hf: / py: models: checked at run time)",
         why="expert parallelism shards the experts of MoE layers; a dense model has none, and the ranks would only duplicate work.",
         fix='set distributed.expert_parallel = 1, or train an MoE model (train.model = "builtin:moe-debug")',
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and _builtin_experts(f) == 0),
    Rule(id="EP-STRATEGY", severity="error", stage="plan",
         when="distributed.expert_parallel > 1 with strategy ddp or deepspeed",
         why="fp8launch composes expert parallelism with FSDP2 only (experts sharded over the EP dimension, FSDP2 over world / ep for them and over all ranks for the dense parameters); DDP and DeepSpeed ZeRO do not handle DTensor experts.",
         fix='set distributed.strategy = "fsdp2", or distributed.expert_parallel = 1',
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and _strategy(f) in ("ddp", "deepspeed")),
    Rule(id="EP-TENSOR-PARALLEL", severity="error", stage="plan",
         when="distributed.expert_parallel > 1 with distributed.tensor_parallel > 1",
         why="fp8launch does not compose expert and tensor parallelism (a 3D mesh, and a TP plan for the MoE model, which has none).",
         fix="set distributed.tensor_parallel = 1 or distributed.expert_parallel = 1",
         condition=lambda f: f.plan.distributed.expert_parallel > 1 and f.plan.distributed.tensor_parallel > 1),
    Rule(id="SECTION-UNUSED", severity="warning", stage="plan",
         when="a backend/strategy/launcher section is present that the chosen one never reads",
         why="a section nothing reads is a silent no-op; that is how Accelerate configs go wrong (misnamed keys ignored).",
         fix="delete the section, or choose the backend/strategy/launcher that reads it",
         condition=lambda f: bool(_unused_sections(f)),
         detail=lambda f: "; ".join(f"[{s}] is ignored with this plan" for s in _unused_sections(f)) + "."),
    Rule(id="EVAL-NOT-HELD-OUT", severity="warning", stage="plan",
         when="eval.data names the same file or factory as train.data (synthetic excepted)",
         why="an evaluation on the data the run trains on measures fit, not generalization: the FP8-vs-bf16 comparison [eval] "
             "exists for needs batches neither trained on (eval.data = \"synthetic\" draws from streams no rank trains on).",
         fix="point eval.data at a held-out split (another file, prefix or dataset folder)",
         condition=lambda f: f.plan.eval.data not in ("", "synthetic") and f.plan.eval.data == f.plan.train.data),
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
         condition=lambda f: (_fp8(f, TE) or _fp8(f, MSAMP)) and f.plan.launch.device == "cpu",
         fix_for=lambda f: _msamp_level_fix(f, 'set launch.device = "cuda"') if _fp8(f, MSAMP) else RULES_BY_ID["CPU-BACKEND"].fix),
    Rule(id="ACCELERATE-UNSUPPORTED", severity="error", stage="plan",
         when="export.accelerate with a recipe Accelerate's config file cannot select (torchao rowwise*, TE current/block/nvfp4), or kept blocks",
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
         condition=lambda f: _fp8(f) and f.fp8_layers == 0,
         detail=lambda f: ("a run that asks for FP8 and trains in high precision is a silent fallback (LlamaFactory #9500)."
                           + (f" The model's matrix layers are {', '.join(f.foreign_matmuls)}, not nn.Linear: no FP8 backend converts "
                              "that module type (transformers' Conv1D is converted for you); write the model with nn.Linear"
                              if f.foreign_matmuls else "")
                           + (f" All {len(f.kept)} layers were kept: " + ", ".join(f"{n} by {reason_key(r)}" for r, n in _counted(f.kept)) + "."
                              if f.kept else "")),
         fix_for=lambda f: "; or ".join(dict.fromkeys(x for r, _ in _counted(f.kept) if (x := reason_fix(r))))
             or RULES_BY_ID["FP8-NOT-APPLIED"].fix),
    Rule(id="BACKEND-MISSING", severity="error", stage="run",
         when="the chosen backend package is not importable",
         why="the backend package is needed to apply the precision the spec asks for.",
         fix="install it: " + "; ".join(f"{name}: {INSTALL[package]}" for name, package in
                                        (*((b.name, b.package) for b in BACKENDS.values()), ("deepspeed", "deepspeed"))),
         condition=lambda f: f.missing_package is not None,
         detail=lambda f: f"the {f.missing_package} package is not importable here.",
         fix_for=lambda f: backend_missing_fix(f.plan, f.missing_package) if f.missing_package else RULES_BY_ID["BACKEND-MISSING"].fix),
    # --- issue 10: real-scale memory and GPU-only faults ---
    Rule(id="MEMORY-EXCEEDS-GPU", severity="warning", stage="plan",
         when="the memory estimate (model states + activations) of a GPU plan exceeds the memory of launch.gpu",
         why="the run would stop with CUDA out-of-memory at the first step; the estimate leaves out temporary buffers and fragmentation, so it is a lower bound.",
         fix='set activation_checkpointing.mode = "full" (or "selective"), add GPUs (distributed.procs_per_node / distributed.nodes), '
             "offload (distributed.fsdp2.cpu_offload = true, or distributed.deepspeed.offload_optimizer), or lower train.micro_batch_size / train.seq_len",
         condition=lambda f: _memory_excess(f) is not None,
         detail=lambda f: _memory_excess(f)),
)


# -- tensor parallel (distributed.tensor_parallel, distributed.async_tp) -------------------------

def _tp(f: Facts) -> int:
    return f.plan.distributed.tensor_parallel


def _tp_heads(f: Facts) -> str:
    """What tensor_parallel does not divide among a builtin model's head counts ("" when it divides both, or not builtin)."""
    cfg = builtin_config(f.plan.train.model)
    if _tp(f) <= 1 or cfg is None:
        return ""
    bad = [f"{n} {what}" for what, n in (("attention heads", cfg.n_heads), ("KV heads", cfg.kv_heads)) if n % _tp(f)]
    return " and ".join(bad)


TP_RULES: tuple[Rule, ...] = (
    Rule(id="TP-DIVIDES-PROCS", severity="error", stage="plan",
         when="distributed.tensor_parallel does not divide distributed.procs_per_node",
         why="a tensor-parallel group lives inside one node (its collectives run on every Linear layer and need NVLink-class bandwidth); the 2D mesh is (world_size / tp) x tp.",
         fix="set distributed.tensor_parallel to a divisor of distributed.procs_per_node (e.g. 2, 4 or 8)",
         condition=lambda f: _tp(f) > 1 and f.plan.distributed.procs_per_node % _tp(f) != 0,
         detail=lambda f: f"distributed.tensor_parallel = {_tp(f)} does not divide distributed.procs_per_node = {f.plan.distributed.procs_per_node}."),
    Rule(id="TP-HEADS", severity="error", stage="plan",
         when="distributed.tensor_parallel does not divide a builtin model's attention heads or KV heads",
         why="column-wise wq / wk / wv give each TP rank n_heads / tp query heads and n_kv_heads / tp KV heads: both must be whole.",
         fix="set distributed.tensor_parallel to a divisor of both head counts, or choose another train.model",
         condition=lambda f: bool(_tp_heads(f)),
         detail=lambda f: f"distributed.tensor_parallel = {_tp(f)} does not divide {f.plan.train.model}'s {_tp_heads(f)}."),
    Rule(id="TP-SEQ-LEN", severity="error", stage="plan",
         when="distributed.tensor_parallel does not divide train.seq_len",
         why="sequence parallelism splits the sequence dimension of the norms' activations evenly over the TP ranks (torchtitan asserts the same).",
         fix="set train.seq_len to a multiple of distributed.tensor_parallel",
         condition=lambda f: _tp(f) > 1 and f.plan.train.seq_len % _tp(f) != 0,
         detail=lambda f: f"train.seq_len = {f.plan.train.seq_len} is not a multiple of distributed.tensor_parallel = {_tp(f)}."),
    Rule(id="TP-STRATEGY", severity="error", stage="plan",
         when="distributed.tensor_parallel > 1 with strategy ddp or deepspeed",
         why="fp8launch composes tensor parallelism with FSDP2 only (2D DeviceMesh: FSDP2 over the data-parallel dimension); DDP and DeepSpeed ZeRO do not shard DTensor parameters.",
         fix='set distributed.strategy = "fsdp2", or distributed.tensor_parallel = 1',
         condition=lambda f: _tp(f) > 1 and _strategy(f) in ("ddp", "deepspeed")),
    Rule(id="TP-MODEL", severity="error", stage="plan",
         when="distributed.tensor_parallel > 1 with an hf: or py: model",
         why="only the builtin Llama has a tensor-parallel plan (which Linear layers are column- or row-wise, where the sequence is sharded); another model would train with wrong head counts or not at all.",
         fix='set train.model = "builtin:..." or distributed.tensor_parallel = 1',
         condition=lambda f: _tp(f) > 1 and not f.plan.train.model.startswith("builtin:")),
    Rule(id="TP-BACKEND", severity="error", stage="plan",
         when="distributed.tensor_parallel > 1 with precision.backend te or msamp",
         why="Transformer Engine has its own tensor-parallel modules (te.Linear parallel_mode, sequence_parallel) that fp8launch does not drive, and mixing them with DTensor TP fails (Accelerate #3827); MS-AMP has no tensor-parallel support outside Megatron.",
         fix='set precision.backend = "torchao", or distributed.tensor_parallel = 1',
         condition=lambda f: _tp(f) > 1 and (_fp8(f, TE) or _fp8(f, MSAMP))),
    Rule(id="TP-ROWWISE-BF16-COMM", severity="warning", stage="plan",
         when="distributed.tensor_parallel > 1 with torchao recipe rowwise or rowwise_with_gw_hp",
         why="torchao's float8 TP styles (Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput) support tensorwise scaling only: with a rowwise recipe the TP all-gathers and reduce-scatters move bf16, twice the bytes of the tensorwise float8 all-gathers, and the activations are cast to float8 after the all-gather on every rank (torchtitan #1207: rowwise + TP ran slower than bf16).",
         fix='set precision.torchao.recipe = "tensorwise", or measure with `fp8launch bench`',
         condition=lambda f: _tp(f) > 1 and _fp8(f, TORCHAO) and f.plan.precision.torchao.recipe not in ("tensorwise", *BLOCK_RECIPES)),
    Rule(id="TP-COMPILE-CPU", severity="error", stage="plan",
         when='distributed.tensor_parallel > 1 with compile.enabled and launch.device = "cpu"',
         why="torch.compile of tensor-parallel blocks on CPU fails in backward (DTensor redistribute receives a plain tensor gradient) or, under FSDP2, trains with gradients that differ from eager TP's (seen with torch 2.13's CPU build; docs/tensor-parallel.md); eager TP computes the unsharded model's gradients.",
         fix='set compile.enabled = false for CPU runs with tensor parallelism, or launch.device = "cuda"',
         condition=lambda f: _tp(f) > 1 and f.plan.compile.enabled and f.plan.launch.device == "cpu"),
    Rule(id="TP-ASYNC-COMPILE", severity="error", stage="plan",
         when="distributed.async_tp without compile.enabled",
         why="async TP is an inductor pass (micro-pipeline TP) over compiled graphs: without torch.compile it does nothing (torchtitan refuses it).",
         fix="set compile.enabled = true, or distributed.async_tp = false",
         condition=lambda f: f.plan.distributed.async_tp and not f.plan.compile.enabled),
    Rule(id="TP-ASYNC-CPU", severity="error", stage="plan",
         when='distributed.async_tp with launch.device = "cpu"',
         why="async TP decomposes the TP collectives into CUDA symmetric-memory copies overlapped with the GEMMs; there is no CPU/gloo implementation.",
         fix='set distributed.async_tp = false, or launch.device = "cuda"',
         condition=lambda f: f.plan.distributed.async_tp and f.plan.launch.device == "cpu"),
    Rule(id="TP-ASYNC-NO-TP", severity="warning", stage="plan",
         when="distributed.async_tp with distributed.tensor_parallel = 1",
         why="async TP overlaps tensor-parallel collectives; without tensor parallelism there are none and the setting is a silent no-op.",
         fix="set distributed.tensor_parallel > 1, or delete distributed.async_tp",
         condition=lambda f: f.plan.distributed.async_tp and _tp(f) <= 1),
)

RULES = RULES + TP_RULES

# --- speed prediction (issue 12) ----------------------------------------------------------------------


def _no_gain(f: Facts) -> bool:
    pr = f.prediction
    return (_fp8(f) and _speed_matters(f) and pr is not None and pr.fp8_vs_bf16 is not None and pr.fp8_vs_bf16 < 1.0
            and pr.n_fp8 > 0  # no FP8 layer at all: FP8-NONE-SELECTED says so
            and _ac_slow(f) is None)  # the recompute is what loses: FP8-AC-COMPILE-SLOW says so


PART_WORDS = {"fp8_casts": "the float8 casts", "recompute": "activation checkpointing's recompute", "optimizer": "the optimizer step "
              "(precompute_scale)", "exposed_comm": "exposed communication", "linear_gemms": "the Linear GEMMs"}


def _no_gain_detail(f: Facts) -> str:
    pr = f.prediction
    head = f"predicted FP8 tokens/s on {pr.gpus} x {pr.gpu} is {pr.fp8_vs_bf16:.2f}x bf16's: "
    if pr.n_losing:
        worst = min((r for r in pr.layers if r.speedup is not None), key=lambda r: r.speedup, default=None)
        example = f"; e.g. {worst.layer}: M, K, N = {worst.m}, {worst.k}, {worst.n} at {worst.speedup:.2f}x" if worst else ""
        return (head + f"{pr.n_losing} of {pr.n_fp8} FP8 layers are too small to gain (the casts cost more than the FP8 GEMMs save"
                f"{example}); `fp8launch plan --format json` shows every layer.")
    plan, bf16 = pr.breakdown["plan"], pr.breakdown["bf16"]
    part = max(plan, key=lambda k: plan[k] - bf16.get(k, 0.0))
    return (head + f"each of the {pr.n_fp8} FP8 layers gains on its own, but {PART_WORDS.get(part, part)} adds "
            f"{(plan[part] - bf16.get(part, 0.0)) * 1e3:.2f} ms a step, more than they save; `fp8launch plan --format json` shows the breakdown.")


def _no_gain_fix(f: Facts) -> str:
    """Only the changes that would change something for this plan."""
    p, pr = f.plan.precision, f.prediction
    fixes = []
    if pr.n_losing:
        b = BACKENDS[p.backend]
        skip = b.shape_rules and not b.setting(p, "skip_small") and b.recipe(p) not in BLOCK_RECIPES
        fixes.append("keep the small Linears in high precision (precision.keep globs" + (", or precision.torchao.skip_small = true" if skip else "") + ")")
    if not f.plan.compile.enabled:
        fixes.append("set compile.enabled = true")
    if f.plan.activation_checkpointing.mode != "none":
        fixes.append('set activation_checkpointing.mode = "none" where memory allows')
    fixes += ["use a larger train.micro_batch_size or train.seq_len", 'or set precision.mode = "bf16"; `fp8launch tune` measures it']
    return ", ".join(fixes)


RULES += (
    Rule(id="FP8-NO-GAIN", severity="warning", stage="plan",
         when='the predicted fp8_vs_bf16 for this model, batch and launch.gpu is below 1.0 (a GPU run: not for launch.device = "cpu")',
         why="small GEMMs lose to the cast overhead (torchao microbenchmarks: 1024^3 at 0.42-0.8x of bf16); "
             "say so before a user pays for it (docs/prediction.md).",
         fix='keep the small Linears in high precision (precision.keep globs; torchao: precision.torchao.skip_small = true), compile.enabled = true, a larger '
             'train.micro_batch_size or train.seq_len, or precision.mode = "bf16"; `fp8launch tune` measures it',
         condition=_no_gain, detail=_no_gain_detail, fix_for=_no_gain_fix),
)

# --- Kubernetes (launch.launcher = "kubernetes") -------------------------------------------------


RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
                "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
"""Set by the operators on every node (Trainer's TorchRunReservedEnvNames, training-operator's envvar.go);
the TrainJob webhook rejects the PET_* ones in trainer.env, and a second value would be ambiguous."""


def _k8s(f: Facts) -> bool:
    return f.plan.launch.launcher == "kubernetes"


def _k8s_reserved_env(f: Facts) -> list[str]:
    return sorted(k for k in f.plan.launch.env if k in RESERVED_ENV)


def _writes_checkpoints(f: Facts) -> bool:
    return f.plan.train.checkpoint_every > 0 or f.plan.train.checkpoint_at_end


RULES += (
    Rule(id="K8S-IMAGE-MISSING", severity="error", stage="plan",
         when='launch.launcher = "kubernetes" and launch.kubernetes.image is empty',
         why="every node's container starts from this image; it must hold fp8launch, torch and the backend. There is no sensible default.",
         fix='set launch.kubernetes.image = "REGISTRY/IMAGE:TAG" (an image with fp8launch and the backend installed)',
         condition=lambda f: _k8s(f) and not f.plan.launch.kubernetes.image.strip()),
    Rule(id="K8S-NO-SHARED-OUTPUT", severity="error", stage="plan",
         when='launch.launcher = "kubernetes", checkpoints are written (train.checkpoint_every > 0 or train.checkpoint_at_end) and launch.kubernetes.volume_claim is empty',
         why="without a volume claim, train.output_dir is each pod's own disk: checkpoints vanish with the pods when the job ends, "
             "a sharded multi-node checkpoint is split across disks no pod can read together, and resume finds nothing. "
             "An error, not a warning: the loss shows only after the GPU hours are spent.",
         fix="set launch.kubernetes.volume_claim = \"CLAIM\" (a ReadWriteMany PersistentVolumeClaim), or train.checkpoint_every = 0 and train.checkpoint_at_end = false",
         condition=lambda f: _k8s(f) and not f.plan.launch.kubernetes.volume_claim and _writes_checkpoints(f)),
    Rule(id="K8S-RESERVED-ENV", severity="error", stage="plan",
         when="launch.env sets a variable the operator sets on every node (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK)",
         why="Kubeflow Trainer rejects a TrainJob whose trainer.env sets torchrun's reserved PET_* variables, and the training-operator "
             "appends its own values after the spec's, so the pod would hold two values for one name.",
         fix="delete that key from launch.env: the node count and processes come from distributed.nodes and distributed.procs_per_node",
         condition=lambda f: _k8s(f) and bool(_k8s_reserved_env(f)),
         detail=lambda f: "launch.env sets " + ", ".join(_k8s_reserved_env(f)) + ", which the operator sets itself."),
    Rule(id="K8S-GPUS-FEWER", severity="error", stage="plan",
         when="launch.kubernetes.gpus_per_node is below distributed.procs_per_node on a GPU plan",
         why="every process of a node needs its own GPU; a pod granted fewer GPUs than processes fails at the first collective or double-books a GPU.",
         fix="set launch.kubernetes.gpus_per_node = 0 (one per process), or lower distributed.procs_per_node",
         condition=lambda f: _k8s(f) and f.plan.launch.device != "cpu"
             and 0 < f.plan.launch.kubernetes.gpus_per_node < f.plan.distributed.procs_per_node,
         detail=lambda f: f"launch.kubernetes.gpus_per_node = {f.plan.launch.kubernetes.gpus_per_node} but distributed.procs_per_node = {f.plan.distributed.procs_per_node}."),
)

# --- every option proven (issue 19): options that crashed or silently did nothing ---------------------


def _ds(f: Facts) -> bool:
    return _strategy(f) == "deepspeed"


def _nvme(f: Facts) -> list[str]:
    ds = f.plan.distributed.deepspeed
    return [k for k in ("offload_optimizer", "offload_param") if getattr(ds, k) == "nvme"]


def _tokens_per_rank(f: Facts) -> int:
    """The tokens of one micro-batch on one rank: the rows of every Linear's GEMM input (TE asserts they divide
    by 8), and the dimension the weight-gradient GEMM scales along (blocks of 32 / 16 for MX / NVFP4)."""
    t = f.plan.train
    return t.micro_batch_size * t.seq_len // max(1, f.plan.distributed.tensor_parallel)


def _monitor(f: Facts) -> bool:
    return f.plan.monitor.fp8_stats_every > 0


def _fullgraph(f: Facts) -> bool:
    return f.plan.compile.enabled and f.plan.compile.fullgraph


RULES += (
    Rule(id="DS-NVME-PATH", severity="error", stage="plan",
         when='distributed.deepspeed offload_optimizer or offload_param = "nvme" and distributed.deepspeed.nvme_path is empty',
         why="DeepSpeed swaps NVMe-offloaded tensors into files under nvme_path; without one, deepspeed.zero.Init asserts and the "
             "stage-3 optimizer joins None into a path.",
         fix='set distributed.deepspeed.nvme_path = "/local_nvme/deepspeed" (a folder on a fast local drive, present on every node)',
         condition=lambda f: _ds(f) and bool(_nvme(f)) and not f.plan.distributed.deepspeed.nvme_path.strip(),
         detail=lambda f: " and ".join(f"distributed.deepspeed.{k}" for k in _nvme(f)) + ' = "nvme" needs a folder to swap to, '
             "and distributed.deepspeed.nvme_path is empty."),
    Rule(id="DS-NVME-STAGE", severity="error", stage="plan",
         when='distributed.deepspeed.offload_optimizer = "nvme" with zero_stage 1 or 2',
         why="only ZeRO stage 3 (ZeRO-Infinity) swaps optimizer states to NVMe; DeepSpeed's stage 1/2 optimizer treats any offload "
             "device as CPU memory, so \"nvme\" would silently offload to host memory instead.",
         fix='set distributed.deepspeed.zero_stage = 3, or distributed.deepspeed.offload_optimizer = "cpu"',
         condition=lambda f: _ds(f) and f.plan.distributed.deepspeed.offload_optimizer == "nvme" and f.plan.distributed.deepspeed.zero_stage in (1, 2)),
    Rule(id="DS-OFFLOAD-STAGE0", severity="error", stage="plan",
         when="distributed.deepspeed.offload_optimizer != none with zero_stage 0",
         why="ZeRO stage 0 has no partitioned optimizer to offload: DeepSpeed keeps the optimizer states with the parameters and the "
             "offload setting does nothing.",
         fix='set distributed.deepspeed.zero_stage = 1 (or 2, 3), or distributed.deepspeed.offload_optimizer = "none"',
         condition=lambda f: _ds(f) and f.plan.distributed.deepspeed.offload_optimizer != "none" and f.plan.distributed.deepspeed.zero_stage == 0),
    Rule(id="DS-NVME-AIO", severity="error", stage="run",
         when='NVMe offload on a machine without libaio',
         why="DeepSpeed's NVMe offload reads and writes through its async_io op, which links libaio; without it the op cannot be built "
             "and deepspeed.initialize fails.",
         fix="install libaio (Debian/Ubuntu: apt-get install libaio-dev; RHEL: yum install libaio-devel), or "
             'set distributed.deepspeed.offload_optimizer / offload_param = "cpu"',
         condition=lambda f: _ds(f) and bool(_nvme(f)) and f.libaio is False),
    Rule(id="DS-FP16-CPU", severity="error", stage="plan",
         when='strategy deepspeed with fp16 (precision.mode, or high_precision in fp8) on launch.device = "cpu"',
         why="DeepSpeed's CPU accelerator supports bf16 and fp32 only: deepspeed.initialize raises \"Type fp16 is not supported "
             "on your device\" before the first step.",
         fix='set precision.mode = "bf16" (or precision.high_precision = "bf16"), or launch.device = "cuda"',
         condition=lambda f: _ds(f) and f.plan.precision.compute_dtype == "fp16" and f.plan.launch.device == "cpu"),
    Rule(id="DS-ZERO3-COMPILE", severity="error", stage="plan",
         when="DeepSpeed ZeRO-3 with compile.enabled and compile.fullgraph, or with activation checkpointing",
         why="ZeRO-3 gathers each block's parameters in module hooks that run inside the compiled block: some are "
             "torch.compiler.disable'd (a graph break, an error under fullgraph), and dynamo fails tracing them through the "
             "activation-checkpoint wrapper (\"UnspecializedNNModuleVariable(CheckpointWrapper) is already tracked for mutation\", "
             "torch 2.13, DeepSpeed 0.19). ZeRO-3 with compiled blocks and neither of them trains.",
         fix='set compile.fullgraph = false and activation_checkpointing.mode = "none", or compile.enabled = false, or '
             "distributed.deepspeed.zero_stage = 2 (or distributed.strategy = \"fsdp2\")",
         condition=lambda f: _ds(f) and f.plan.distributed.deepspeed.zero_stage == 3 and f.plan.compile.enabled
             and (f.plan.compile.fullgraph or f.plan.activation_checkpointing.mode != "none"),
         detail=lambda f: "DeepSpeed ZeRO-3 gathers each block's parameters in hooks that run inside the compiled block, and "
             + ("some are torch.compiler.disable'd: a graph break, which compile.fullgraph makes an error at the first forward."
                if f.plan.compile.fullgraph else
                "dynamo fails tracing them through the activation-checkpoint wrapper (\"UnspecializedNNModuleVariable(CheckpointWrapper) "
                "is already tracked for mutation\", torch 2.13, DeepSpeed 0.19).")),
    Rule(id="FULLGRAPH-TE", severity="error", stage="plan",
         when="compile.fullgraph with backend te",
         why="Transformer Engine's modules fall back to eager through a graph break in many configurations (te.Linear with delayed "
             "scaling, FP8 weight caching, debug features) and te.distributed.checkpoint is dynamo-disabled: under fullgraph a graph "
             "break is an error at the first forward.",
         fix="set compile.fullgraph = false (TE's modules then run eager between compiled regions)",
         condition=lambda f: _fp8(f, TE) and _fullgraph(f)),
    Rule(id="FULLGRAPH-MONITOR", severity="error", stage="plan",
         when="compile.fullgraph with monitor.fp8_stats_every > 0",
         why="the FP8 monitor's hooks run eagerly (torch.compiler.disable) so that sampling does not recompile the blocks; that is a "
             "graph break, and fullgraph turns a graph break into an error at the first sampled step.",
         fix="set compile.fullgraph = false, or monitor.fp8_stats_every = 0",
         condition=lambda f: _fullgraph(f) and _monitor(f)),
    Rule(id="TE-TOKENS-DIV8", severity="error", stage="plan",
         when="backend te and the tokens of one micro-batch on one rank (micro_batch_size x seq_len) not divisible by 8",
         why="Transformer Engine's FP8 GEMMs need the product of the input's leading dimensions divisible by 8 "
             "(assert_dim_for_fp8_exec): the first FP8 layer fails at step 1.",
         fix="set train.seq_len (or train.micro_batch_size) so that micro_batch_size x seq_len is a multiple of 8",
         condition=lambda f: _fp8(f, TE) and _tokens_per_rank(f) % 8 != 0,
         detail=lambda f: f"micro_batch_size {f.plan.train.micro_batch_size} x seq_len {f.plan.train.seq_len} = {_tokens_per_rank(f)} tokens per "
             f"micro-batch, not a multiple of 8 (Transformer Engine's assert_dim_for_fp8_exec fails at step 1)."),
    Rule(id="TE-FP8-PARAMS-DEEPSPEED", severity="error", stage="plan",
         when="precision.te.fp8_params with strategy deepspeed",
         why="DeepSpeed casts parameters with `p.data = ...` and points p.data at its flat bf16/fp16 buffer after every step; a "
             "Transformer Engine FP8 weight quantizes a copy on assignment, so the full high-precision copy stays and nothing is saved "
             "(and ZeRO-3 partitioning of TE's Float8Tensor is untested upstream).",
         fix="set precision.te.fp8_params = false",
         condition=lambda f: _fp8(f, TE) and f.plan.precision.te.fp8_params and _ds(f) and _has_master_weights(f)),
    Rule(id="FP8-PRECOMPUTE-OFFLOAD", severity="error", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather and precompute_scale with distributed.fsdp2.cpu_offload",
         why="FSDP2 copies each offloaded shard to the GPU with .to(device) before the float8 all-gather, and torchao rebuilds the "
             "weight wrapper without its precomputed scale there: precompute_scale does nothing and every weight all-reduces its own "
             "amax at each all-gather.",
         fix="set precision.torchao.precompute_scale = false (each weight then computes its scale at its all-gather), or "
             "distributed.fsdp2.cpu_offload = false",
         condition=lambda f: _fp8(f, TORCHAO) and _strategy(f) == "fsdp2" and f.plan.precision.torchao.fsdp_float8_all_gather
             and f.plan.precision.torchao.precompute_scale and f.plan.distributed.fsdp2.cpu_offload),
    Rule(id="MONITOR-NO-FP8", severity="warning", stage="plan",
         when="monitor.fp8_stats_every > 0 with no FP8 layer to watch (precision.mode != fp8, or backend msamp)",
         why="the monitor measures the casts of FP8 layers; without any (or with MS-AMP, whose FP8 layers it does not hook) it writes no "
             "fp8_stats.jsonl, a silent no-op.",
         fix='set monitor.fp8_stats_every = 0, or precision.mode = "fp8" with backend torchao or te',
         condition=lambda f: _monitor(f) and not (_fp8(f, TORCHAO) or _fp8(f, TE))),
    Rule(id="MSAMP-UNMAINTAINED", severity="warning", stage="plan",
         when="backend msamp",
         why="MS-AMP's last release is 0.4.0 (2024-02); it needs Transformer Engine <= 1.7 and, through DeepSpeed, DeepSpeed 0.13 "
             "(it pins 0.13.1), and Accelerate marks it deprecated. Plan for torchao or Transformer Engine.",
         fix='set precision.backend = "torchao" (or "te")',
         condition=lambda f: _fp8(f, MSAMP),
         fix_for=lambda f: _msamp_level_fix(f, 'set precision.backend = "te"')),
    Rule(id="EFFECT-MISSING", severity="error", stage="run",
         when="after setup, before step 1: a feature the spec asks for did not take effect on the live objects (the start "
              "record's effects: compiled and checkpointed blocks, fullgraph, FSDP2's all-gather dtype, the optimizer class, "
              "offload, tensor parallel, async TP, the monitor's hooks)",
         why="a run that trains on without something its spec asked for is the silent no-op users forgive least "
             "(LlamaFactory #9500, torchtitan #3123, Accelerate #3830): fp8launch stops instead.",
         fix="set each named spec key to what this model and engine support (e.g. compile.enabled = false for a model whose "
             "repeated blocks fp8launch cannot find as model.layers), or report the gap as a bug",
         condition=lambda f: bool(f.missing_effects),
         detail=lambda f: "the spec asks for something this run did not set up: " + "; ".join(f.missing_effects) + "."),
    Rule(id="MSAMP-STACK", severity="error", stage="run",
         when="MS-AMP is installed next to packages it cannot run with (Transformer Engine >= 1.8, or DeepSpeed > 0.13 for its "
              "DeepSpeed integration, or neither installed)",
         why="MS-AMP 0.4 imports transformer_engine_extensions (renamed transformer_engine_torch in TE 1.8) and, for DeepSpeed, "
             "AMP from deepspeed.runtime.engine (removed after DeepSpeed 0.13).",
         fix=MSAMP_OWN_ENVIRONMENT + ', or set precision.backend = "torchao" (or "te")',
         condition=lambda f: _fp8(f, MSAMP) and f.msamp_stack is not None,
         detail=lambda f: f.msamp_stack,
         fix_for=lambda f: _msamp_level_fix(f, MSAMP_OWN_ENVIRONMENT)),
)

def _block(f: Facts) -> str | None:
    """The torchao block-scaled recipe the plan trains with (mxfp8 / nvfp4), else None."""
    recipe = f.plan.precision.torchao.recipe
    return recipe if _fp8(f, TORCHAO) and recipe in BLOCK_RECIPES else None


def _bad_rule_recipe(f: Facts) -> str:
    """What is wrong with the first [[precision.rules]] recipe, or ""."""
    from launcher.planning.read import recipes

    p = f.plan.precision
    for r in p.rules:
        if r.recipe is None:
            continue
        b = BACKENDS[p.backend]
        if not b.mixes_recipes:
            return f"precision.rules entry {r.match!r} sets recipe {r.recipe!r}, and backend {p.backend} cannot mix recipes per module."
        if r.recipe not in recipes(b.name):
            return f"precision.rules entry {r.match!r} sets recipe {r.recipe!r}, which is not a torchao recipe."
    return ""


def _bad_rule_mode(f: Facts) -> str:
    p, strategy = f.plan.precision, f.plan.distributed.strategy
    for r in p.rules:
        if r.mode is None or r.mode == p.compute_dtype:
            continue
        if strategy == "deepspeed" or _fp8(f) and backend_of(p).scaling_tensors:
            return (f"precision.rules entry {r.match!r} asks for {r.mode} in a {p.compute_dtype} run under "
                    f"{'DeepSpeed' if strategy == 'deepspeed' else 'MS-AMP'}, which keeps one dtype for every weight.")
        if r.mode == "fp16":
            return f"precision.rules entry {r.match!r} asks for fp16 in a {p.compute_dtype} run, which has no loss scaling."
    return ""


def _model_shape(f: Facts):
    """The model's shapes when planning knows them (builtin and hf: models), else None."""
    from launcher.planning.predict.shapes import model_shape

    return model_shape(f.plan.train.model, f.spec_folder or f.plan.spec_dir)[0]


def _layer_names(f: Facts) -> list[str] | None:
    """Every name precision.keep and [[precision.rules]] globs are matched against: each Linear, and each grouped-experts
    module of an MoE (`layers.N.moe.experts`); None when planning does not know the model's names."""
    shape = _model_shape(f)
    if shape is None:
        return None
    e = shape.experts
    experts = [e.name.format(i=i) for i in range(e.first_block, e.first_block + e.count)] if e else []
    return [s.name.format(i=i) for s in shape.linears for i in range(s.count)] + experts


def _unmatched_rules(f: Facts) -> list[str]:
    """The match globs of [[precision.rules]] that name no layer of the model (empty when the names are unknown)."""
    names = _layer_names(f) if f.plan.precision.rules else None
    return [] if names is None else unmatched(f.plan.precision.rules, names)


def _unmatched_keep(f: Facts) -> list[str]:
    """The precision.keep globs that name no layer of an FP8 plan's model (empty when the names are unknown)."""
    names = _layer_names(f) if _fp8(f) and f.plan.precision.keep else None
    return [] if names is None else unmatched_globs(f.plan.precision.keep, names)


def _selection(f: Facts) -> tuple[int, dict[str, int]] | None:
    """(layers that run in FP8, {reason: layers kept}) for an FP8 plan whose model planning knows, else None."""
    from launcher.planning.predict import layer_selection

    shape = _model_shape(f) if _fp8(f) else None
    return None if shape is None else layer_selection(f.plan, shape)


def _none_selected(f: Facts) -> bool:
    chosen = _selection(f)
    return chosen is not None and chosen[0] == 0 and bool(chosen[1])


def _none_selected_detail(f: Facts) -> str:
    _, kept = _selection(f)
    why = ", ".join(f"{n} by {reason_key(r)}" for r, n in sorted(kept.items(), key=lambda kv: -kv[1]))
    return (f"precision.mode = \"fp8\" but no layer of {f.plan.train.model} would run in FP8: all {sum(kept.values())} stay in "
            f"{f.plan.precision.high_precision} ({why}). The run would stop with FP8-NOT-APPLIED after torchrun starts.")


def _none_selected_fix(f: Facts) -> str:
    _, kept = _selection(f)
    fixes = [x for r in sorted(kept, key=lambda r: -kept[r]) if (x := reason_fix(r))]
    return "; or ".join(dict.fromkeys(fixes)) + '; or set precision.mode = "bf16"' if fixes else 'set precision.mode = "bf16"'


def _schedule_steps(f: Facts) -> str:
    from launcher.planning.schedule import first_step

    steps = f.plan.train.steps
    starts = [first_step(e, steps) for e in f.plan.precision.schedule]
    bad = [s for s in starts if s < 2 or s > steps]
    if bad:
        return f"precision.schedule starts a phase at step {bad[0]}, outside 2 .. train.steps = {steps}."
    if len(set(starts)) != len(starts):
        return f"precision.schedule starts two phases at step {sorted(s for s in starts if starts.count(s) > 1)[0]}."
    return ""


def _builtin_experts(f: Facts) -> int | None:
    """The routed experts per MoE layer of a builtin model (0: a dense one); None for hf: / py: models (known at run
    time) and for a bad builtin name (planning reports it)."""
    cfg = builtin_config(f.plan.train.model)
    if cfg is None:
        return None
    return cfg.num_experts if is_moe(cfg) else 0


def _own_dtype_rules(p) -> set:
    """The `[[precision.rules]]` entries that give layers a dtype of their own (a mode other than the run's high precision)."""
    return {r for r in p.rules if r.mode is not None and r.mode != p.compute_dtype}


def _schedule_direction(f: Facts) -> str:
    from launcher.planning.schedule import phases

    for before, after in zip(phases(f.plan), phases(f.plan)[1:]):
        a, b = before.plan.precision, after.plan.precision
        at = f"the phase from step {after.first_step}"
        if b.mode != a.mode and {a.mode, b.mode} != {"fp8", a.compute_dtype}:
            return (f"{at} sets mode {b.mode!r} after {a.mode!r}; a switch moves layers between fp8 and the run's high precision "
                    f"({a.compute_dtype}), it does not change the high precision itself (autocast, loss scaling).")
        if b.high_precision != a.high_precision:
            return f"{at} changes precision.high_precision; the autocast dtype and loss scaling stay those of the run."
        if _own_dtype_rules(a) != _own_dtype_rules(b):
            return (f"{at} changes the rules that give layers a dtype of their own (mode other than {a.compute_dtype}); those "
                    "layers are FSDP units of their own with that dtype, fixed when the run starts.")
    return ""


def _schedule_unsupported(f: Facts) -> list[str]:
    from launcher.planning.schedule import phases

    p, d = f.plan.precision, f.plan.distributed
    if not p.schedule:
        return []
    out = []
    for phase in phases(f.plan):
        q = phase.plan.precision
        b = backend_of(q)
        if b is not None and not b.schedules:
            out.append(f"backend {b.name}")
        recipes = ({b.recipe(q)} if b is not None and b.schedules else set()) | {r.recipe for r in q.rules if r.recipe}
        out += [f"torchao recipe {r}" for r in sorted(recipes & set(BLOCK_RECIPES))]
        if b is not None and b.setting(q, "fsdp_float8_all_gather"):
            out.append(f"precision.{b.section}.fsdp_float8_all_gather")
    if d.strategy == "deepspeed":
        out.append("strategy deepspeed")
    if d.tensor_parallel > 1:
        out.append("distributed.tensor_parallel > 1")
    if f.plan.monitor.fp8_stats_every > 0:
        out.append("the FP8 monitor")
    return list(dict.fromkeys(out))


def _gpu_cannot_run(f: Facts) -> str:
    """What an explicitly chosen launch.gpu lacks for the plan's precision ("" when it runs it, or for "auto"/AMD)."""
    from launcher.planning.gpus import PLAN_GPUS

    p, choice = f.plan.precision, f.plan.launch.gpu
    if choice == "auto" or f.plan.launch.device == "cpu" or PLAN_GPUS[choice].capability is None:
        return ""
    mode, backend, recipe = precision_key(p)
    cc = PLAN_GPUS[choice].capability
    if supports(cc, mode, backend, recipe):
        return ""
    what = f"{mode} {backend} {recipe}" if recipe else f"{mode} {backend}" if backend else mode
    return f"{what} needs {requirement(mode, backend, recipe)}; the {PLAN_GPUS[choice].name} has {capability_text(cc)}"


RULES += (
    Rule(id="TORCHAO-BLOCK-HARDWARE", severity="error", stage="run",
         when="torchao recipe mxfp8 or nvfp4 on a CUDA GPU below compute capability 10.0",
         why="torchao's MX and NVFP4 kernels need Blackwell (they check is_sm_at_least_100); on an older GPU the first "
             "forward fails inside torchao. On CPU, mxfp8 runs torchao's emulated kernels (real numerics, not speed).",
         fix='set precision.torchao.recipe = "tensorwise" (or "rowwise"), or run on an sm100+ GPU (B200, GB200)',
         condition=lambda f: bool(_block(f)) and f.device == "cuda" and f.capability is not None
             and not supports(f.capability, "fp8", TORCHAO.name, _block(f)),
         detail=lambda f: f"torchao recipe {_block(f)!r} needs {requirement('fp8', TORCHAO.name, _block(f))}; this GPU has {capability_text(f.capability)}."),
    Rule(id="TORCHAO-NVFP4-CPU", severity="error", stage="run",
         when="torchao recipe nvfp4 on CPU",
         why="torchao's NVFP4 training (NVFP4TrainingConfig) quantizes through Triton kernels on CUDA only; it has no "
             "emulated path, so a CPU run would fail at the first forward.",
         fix='set precision.torchao.recipe = "mxfp8" (emulated on CPU), or launch.device = "cuda" on an sm100+ GPU',
         condition=lambda f: _block(f) == "nvfp4" and (f.device or f.plan.launch.device) == "cpu"),
    Rule(id="TORCHAO-BLOCK-TOKENS", severity="error", stage="plan",
         when="torchao recipe mxfp8 (nvfp4) and the tokens of one micro-batch on one rank not a multiple of 32 (16)",
         why="the weight-gradient GEMM scales grad_output and the input along the tokens in blocks of 32 (MX) or 16 (NVFP4); "
             "torchao asserts the dimension divides (\"must be divisible by block_size\") at the first backward.",
         fix="set train.seq_len (or train.micro_batch_size) so that micro_batch_size x seq_len / tensor_parallel is a multiple of the block",
         condition=lambda f: bool(_block(f)) and _tokens_per_rank(f) % BLOCK_SIZE[_block(f)] != 0,
         detail=lambda f: f"micro_batch_size {f.plan.train.micro_batch_size} x seq_len {f.plan.train.seq_len} gives {_tokens_per_rank(f)} tokens "
             f"per micro-batch and rank, not a multiple of {_block(f)}'s block of {BLOCK_SIZE[_block(f)]}."),
    Rule(id="TORCHAO-BLOCK-PAD", severity="error", stage="plan",
         when="precision.torchao.pad_inner_dim with recipe mxfp8 or nvfp4",
         why="pad_inner_dim is a Float8LinearConfig setting; torchao's MX and NVFP4 training have no padding, so it would be "
             "silently ignored (a layer whose dims are not multiples of the block stays in high precision instead).",
         fix='set precision.torchao.pad_inner_dim = false, or precision.torchao.recipe = "tensorwise"',
         condition=lambda f: bool(_block(f)) and f.plan.precision.torchao.pad_inner_dim),
    Rule(id="TORCHAO-BLOCK-DEEPSPEED", severity="error", stage="plan",
         when="torchao recipe mxfp8 or nvfp4 with strategy deepspeed",
         why="torchao's MX training keeps each weight in a wrapper tensor subclass (MXFP8TrainingWeightWrapperTensor) and NVFP4 "
             "swaps the module; DeepSpeed re-points every parameter's .data at its flat buffers, which drops the wrapper: the "
             "layers would train in high precision while the start line says mxfp8. Not tested anywhere.",
         fix='set distributed.strategy = "fsdp2" (or "ddp"), or precision.torchao.recipe = "tensorwise"',
         condition=lambda f: bool(_block(f)) and _strategy(f) == "deepspeed"),
    Rule(id="TORCHAO-BLOCK-TP", severity="error", stage="plan",
         when="distributed.tensor_parallel > 1 with torchao recipe mxfp8 or nvfp4",
         why="fp8launch's tensor-parallel plan uses torchao's float8 TP styles (tensorwise casts around the collectives); "
             "the MX and NVFP4 wrappers have their own TP protocol (NVFP4ColwiseParallel, ...) that fp8launch does not wire.",
         fix='set distributed.tensor_parallel = 1, or precision.torchao.recipe = "tensorwise"',
         condition=lambda f: bool(_block(f)) and _tp(f) > 1),
    Rule(id="LAUNCH-GPU-PRECISION", severity="error", stage="plan",
         when="launch.gpu names a GPU whose compute capability cannot run the spec's precision (e.g. h100 with mxfp8)",
         why="the plan (memory, prediction) would be for a machine the run is refused on (FP8-HARDWARE, TE-RECIPE-HARDWARE, "
             "TORCHAO-BLOCK-HARDWARE); \"auto\" picks an h100, or a b200 for a precision that needs Blackwell.",
         fix='set launch.gpu to a GPU that runs it (b200 for mxfp8 / nvfp4), "auto", or another precision.torchao.recipe / precision.te.recipe',
         condition=lambda f: bool(_gpu_cannot_run(f)),
         detail=lambda f: f"launch.gpu = {f.plan.launch.gpu!r} cannot run this spec's precision: {_gpu_cannot_run(f)}."),
    Rule(id="PRECISION-RULE-RECIPE", severity="error", stage="plan",
         when="a [[precision.rules]] recipe with backend te or msamp, or one that is not a recipe of torchao",
         why="Transformer Engine applies one recipe to every swapped module (te.autocast(recipe=...)) and MS-AMP one opt level to the "
             "model; torchao converts each Linear on its own, so only torchao can mix recipes per module.",
         fix='set precision.backend = "torchao" with a torchao recipe (tensorwise, rowwise, rowwise_with_gw_hp, mxfp8, nvfp4), or give '
             'the entry `mode` instead of `recipe`',
         condition=lambda f: bool(_bad_rule_recipe(f)),
         detail=lambda f: _bad_rule_recipe(f)),
    Rule(id="PRECISION-RULE-MODE", severity="error", stage="plan",
         when="a [[precision.rules]] mode other than the run's high precision under DeepSpeed or MS-AMP, or fp16 outside an fp16 run",
         why="a rule's own dtype runs its Linears outside autocast in that dtype, in an FSDP2 unit of their own (DDP keeps fp32 "
             "weights anyway); DeepSpeed keeps every weight in its one dtype and MS-AMP wraps the model, so the mode would be "
             "silently ignored there, and an fp16 module in a run without loss scaling would underflow its gradients.",
         fix='set the entry\'s mode to precision.high_precision, use strategy ddp or fsdp2 with backend torchao or te, or mode = "fp32"',
         condition=lambda f: bool(_bad_rule_mode(f)),
         detail=lambda f: _bad_rule_mode(f)),
    Rule(id="FP8-NONE-SELECTED", severity="error", stage="plan",
         when="fp8 with a model planning knows (builtin, hf:) whose every Linear and expert group the layer selection keeps in high precision",
         why="the run would convert nothing and stop with FP8-NOT-APPLIED after torchrun started: say so, with the keys that keep each layer, "
             "before anything launches.",
         fix='set precision.mode = "bf16", or relax what keeps the layers (precision.torchao.skip_small, precision.keep_first_last, precision.keep)',
         condition=_none_selected, detail=_none_selected_detail, fix_for=_none_selected_fix),
    Rule(id="PRECISION-KEEP-UNMATCHED", severity="warning", stage="plan",
         when="a precision.keep glob that names no layer of the model (builtin and hf: models, whose names are known)",
         why="a keep glob that matches nothing keeps nothing: usually a typo, or a substring written without wildcards "
             "(torchtitan's filter_fqns match substrings; a glob matches the whole name).",
         fix='correct the precision.keep glob, e.g. "*attention.wk*" for the substring attention.wk (`fp8launch plan --format json` lists '
             "the layers under prediction.layers), or remove it",
         condition=lambda f: bool(_unmatched_keep(f)),
         detail=lambda f: "precision.keep " + ", ".join(repr(m) for m in _unmatched_keep(f)) + f" match no layer of {f.plan.train.model}."),
    Rule(id="PRECISION-RULE-UNMATCHED", severity="warning", stage="plan",
         when="a [[precision.rules]] match glob that names no Linear of the model (builtin and hf: models, whose names are known)",
         why="a rule that matches nothing changes nothing: usually a typo in the module name.",
         fix="correct the entry's precision.rules match glob (`fp8launch plan --format json` lists the layers under prediction.layers), or remove it",
         condition=lambda f: bool(_unmatched_rules(f)),
         detail=lambda f: "precision.rules " + ", ".join(repr(m) for m in _unmatched_rules(f)) + " match no layer of "
             + f"{f.plan.train.model}."),
    Rule(id="SCHEDULE-STEPS", severity="error", stage="plan",
         when="a [[precision.schedule]] entry starting at step 1, after train.steps, or at the same step as another",
         why="each phase needs steps of its own: phase 0 (the spec's precision) trains from step 1, each entry from its first step on.",
         fix="set each entry's at_step (2 .. train.steps) or at_fraction so that no two start at the same step",
         condition=lambda f: bool(_schedule_steps(f)),
         detail=lambda f: _schedule_steps(f)),
    Rule(id="SCHEDULE-DIRECTION", severity="error", stage="plan",
         when="a [[precision.schedule]] phase that changes the run's high precision, or the rules that give layers a dtype of their own",
         why="the run converts the live model in place at the switch: each Linear moves between FP8 recipes and the run's high "
             "precision, keeping its Parameters and optimizer state. The high precision itself (autocast dtype, loss scaling) and "
             "the layers with a dtype of their own (their own FSDP units) are fixed when the run starts.",
         fix='give later phases mode = "fp8" or precision.high_precision (e.g. "bf16"), another torchao recipe, keep_last_blocks or '
             "rules, and keep the rules with another mode (fp32, fp16) the same in every phase",
         condition=lambda f: bool(_schedule_direction(f)),
         detail=lambda f: _schedule_direction(f)),
    Rule(id="SCHEDULE-SUPPORT", severity="error", stage="plan",
         when="[[precision.schedule]] with something the in-place switch does not handle",
         why="the switch turns nn.Linear and torchao Float8Linear layers into each other (and re-configures a Float8Linear's recipe) "
             "under DDP or FSDP2; float8 all-gather wraps the sharded weights, tensor parallel wraps them in float8 TP styles, DeepSpeed "
             "flattens them, MX / NVFP4 and Transformer Engine / MS-AMP hold them in their own classes, and the FP8 monitor hooks the "
             "layers: none of these is switched yet.",
         fix='use precision.backend = "torchao" with tensorwise / rowwise / rowwise_with_gw_hp under ddp or fsdp2, without '
             'fsdp_float8_all_gather, tensor_parallel or the monitor; or remove precision.schedule',
         condition=lambda f: bool(_schedule_unsupported(f)),
         detail=lambda f: "precision.schedule cannot switch a run with " + ", ".join(_schedule_unsupported(f)) + "."),
    Rule(id="MONITOR-BLOCK", severity="error", stage="plan",
         when="monitor.fp8_stats_every > 0 with torchao recipe nvfp4",
         why="the FP8 monitor measures FP8 casts (torchao's Float8Linear and MXFP8 layers, TE's modules); NVFP4's 4-bit e2m1 "
             "cast with its random Hadamard transform is not modelled, so the run would write no statistics for its layers.",
         fix='set monitor.fp8_stats_every = 0, or precision.torchao.recipe = "mxfp8" (or a Float8Linear recipe) to watch the casts',
         condition=lambda f: _block(f) == "nvfp4" and _monitor(f)),
    Rule(id="TORCHAO-MX-TORCH", severity="error", stage="run",
         when="torchao recipe mxfp8 with a torch that lacks what torchao's MXFP8 training asserts",
         why="torchao 0.18's MXFP8 training asserts DTensor's scaled_mm_single_dim_strategy and is_pinned_handler "
             "(moe_training/conversion_utils.py: \"Please install the latest torch nightly\"); torch 2.13 has them, 2.11 not.",
         fix="install torch >= 2.13 (the version fp8launch pins), or set precision.torchao.recipe = \"tensorwise\"",
         condition=lambda f: _block(f) == "mxfp8" and f.torchao_mx_supported is False),
)

RULES_BY_ID = {r.id: r for r in RULES}


def check(facts: Facts, stage: str = "plan") -> list[Finding]:
    """Every rule of `stage` whose condition holds for `facts`, errors first. With a `[[precision.schedule]]`, the
    error rules also hold each later phase's precision to account (e.g. a phase that turns FP8 on where it cannot run)."""
    found = [Finding(r, r.detail(facts) if r.detail else r.why, r.fix_of(facts)) for r in RULES if r.stage == stage and r.condition(facts)]
    seen = {f.rule.id for f in found}
    if facts.plan.precision.schedule:
        from launcher.planning.schedule import phases

        for phase in phases(facts.plan)[1:]:
            later = dataclasses.replace(facts, plan=phase.plan, prediction=None)
            for r in RULES:
                if (r.stage == stage and r.severity == "error" and r.id not in seen and not r.id.startswith("SCHEDULE-")
                        and r.condition(later)):
                    seen.add(r.id)
                    found.append(Finding(r, f"in the precision phase from step {phase.first_step}: "
                                            + (r.detail(later) if r.detail else r.why), r.fix_of(later)))
    return sorted(found, key=lambda f: not f.is_error)


def rule_error(rule_id: str, facts: Facts | None = None):
    """The error a rule reports (message and fix from this table), for a run-time guard that meets the
    rule's condition where the rule check itself cannot be called. Plan-stage rules exit 2, run-stage 3."""
    from launcher.errors import EnvironmentProblem, LauncherError

    rule = RULES_BY_ID[rule_id]
    message = rule.detail(facts) if rule.detail and facts is not None else rule.why
    fix = rule.fix_of(facts)
    if rule.stage == "run":
        return EnvironmentProblem(with_fix(message, fix), rule=rule.id)
    return LauncherError(with_fix(message, fix), rule=rule.id)


def _has_master_weights(f: Facts) -> bool:
    """Whether the engine's optimizer keeps fp32 master weights apart from the stored ones."""
    return _strategy(f) == "deepspeed" and f.plan.precision.compute_dtype in ("bf16", "fp16")


def _memory_excess(f: Facts) -> str | None:
    """'the estimate ... exceeds ...' when a GPU plan's estimated peak does not fit launch.gpu, else None."""
    plan = f.plan
    if plan.launch.device == "cpu":
        return None
    from launcher.planning.gpus import plan_gpu
    from launcher.planning.memory import estimate, model_params

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


# --- Transformer Engine, true to the library (issue 29) ---
# Read from Transformer Engine 2.20.2's Python source (the `transformer_engine` wheel): what it does with activation
# checkpointing under torch.compile, FP8 attention, and FP8 weights. TE-FP8-PARAMS-NO-MASTER is gone: DDP and FSDP2 runs
# with precision.te.fp8_params now train with TE's FusedAdam keeping an fp32 master copy (launcher/train/precision/te.py).

def _te_like(f: Facts) -> bool:
    """Transformer Engine modules in the model: backend te, or MS-AMP with use_te (it swaps Linears to te.Linear)."""
    return _fp8(f, TE) or (_fp8(f, MSAMP) and f.plan.precision.msamp.use_te)


def _te_attention(f: Facts) -> str:
    """The precision.te attention keys the spec sets ("" when neither)."""
    te = f.plan.precision.te
    return " and ".join(k for k, on in (("precision.te.fp8_dpa", te.fp8_dpa), ("precision.te.fp8_mha", te.fp8_mha)) if on)


def _fp8_params(f: Facts) -> bool:
    return _fp8(f, TE) and f.plan.precision.te.fp8_params


_TE_RULES: tuple[Rule, ...] = (
    Rule(id="TE-AC-COMPILE", severity="error", stage="plan",
         when="Transformer Engine (backend te, or msamp with use_te) with compile.enabled and activation_checkpointing != none",
         why="a checkpointed Transformer Engine block recomputes through TE's own checkpoint, which keeps the forward's FP8 state "
             "for the recompute, and that function is dynamo-disabled (@torch._disable_dynamo on "
             "transformer_engine.pytorch.distributed.checkpoint): torch.compile of such a block compiles nothing and runs it eagerly. "
             "torch's checkpoint, which dynamo traces, would recompute outside te.autocast (no FP8 in the recompute; delayed scaling "
             "records every amax twice).",
         fix='set activation_checkpointing.mode = "none" (and keep compile.enabled), or compile.enabled = false',
         condition=lambda f: _te_like(f) and f.plan.compile.enabled and f.plan.activation_checkpointing.mode != "none"),
    Rule(id="TE-FP8-ATTENTION-MODEL", severity="error", stage="plan",
         when="precision.te.fp8_dpa or fp8_mha with an hf: or py: model",
         why="fp8launch runs attention in FP8 by putting te.DotProductAttention in place of the attention it owns (the builtin "
             "models' causal grouped-query attention core); an hf: or py: model's attention is its own code, which te.autocast "
             "leaves in high precision, so the recipe's fp8_dpa / fp8_mha would change nothing.",
         fix='set precision.te.fp8_dpa = false and precision.te.fp8_mha = false, or train.model = "builtin:..."',
         condition=lambda f: _fp8(f, TE) and bool(_te_attention(f)) and not f.plan.train.model.startswith("builtin:"),
         detail=lambda f: f"{_te_attention(f)} would change nothing for {f.plan.train.model}: fp8launch swaps only the builtin models' "
             "attention core for te.DotProductAttention; this model's attention is its own code, which te.autocast leaves in high precision."),
    Rule(id="TE-FP8-MHA", severity="error", stage="plan",
         when="precision.te.fp8_mha with a builtin model",
         why="fp8_mha means the QKV projection hands FP8 outputs straight to DotProductAttention. Transformer Engine does that only "
             "without rotary embeddings (\"RoPE is only implemented in F16 currently\"), and never under current scaling or MXFP8 "
             "(transformer_engine/pytorch/attention/multi_head_attention.py, qkv_fp8_output); the builtin models apply rotary "
             "embeddings between the projection and the attention, so even TE's own MultiheadAttention would run fp8_mha exactly as "
             "fp8_dpa (FP8 attention GEMMs, high-precision Q/K/V).",
         fix="set precision.te.fp8_mha = false, and precision.te.fp8_dpa = true for FP8 attention",
         condition=lambda f: _fp8(f, TE) and f.plan.precision.te.fp8_mha and f.plan.train.model.startswith("builtin:")),
    Rule(id="TE-FP8-DPA-BACKEND", severity="error", stage="run", when=te_attention.WHEN_RUN, why=te_attention.WHY, fix=te_attention.FIX,
         condition=lambda f: bool(te_attention.run_refusal(f.plan, f.capability)),
         detail=lambda f: te_attention.run_refusal(f.plan, f.capability), fix_for=lambda f: te_attention.run_fix(f.plan, f.capability)),
    Rule(id="TE-FP8-DPA-GPU", severity="error", stage="plan", when=te_attention.WHEN_PLAN, why=te_attention.WHY, fix=te_attention.FIX,
         condition=lambda f: bool(te_attention.plan_refusal(f.plan)), detail=lambda f: te_attention.plan_refusal(f.plan),
         fix_for=lambda f: te_attention.plan_fix(f.plan)),
    Rule(id="TE-FP8-PARAMS-OPTIMIZER", severity="error", stage="plan",
         when="precision.te.fp8_params with train.optimizer = sgd",
         why="FP8 weights train only with an optimizer that keeps a high-precision master copy, steps it and re-quantizes the "
             "weight from it; fp8launch builds Transformer Engine's FusedAdam with master_weights=True for that (adam or adamw).",
         fix='set train.optimizer = "adamw" (or "adam"), or precision.te.fp8_params = false',
         condition=lambda f: _fp8_params(f) and f.plan.train.optimizer not in ("adam", "adamw")),
    Rule(id="TE-FP8-PARAMS-FSDP2-BLOCK", severity="error", stage="plan",
         when="precision.te.fp8_params under FSDP2 with recipe block, mxfp8 or nvfp4",
         why="Transformer Engine's FSDP2 all-gather hooks of the block-scaled weights (Float8BlockwiseQTensor, MXFP8Tensor) do not "
             "take parameters quantized on the GPU before sharding, and NVFP4 weights are not supported under FSDP2 at all (\"the "
             "block tensor is dequantized before we flatten it for FSDP2\"; TE's tests/pytorch/distributed/fsdp2_tests/"
             "run_fsdp2_fused_adam.py); fp8launch builds TE modules from the initialised model, before FSDP2 shards it. Per-tensor "
             "FP8 weights (delayed, current) are all-gathered in FP8 by TE's Float8Tensor.fsdp_pre_all_gather.",
         fix='set precision.te.recipe = "current" (or "delayed"), or precision.te.fp8_params = false, or distributed.strategy = "ddp"',
         condition=lambda f: _fp8_params(f) and _strategy(f) == "fsdp2" and f.plan.precision.te.recipe in TE.capability),
    Rule(id="TE-FP8-PARAMS-DEEPSPEED-FP32", severity="error", stage="plan",
         when="precision.te.fp8_params with strategy deepspeed in fp32",
         why="DeepSpeed's fp32 optimizer steps the parameters themselves: with FP8 weights every update would be rounded to FP8 and "
             "small updates lost (no master copy), and DeepSpeed's p.data casts quantize a copy (rule TE-FP8-PARAMS-DEEPSPEED).",
         fix='set precision.te.fp8_params = false, or distributed.strategy = "fsdp2" (or "ddp")',
         condition=lambda f: _fp8_params(f) and _ds(f) and not _has_master_weights(f)),
)

RULES += _TE_RULES
RULES_BY_ID.update({r.id: r for r in _TE_RULES})


# --- MS-AMP's levels natively (issue 30): optimizer states, gradient reduction, master weights ---------------------

def _levels_asked(f: Facts) -> list[str]:
    """The level keys this plan sets to something other than their default, as 'key = "value"'."""
    p = f.plan.precision
    asked = (("optimizer_states", p.optimizer_states, "fp32"), ("grad_reduce", p.grad_reduce, "auto"),
             ("master_weights", p.master_weights, "fp32"))
    return [f'precision.{k} = "{v}"' for k, v, default in asked if v != default]


def _states_or_master(f: Facts) -> list[str]:
    return [k for k in _levels_asked(f) if not k.startswith("precision.grad_reduce")]


def backend_missing_fix(plan: Plan, package: str) -> str:
    """How to get a missing package; for MS-AMP also its opt level natively (it is on no package index)."""
    fix = f"install it: {INSTALL[package]}"
    b = backend_of(plan.precision)
    return _msamp_level_fix(Facts(plan=plan), fix) if b is MSAMP and package == b.package else fix


def _msamp_level_fix(f: Facts, first: str) -> str:
    """`first`, or MS-AMP's opt level natively (launcher/planning/levels.py)."""
    from launcher.planning.levels import native_fix

    return f"{first}, or use {native_fix(f.plan.precision.msamp.opt_level)}"


_LEVEL_RULES: tuple[Rule, ...] = (
    Rule(id="OPTIMIZER-STATES-SGD", severity="error", stage="plan",
         when="precision.optimizer_states != fp32 with train.optimizer = sgd",
         why="fp8launch's SGD is plain SGD without momentum: it keeps no optimizer states, so there is nothing to store in "
             "8 or 16 bits; the setting would be a silent no-op.",
         fix='set precision.optimizer_states = "fp32", or train.optimizer = "adamw" (its two moments then take that dtype)',
         condition=lambda f: f.plan.precision.optimizer_states != "fp32" and f.plan.train.optimizer == "sgd",
         detail=lambda f: f'precision.optimizer_states = "{f.plan.precision.optimizer_states}" with train.optimizer = "sgd": '
             "plain SGD (no momentum) keeps no optimizer states."),
    Rule(id="MASTER-WEIGHTS-OPTIMIZER", severity="error", stage="plan",
         when='precision.master_weights = "bf16" with train.optimizer = sgd',
         why="bf16 weights without an fp32 copy need their update rounded stochastically, or every update smaller than half a "
             "bf16 step (2^-8 of the weight) is lost; fp8launch does that in torchao's Adam kernel (bf16_stochastic_round), "
             "which SGD does not go through.",
         fix='set train.optimizer = "adamw" (or "adam"), or precision.master_weights = "fp32"',
         condition=lambda f: f.plan.precision.master_weights == "bf16" and f.plan.train.optimizer == "sgd"),
    Rule(id="MASTER-WEIGHTS-COMPUTE", severity="error", stage="plan",
         when='precision.master_weights = "bf16" with a compute dtype other than bf16 (precision.mode fp32 / fp16, or fp8 '
              "with high_precision fp32 / fp16)",
         why="bf16 master weights are the parameters themselves: the model computes from bf16 weights, which an fp32 run "
             "would have to upcast everywhere (it does not: the GEMMs would fail on mixed dtypes) and an fp16 run would round "
             "again to fp16's narrower range.",
         fix='set precision.mode = "bf16" (or precision.high_precision = "bf16" with fp8), or precision.master_weights = "fp32"',
         condition=lambda f: f.plan.precision.master_weights == "bf16" and f.plan.precision.compute_dtype != "bf16",
         detail=lambda f: f'precision.master_weights = "bf16" in a {f.plan.precision.compute_dtype} run: the model would compute '
             "from bf16 weights in another dtype."),
    Rule(id="LEVELS-DEEPSPEED", severity="error", stage="plan",
         when="precision.optimizer_states != fp32 or precision.master_weights = bf16 with strategy deepspeed",
         why="DeepSpeed's ZeRO optimizer keeps its own fp32 master partitions (bf16 / fp16 runs) and steps the optimizer on flat "
             "partitions whose sizes follow the world size, not torchao's 256-value blocks, so neither 8-bit states nor a "
             "bf16-only master would take effect as asked. FSDP2 is ZeRO-3's sharding with per-parameter shards torchao's "
             "optimizers step.",
         fix='set distributed.strategy = "fsdp2" (ZeRO-3-style sharding) or "ddp"; or precision.optimizer_states = "fp32" and '
             'precision.master_weights = "fp32"',
         condition=lambda f: _ds(f) and bool(_states_or_master(f)),
         detail=lambda f: " and ".join(_states_or_master(f)) + " with DeepSpeed, whose ZeRO optimizer keeps fp32 master partitions "
             "and steps flat partitions: the setting would not take effect."),
    Rule(id="GRAD-REDUCE-DEEPSPEED", severity="error", stage="plan",
         when="precision.grad_reduce != auto with strategy deepspeed",
         why="DeepSpeed reduces gradients in its own reducer and ZeRO optimizer (bucketed reduce / reduce-scatter), which take "
             "no communication hook; its nearest setting is communication_data_type (fp32, fp16 or bf16 payloads, no FP8), which "
             "follows the model's dtype by default: bf16 in a bf16 run, half of fp32's bytes.",
         fix='set precision.grad_reduce = "auto" (DeepSpeed reduces in the model\'s dtype: bf16 with precision.high_precision = '
             '"bf16"), or distributed.strategy = "ddp" or "fsdp2" for an FP8 reduction',
         condition=lambda f: _ds(f) and f.plan.precision.grad_reduce != "auto",
         detail=lambda f: f'precision.grad_reduce = "{f.plan.precision.grad_reduce}" with DeepSpeed, whose own reducer takes no '
             "custom reduction (its nearest setting, communication_data_type, has no FP8 and follows the model's dtype)."),
    Rule(id="GRAD-REDUCE-FSDP2-FP32", severity="error", stage="plan",
         when='precision.grad_reduce = "fp32" with strategy fsdp2 and distributed.fsdp2.reduce_dtype = "bf16"',
         why="FSDP2 casts the gradients to its MixedPrecisionPolicy's reduce_dtype before the reduce-scatter: they are already "
             "rounded to bf16 when the payload is chosen, and sending them as fp32 doubles the bytes for nothing.",
         fix='set distributed.fsdp2.reduce_dtype = "fp32" (gradients reduced and summed in fp32), or precision.grad_reduce = "auto"',
         condition=lambda f: _strategy(f) == "fsdp2" and f.plan.precision.grad_reduce == "fp32"
             and f.plan.distributed.fsdp2.reduce_dtype == "bf16"),
    Rule(id="LEVELS-BACKEND", severity="error", stage="plan",
         when="precision.optimizer_states, grad_reduce or master_weights set with backend msamp; master_weights = bf16 with "
              "backend te; optimizer_states != fp32 with precision.te.fp8_params",
         why="MS-AMP sets all three itself from precision.msamp.opt_level (its FP8 all-reduce, LBAdamW's fp8 / fp16 moments, "
             "fp16 master weights); Transformer Engine's modules are built in their own dtype when swapped in (a bf16 master "
             "copy would be replaced), and with fp8_params TE's FusedAdam keeps the fp32 master and the states.",
         fix='set precision.msamp.opt_level for MS-AMP (or precision.backend = "torchao" for these keys); with te, leave '
             'precision.master_weights = "fp32" and, with fp8_params, precision.optimizer_states = "fp32"',
         condition=lambda f: bool(_levels_backend(f)),
         detail=lambda f: _levels_backend(f)),
)


def _levels_backend(f: Facts) -> str:
    p = f.plan.precision
    if _fp8(f, MSAMP) and _levels_asked(f):
        return (" and ".join(_levels_asked(f)) + f" with MS-AMP, which sets its optimizer states, gradient reduction and master "
                f"weights from precision.msamp.opt_level = \"{p.msamp.opt_level}\".")
    if _fp8(f, TE) and p.master_weights == "bf16":
        return 'precision.master_weights = "bf16" with Transformer Engine, whose swapped-in modules are built in their own dtype.'
    if _fp8(f, TE) and p.te.fp8_params and p.optimizer_states != "fp32":
        return (f'precision.optimizer_states = "{p.optimizer_states}" with precision.te.fp8_params, whose FusedAdam keeps the '
                "fp32 master weights and the states.")
    return ""


RULES += _LEVEL_RULES
RULES_BY_ID.update({r.id: r for r in _LEVEL_RULES})
