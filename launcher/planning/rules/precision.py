"""The FP8 backends' own constraints: torchao's float8 all-gather and compile, its block-scaled recipes (mxfp8, nvfp4),
the backend package and device, and the FP8 monitor."""

from __future__ import annotations

import typing

from launcher.planning.backends import BACKENDS, MSAMP, TE, TORCHAO, backend_of
from launcher.planning.hardware import BLOCK_RECIPES, BLOCK_SIZE, capability_text, requirement, supports
from launcher.planning.install import INSTALL
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.msamp import msamp_level_fix
from launcher.planning.rules.predicates import fp8, fullgraph, strategy, tokens_per_rank, tp

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


def _block(f: Facts) -> str | None:
    """The torchao block-scaled recipe the plan trains with (mxfp8 / nvfp4), else None."""
    recipe = f.plan.precision.torchao.recipe
    return recipe if fp8(f, TORCHAO) and recipe in BLOCK_RECIPES else None


def _uses_mx(f: Facts) -> bool:
    """Whether torchao builds MXFP8 layers: the plan's recipe, or a `[[precision.rules]]` entry's."""
    return fp8(f, TORCHAO) and (f.plan.precision.torchao.recipe == "mxfp8"
                                or any(r.recipe == "mxfp8" for r in f.plan.precision.rules))


def _monitor(f: Facts) -> bool:
    return f.plan.monitor.fp8_stats_every > 0


def backend_missing_fix(plan: Plan, package: str) -> str:
    """How to get a missing package; for MS-AMP also its opt level natively (it is on no package index)."""
    fix = f"install it: {INSTALL[package]}"
    b = backend_of(plan.precision)
    return msamp_level_fix(Facts(plan=plan), fix) if b is MSAMP and package == b.package else fix


def _split(f: Facts) -> str:
    """What divides each micro-batch's tokens on a rank, in words ("" when nothing does)."""
    d = f.plan.distributed
    parts = [f"{k} {v}" for k, v in (("tensor_parallel", d.tensor_parallel), ("context_parallel", d.context_parallel)) if v > 1]
    if d.pipeline_parallel > 1:
        parts.append(f"in {f.plan.pipeline_microbatches} pipeline micro-batches a step")
    return f" ({', '.join(parts)})" if parts else ""


