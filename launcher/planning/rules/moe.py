"""Mixture-of-experts models: which recipe the grouped experts get, and the router gate that stays in high precision."""

from __future__ import annotations

from launcher.planning.backends import BACKENDS, TORCHAO
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import builtin_experts, fp8

EXPERTS_NAME = "layers.1.moe.experts"
ROUTER_EXAMPLES = ("layers.0.moe.router.gate", "model.layers.0.mlp.gate", "model.layers.0.block_sparse_moe.gate")


def _moe(f: Facts) -> bool:
    """The plan trains a builtin MoE shape (hf:/py: models are only known at run time)."""
    return bool(builtin_experts(f))


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


RULES: tuple[Rule, ...] = (
    Rule(id="MOE-ROUTER-FP8", severity="error", stage="plan",
         when="a [[precision.rules]] entry with a recipe matches an MoE router gate (*.moe.router.gate, Hugging Face *.mlp.gate)",
         why="the router's scores pick each token's experts: FP8 noise there flips the top-k choice, so torchtitan computes the gate in "
             "fp32 and fp8launch always keeps it in high precision; the rule would be ignored.",
         fix='narrow that precision.rules entry\'s match so it leaves the router gate out (e.g. "*.moe.experts" or "*.attention.*")',
         condition=lambda f: fp8(f, TORCHAO) and bool(_moe_router_rules(f)),
         detail=lambda f: f"[[precision.rules]] match = {_moe_router_rules(f)[0]!r} puts the MoE router gate into FP8."),
    Rule(id="MOE-ROWWISE-CPU", severity="error", stage="plan",
         when="rowwise FP8 for the grouped experts of an MoE model with launch.device = cpu",
         why="torchao's FP8 rowwise grouped GEMM (Float8TrainingOpConfig) runs torch._scaled_grouped_mm, a CUDA kernel for sm90+; only "
             "MXFP8 has emulated grouped GEMMs for the CPU.",
         fix='set precision.torchao.recipe = "mxfp8" (emulated grouped GEMMs on CPU), or launch.device = "cuda"',
         condition=lambda f: fp8(f, TORCHAO) and f.plan.launch.device == "cpu" and _expert_recipe(f) == "rowwise",
         fix_for=lambda f: (f"set the recipe of the precision.rules entry {_expert_rule(f).match!r} to \"mxfp8\" (emulated grouped GEMMs "
                            'on CPU), or launch.device = "cuda"') if _expert_rule(f) else ""),
    Rule(id="MOE-ROWWISE-HARDWARE", severity="error", stage="run",
         when="rowwise FP8 for the grouped experts of an MoE model on a GPU below compute capability 9.0",
         why="torch._scaled_grouped_mm (torchao's FP8 rowwise grouped GEMM) has kernels for sm90 and sm100 only; an sm89 GPU runs FP8 "
             "Linears but not grouped FP8 GEMMs.",
         fix='set precision.torchao.recipe = "tensorwise" (experts stay in bf16) or run on an H100 / B200',
         condition=lambda f: fp8(f, TORCHAO) and f.device == "cuda" and f.capability is not None and f.capability < (9, 0)
         and _expert_recipe(f) == "rowwise"),
    Rule(id="MOE-EXPERTS-HP", severity="warning", stage="plan",
         when="fp8 with an MoE model whose experts' recipe has no grouped GEMM (torchao tensorwise / rowwise_with_gw_hp / nvfp4; te; "
              "msamp)",
         why="the expert weights (most of an MoE's FLOPs) stay in bf16: torchao 0.18 has grouped FP8 GEMMs for rowwise and mxfp8 only; "
             "Transformer Engine and MS-AMP convert nn.Linear only.",
         fix='set precision.backend = "torchao" and precision.torchao.recipe = "mxfp8" or "rowwise", or add [[precision.rules]] match = '
             '"*.moe.experts" recipe = "mxfp8"',
         condition=lambda f: fp8(f) and _moe(f) and _expert_recipe(f) not in (None, "rowwise", "mxfp8"),
         detail=lambda f: f"the experts of {f.plan.train.model} stay in bf16 with {_expert_recipe(f) or f.plan.precision.backend}."),
    Rule(id="MOE-ALLGATHER-EXPERTS", severity="warning", stage="plan",
         when="precision.torchao.fsdp_float8_all_gather with an MoE model",
         why="torchao's float8 all-gather applies to Float8Linear weights only; the 3D expert weights (torchao's MoE-training wrapper "
             "all-gathers them in the param dtype) and tensorwise experts (not converted) are all-gathered in bf16, so most of an MoE's "
             "all-gather bytes do not shrink.",
         fix="set precision.torchao.fsdp_float8_all_gather = false, or keep it for the attention and shared-expert Linears knowing the "
             "experts gather in bf16",
         condition=lambda f: fp8(f, TORCHAO) and f.plan.precision.torchao.fsdp_float8_all_gather and _moe(f)),
)
