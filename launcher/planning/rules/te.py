"""Transformer Engine, true to the library: its recipes under compile and on each GPU, FP8 attention, FP8 weights
(fp8_params) with each optimizer and strategy, and the shapes its FP8 GEMMs need. Read from TE 2.20.2's Python source."""

from __future__ import annotations

from launcher.planning.backends import MSAMP, TE
from launcher.planning.hardware import capability_text, requirement, supports
from launcher.planning.rules import te_attention
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import fp8, fullgraph, is_deepspeed, strategy, tokens_per_rank


def _te_like(f: Facts) -> bool:
    """Transformer Engine modules in the model: backend te, or MS-AMP with use_te (it swaps Linears to te.Linear)."""
    return fp8(f, TE) or (fp8(f, MSAMP) and f.plan.precision.msamp.use_te)


def _te_attention(f: Facts) -> str:
    """The precision.te attention keys the spec sets ("" when neither)."""
    te = f.plan.precision.te
    return " and ".join(k for k, on in (("precision.te.fp8_dpa", te.fp8_dpa), ("precision.te.fp8_mha", te.fp8_mha)) if on)


def _fp8_params(f: Facts) -> bool:
    return fp8(f, TE) and f.plan.precision.te.fp8_params


def _has_master_weights(f: Facts) -> bool:
    """Whether the engine's optimizer keeps fp32 master weights apart from the stored ones."""
    return strategy(f) == "deepspeed" and f.plan.precision.compute_dtype in ("bf16", "fp16")


RULES: tuple[Rule, ...] = (
    Rule(id="TE-DELAYED-COMPILE", severity="error", stage="plan",
         when='te recipe "delayed" + compile.enabled',
         why='Transformer Engine: "DelayedScaling is not supported under torch.compile" (check_recipe_support).',
         fix='set precision.te.recipe = "current", or compile.enabled = false',
         condition=lambda f: fp8(f, TE) and f.plan.precision.te.recipe == "delayed" and f.plan.compile.enabled),
    Rule(id="TE-BLOCK-FP8-ATTENTION", severity="error", stage="plan",
         when='te recipe "block" with fp8_dpa or fp8_mha',
         why="Transformer Engine's Float8BlockScaling does not support FP8 attention (its recipe asserts fp8_dpa and fp8_mha are off).",
         fix="set precision.te.fp8_dpa = false and precision.te.fp8_mha = false, or precision.te.recipe = \"current\"",
         condition=lambda f: fp8(f, TE) and f.plan.precision.te.recipe == "block"
             and (f.plan.precision.te.fp8_dpa or f.plan.precision.te.fp8_mha)),
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
         why="Transformer Engine's hardware checks: MXFP8/NVFP4 need Blackwell (sm100+), and TE 2.20 refuses MXFP8 on sm120; block scaling "
             "needs Hopper (sm90+).",
         fix='set precision.te.recipe = "current" (or "delayed"), or run on a newer GPU',
         condition=lambda f: fp8(f, TE) and f.capability is not None and f.plan.precision.te.recipe in TE.capability
             and not supports(f.capability, "fp8", TE.name, f.plan.precision.te.recipe),
         detail=lambda f: f"TE recipe {f.plan.precision.te.recipe!r} needs {requirement('fp8', TE.name, f.plan.precision.te.recipe)}; this "
                          f"GPU has {capability_text(f.capability)}."),
    Rule(id="FULLGRAPH-TE", severity="error", stage="plan",
         when="compile.fullgraph with backend te",
         why="Transformer Engine's modules fall back to eager through a graph break in many configurations (te.Linear with delayed "
             "scaling, FP8 weight caching, debug features) and te.distributed.checkpoint is dynamo-disabled: under fullgraph a graph "
             "break is an error at the first forward.",
         fix="set compile.fullgraph = false (TE's modules then run eager between compiled regions)",
         condition=lambda f: fp8(f, TE) and fullgraph(f)),
    Rule(id="TE-TOKENS-DIV8", severity="error", stage="plan",
         when="backend te and the tokens of one micro-batch on one rank (micro_batch_size x seq_len) not divisible by 8",
         why="Transformer Engine's FP8 GEMMs need the product of the input's leading dimensions divisible by 8 "
             "(assert_dim_for_fp8_exec): the first FP8 layer fails at step 1.",
         fix="set train.seq_len (or train.micro_batch_size) so that micro_batch_size x seq_len is a multiple of 8",
         condition=lambda f: fp8(f, TE) and tokens_per_rank(f) % 8 != 0,
         detail=lambda f: f"micro_batch_size {f.plan.train.micro_batch_size} x seq_len {f.plan.train.seq_len} = {tokens_per_rank(f)} "
                          "tokens per micro-batch, not a multiple of 8 (Transformer Engine's assert_dim_for_fp8_exec fails at step 1)."),
    Rule(id="TE-FP8-PARAMS-DEEPSPEED", severity="error", stage="plan",
         when="precision.te.fp8_params with strategy deepspeed",
         why="DeepSpeed casts parameters with `p.data = ...` and points p.data at its flat bf16/fp16 buffer after every step; a "
             "Transformer Engine FP8 weight quantizes a copy on assignment, so the full high-precision copy stays and nothing is saved "
             "(and ZeRO-3 partitioning of TE's Float8Tensor is untested upstream).",
         fix="set precision.te.fp8_params = false",
         condition=lambda f: fp8(f, TE) and f.plan.precision.te.fp8_params and is_deepspeed(f) and _has_master_weights(f)),
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
         condition=lambda f: fp8(f, TE) and bool(_te_attention(f)) and not f.plan.train.model.startswith("builtin:"),
         detail=lambda f: f"{_te_attention(f)} would change nothing for {f.plan.train.model}: fp8launch swaps only the builtin models' "
             "attention core for te.DotProductAttention; this model's attention is its own code, which te.autocast leaves in high "
             "precision."),
    Rule(id="TE-FP8-MHA", severity="error", stage="plan",
         when="precision.te.fp8_mha with a builtin model",
         why="fp8_mha means the QKV projection hands FP8 outputs straight to DotProductAttention. Transformer Engine does that only "
             "without rotary embeddings (\"RoPE is only implemented in F16 currently\"), and never under current scaling or MXFP8 "
             "(transformer_engine/pytorch/attention/multi_head_attention.py, qkv_fp8_output); the builtin models apply rotary "
             "embeddings between the projection and the attention, so even TE's own MultiheadAttention would run fp8_mha exactly as "
             "fp8_dpa (FP8 attention GEMMs, high-precision Q/K/V).",
         fix="set precision.te.fp8_mha = false, and precision.te.fp8_dpa = true for FP8 attention",
         condition=lambda f: fp8(f, TE) and f.plan.precision.te.fp8_mha and f.plan.train.model.startswith("builtin:")),
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
         condition=lambda f: _fp8_params(f) and strategy(f) == "fsdp2" and f.plan.precision.te.recipe in TE.capability),
    Rule(id="TE-FP8-PARAMS-DEEPSPEED-FP32", severity="error", stage="plan",
         when="precision.te.fp8_params with strategy deepspeed in fp32",
         why="DeepSpeed's fp32 optimizer steps the parameters themselves: with FP8 weights every update would be rounded to FP8 and "
             "small updates lost (no master copy), and DeepSpeed's p.data casts quantize a copy (rule TE-FP8-PARAMS-DEEPSPEED).",
         fix='set precision.te.fp8_params = false, or distributed.strategy = "fsdp2" (or "ddp")',
         condition=lambda f: _fp8_params(f) and is_deepspeed(f) and not _has_master_weights(f)),
)