RULES: tuple[Rule, ...] = (
    Rule(id="FP8-DDP-COMPILE", severity="error", stage="plan",
         when="fp8 + torchao + strategy ddp + compile.enabled",
         why="torchao float8 under DDP with torch.compile fails in DDPOptimizer's graph splitting (pytorch/ao#2586, ao#1308; Axolotl "
             "docs).",
         fix='set distributed.strategy = "fsdp2", or compile.enabled = false',
         condition=lambda f: fp8(f, TORCHAO) and strategy(f) == "ddp" and f.plan.compile.enabled),
    Rule(id="FP8-ALLGATHER-STRATEGY", severity="error", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather and strategy != fsdp2",
         why="float8 all-gather is an FSDP2 feature; other strategies would ignore it (Axolotl validator).",
         fix='set distributed.strategy = "fsdp2", or precision.torchao.fsdp_float8_all_gather = false',
         condition=lambda f: fp8(f, TORCHAO) and f.plan.precision.torchao.fsdp_float8_all_gather and strategy(f) != "fsdp2"),
    Rule(id="FP8-ALLGATHER-RECIPE", severity="error", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather and recipe != tensorwise",
         why="torchao asserts that float8 all-gather needs tensorwise weight scaling.",
         fix='set precision.torchao.recipe = "tensorwise", or precision.torchao.fsdp_float8_all_gather = false',
         condition=lambda f: fp8(f, TORCHAO) and f.plan.precision.torchao.fsdp_float8_all_gather
             and f.plan.precision.torchao.recipe != "tensorwise"),
    Rule(id="CPU-BACKEND", severity="error", stage="plan",
         when='launch.device = "cpu" with backend te or msamp',
         why="Transformer Engine and MS-AMP run only on CUDA GPUs; torchao FP8 is the backend that runs on CPU.",
         fix='set precision.backend = "torchao", or launch.device = "cuda"',
         condition=lambda f: (fp8(f, TE) or fp8(f, MSAMP)) and f.plan.launch.device == "cpu",
         fix_for=lambda f: msamp_level_fix(f, 'set launch.device = "cuda"') if fp8(f, MSAMP) else ""),
    Rule(id="BACKEND-MISSING", severity="error", stage="run",
         when="the chosen backend package is not importable",
         why="the backend package is needed to apply the precision the spec asks for.",
         fix="install it: " + "; ".join(f"{name}: {INSTALL[package]}" for name, package in
                                        (*((b.name, b.package) for b in BACKENDS.values()), ("deepspeed", "deepspeed"))),
         condition=lambda f: f.missing_package is not None,
         detail=lambda f: f"the {f.missing_package} package is not importable here.",
         fix_for=lambda f: backend_missing_fix(f.plan, f.missing_package) if f.missing_package else ""),
    Rule(id="FULLGRAPH-MONITOR", severity="error", stage="plan",
         when="compile.fullgraph with monitor.fp8_stats_every > 0",
         why="the FP8 monitor's hooks run eagerly (torch.compiler.disable) so that sampling does not recompile the blocks; that is a "
             "graph break, and fullgraph turns a graph break into an error at the first sampled step.",
         fix="set compile.fullgraph = false, or monitor.fp8_stats_every = 0",
         condition=lambda f: fullgraph(f) and _monitor(f)),
    Rule(id="FP8-PRECOMPUTE-OFFLOAD", severity="error", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather and precompute_scale with distributed.fsdp2.cpu_offload",
         why="FSDP2 copies each offloaded shard to the GPU with .to(device) before the float8 all-gather, and torchao rebuilds the "
             "weight wrapper without its precomputed scale there: precompute_scale does nothing and every weight all-reduces its own "
             "amax at each all-gather.",
         fix="set precision.torchao.precompute_scale = false (each weight then computes its scale at its all-gather), or "
             "distributed.fsdp2.cpu_offload = false",
         condition=lambda f: fp8(f, TORCHAO) and strategy(f) == "fsdp2" and f.plan.precision.torchao.fsdp_float8_all_gather
             and f.plan.precision.torchao.precompute_scale and f.plan.distributed.fsdp2.cpu_offload),
    Rule(id="MONITOR-NO-FP8", severity="warning", stage="plan",
         when="monitor.fp8_stats_every > 0 with no FP8 layer to watch (precision.mode != fp8, or backend msamp)",
         why="the monitor measures the casts of FP8 layers; without any (or with MS-AMP, whose FP8 layers it does not hook) it writes no "
             "fp8_stats.jsonl, a silent no-op.",
         fix='set monitor.fp8_stats_every = 0, or precision.mode = "fp8" with backend torchao or te',
         condition=lambda f: _monitor(f) and not (fp8(f, TORCHAO) or fp8(f, TE))),
    Rule(id="TORCHAO-BLOCK-HARDWARE", severity="error", stage="run",
         when="torchao recipe mxfp8 or nvfp4 on a CUDA GPU below compute capability 10.0",
         why="torchao's MX and NVFP4 kernels need Blackwell (they check is_sm_at_least_100); on an older GPU the first "
             "forward fails inside torchao. On CPU, mxfp8 runs torchao's emulated kernels (real numerics, not speed).",
         fix='set precision.torchao.recipe = "tensorwise" (or "rowwise"), or run on an sm100+ GPU (B200, GB200)',
         condition=lambda f: bool(_block(f)) and f.device == "cuda" and f.capability is not None
             and not supports(f.capability, "fp8", TORCHAO.name, _block(f)),
         detail=lambda f: f"torchao recipe {_block(f)!r} needs {requirement('fp8', TORCHAO.name, _block(f))}; this GPU has "
                          f"{capability_text(f.capability)}."),
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
         fix="set train.seq_len (or train.micro_batch_size) so that micro_batch_size x seq_len / (tensor_parallel x "
             "context_parallel) is a multiple of the block (under pipeline parallel: the sequences of a pipeline micro-batch)",
         condition=lambda f: bool(_block(f)) and tokens_per_rank(f) % BLOCK_SIZE[_block(f)] != 0,
         detail=lambda f: f"micro_batch_size {f.plan.train.micro_batch_size} x seq_len {f.plan.train.seq_len}{_split(f)} gives "
                          f"{tokens_per_rank(f)} tokens per micro-batch and rank, not a multiple of {_block(f)}'s block of "
                          f"{BLOCK_SIZE[_block(f)]}."),
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
         condition=lambda f: bool(_block(f)) and strategy(f) == "deepspeed"),
    Rule(id="TORCHAO-BLOCK-TP", severity="error", stage="plan",
         when="distributed.tensor_parallel > 1 with torchao recipe mxfp8 or nvfp4",
         why="fp8launch's tensor-parallel plan uses torchao's float8 TP styles (tensorwise casts around the collectives); "
             "the MX and NVFP4 wrappers have their own TP protocol (NVFP4ColwiseParallel, ...) that fp8launch does not wire.",
         fix='set distributed.tensor_parallel = 1, or precision.torchao.recipe = "tensorwise"',
         condition=lambda f: bool(_block(f)) and tp(f) > 1),
    Rule(id="MONITOR-BLOCK", severity="error", stage="plan",
         when="monitor.fp8_stats_every > 0 with torchao recipe nvfp4",
         why="the FP8 monitor measures FP8 casts (torchao's Float8Linear and MXFP8 layers, TE's modules); NVFP4's 4-bit e2m1 "
             "cast with its random Hadamard transform is not modelled, so the run would write no statistics for its layers.",
         fix='set monitor.fp8_stats_every = 0, or precision.torchao.recipe = "mxfp8" (or a Float8Linear recipe) to watch the casts',
         condition=lambda f: _block(f) == "nvfp4" and _monitor(f)),
    Rule(id="TORCHAO-MX-TORCH", severity="error", stage="run",
         when="torchao recipe mxfp8 (the plan's or a precision.rules entry's) with a torch lacking what torchao's MXFP8 asserts",
         why="torchao 0.18's MXFP8 training asserts DTensor's scaled_mm_single_dim_strategy and is_pinned_handler "
             "(moe_training/conversion_utils.py: \"Please install the latest torch nightly\"); torch 2.13 has them, 2.11 not.",
         fix="install torch >= 2.13 (the version fp8launch pins), or set precision.torchao.recipe = \"tensorwise\" (and no "
             "precision.rules entry's recipe to mxfp8)",
         condition=lambda f: _uses_mx(f) and f.torchao_mx_supported is False),
)
