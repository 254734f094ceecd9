"""Where Transformer Engine 2.20.2 finds a backend for FP8 attention (precision.te.fp8_dpa), torch-free: the rules
TE-FP8-DPA-GPU (plan: launch.gpu) and TE-FP8-DPA-BACKEND (run: the GPU found) ask it, with the model's head_dim.

Read from TE 2.20.2 (the `transformer_engine` wheel), attention/dot_product_attention/utils.py, get_attention_backend,
"Filter: Execution type" with the recipe's fp8_dpa:
- FlashAttention 2 and 4 are disabled for FP8 attention, FlashAttention 3 for FP8 training;
- UnfusedDotProductAttention is disabled for FP8 unless NVTE_UnfusedDPA_Emulate_FP8=1 (an emulation);
- FusedAttention is disabled for FP8 current scaling and for MXFP8 below sm100, for Float8BlockScaling and
  NVFP4BlockScaling everywhere, and every FP8 backend is disabled on sm120.
That leaves FusedAttention's FP8 sub-backend, whose shapes cuDNN decides. TE's own statement of them is
transformer_engine/common/fused_attn/fused_attn.cpp, nvte_get_fused_attn_backend (through v2.18 and 2.20.0.dev0; in
2.20.2 the same check is cuDNN's, behind support_verdict_fp8 in fused_attn_fp8.h): FP8 needs sm90+, head dims that are
multiples of 16, and
- sm90 (Hopper): training "bwd d=128 only": head_dim_qk = head_dim_v = 128;
- sm100+ (Blackwell): head_dim_qk <= 128 and head_dim_v <= 128; from cuDNN 9.21 head_dim_qk <= 192.
Where nothing is left, DotProductAttention.forward raises NO_BACKEND at the first step. The cuDNN version is not known
when planning: these rules take the newest (a backend that some cuDNN has is not refused here).
tests/gpu/test_te_conformance.py holds the stand-in TE and the installed TE on a GPU to `refusal`.
"""

from __future__ import annotations

import typing

from launcher.planning.backends import TE, backend_of
from launcher.planning.gpus import PLAN_GPUS
from launcher.planning.hardware import capability_text, supports
from launcher.planning.models import MOE_SIZES, SIZES, builtin_config, is_moe

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan

NO_BACKEND = "No dot product attention backend is available"
"""How DotProductAttention.forward starts its error when every backend is disabled (dot_product_attention.py)."""

HOPPER_TRAINING_HEAD_DIM = 128
"""The one head_dim (qk and v) FP8 FusedAttention trains on sm90."""
BLACKWELL_MAX_HEAD_DIM_QK, BLACKWELL_MAX_HEAD_DIM_V = 192, 128
"""FP8 FusedAttention's largest head dims on sm100+ (192 for qk from cuDNN 9.21, 128 before)."""
HEAD_DIM_MULTIPLE = 16

_RECIPE_CLASS = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling", "block": "Float8BlockScaling",
                 "mxfp8": "MXFP8BlockScaling", "nvfp4": "NVFP4BlockScaling"}

WHEN_PLAN = ("precision.te.fp8_dpa on a launch.gpu (for \"auto\": on every GPU that runs the recipe) where Transformer Engine "
             "has no FP8 attention backend for the recipe and the model's head_dim")
WHEN_RUN = "precision.te.fp8_dpa on a GPU where Transformer Engine has no FP8 attention backend for the recipe and the model's head_dim"
WHY = ("for FP8 attention Transformer Engine turns off FlashAttention (FP8 training) and the unfused attention (unless "
       "NVTE_UnfusedDPA_Emulate_FP8=1), which leaves FusedAttention: none on sm120, none for current scaling or MXFP8 below "
       "sm100, none for nvfp4; on sm90 it trains only head_dim 128 (qk and v), on sm100 head_dim_qk <= 192 and head_dim_v "
       "<= 128, multiples of 16 (attention/dot_product_attention/utils.py get_attention_backend; common/fused_attn/"
       f"fused_attn.cpp): the first forward fails with \"{NO_BACKEND}\".")
FIX = ('set precision.te.fp8_dpa = false, or run on a GPU and recipe that has FP8 attention for the model\'s head_dim '
       '(sm90: head_dim 128 with recipe "delayed"; sm100, e.g. B200: head_dim <= 128)')


def refusal(capability: tuple[int, int], recipe: str, head_dim_qk: int, head_dim_v: int | None = None) -> str:
    """Why TE 2.20.2 has no backend to train FP8 attention of these head dims under `recipe` (fp8launch's name: delayed,
    current, block, mxfp8, nvfp4) on a GPU of `capability`; "" when FusedAttention takes it."""
    head_dim_v = head_dim_qk if head_dim_v is None else head_dim_v
    sm = f"sm{capability[0]}{capability[1]}"
    if recipe in ("block", "nvfp4"):
        return f"FusedAttention is disabled for {_RECIPE_CLASS[recipe]} on every GPU"
    if capability == (12, 0):
        return "FusedAttention is disabled for FP8 on sm120"
    if capability < (9, 0):
        return f"FusedAttention's FP8 kernels need sm90 or newer; this GPU is {sm}"
    if recipe in ("current", "mxfp8") and capability < (10, 0):
        return f"FusedAttention is disabled for {_RECIPE_CLASS[recipe]} below sm100; this GPU is {sm}"
    dims = f"head_dim_qk {head_dim_qk}, head_dim_v {head_dim_v}" if head_dim_qk != head_dim_v else f"head_dim {head_dim_qk}"
    if head_dim_qk % HEAD_DIM_MULTIPLE or head_dim_v % HEAD_DIM_MULTIPLE:
        return f"FP8 FusedAttention needs head dims that are multiples of {HEAD_DIM_MULTIPLE}; this model has {dims}"
    if capability < (10, 0):
        if head_dim_qk != HOPPER_TRAINING_HEAD_DIM or head_dim_v != HOPPER_TRAINING_HEAD_DIM:
            return f"on {sm} FP8 FusedAttention trains only head_dim {HOPPER_TRAINING_HEAD_DIM} (qk and v), not {dims}"
        return ""
    if head_dim_qk > BLACKWELL_MAX_HEAD_DIM_QK or head_dim_v > BLACKWELL_MAX_HEAD_DIM_V:
        return (f"on {sm} FP8 FusedAttention trains head_dim_qk <= {BLACKWELL_MAX_HEAD_DIM_QK} and head_dim_v <= "
                f"{BLACKWELL_MAX_HEAD_DIM_V}, not {dims}")
    return ""


def _asked(plan: Plan) -> tuple[str, int] | None:
    """(recipe, head_dim) of a TE plan with fp8_dpa and a builtin model; None otherwise. Float8BlockScaling is left to
    rule TE-BLOCK-FP8-ATTENTION (TE refuses the recipe itself)."""
    te = plan.precision.te
    cfg = builtin_config(plan.train.model)
    if backend_of(plan.precision) is not TE or not te.fp8_dpa or cfg is None or te.recipe == "block":
        return None
    return te.recipe, cfg.head_dim


def _message(plan: Plan, capability: tuple[int, int], reason: str) -> str:
    head_dim = builtin_config(plan.train.model).head_dim
    return (f"Transformer Engine has no FP8 attention backend for {plan.train.model} (head_dim {head_dim}) with recipe "
            f"{plan.precision.te.recipe!r} on compute capability {capability_text(capability)}: {reason}; "
            "FlashAttention and the unfused attention are off for FP8 training, so the first forward would fail with "
            f"\"{NO_BACKEND}\".")


def run_refusal(plan: Plan, capability: tuple[int, int] | None) -> str:
    """The message of rule TE-FP8-DPA-BACKEND for the GPU a run found ("" where TE has a backend, or on CPU)."""
    asked = _asked(plan)
    if asked is None or capability is None:
        return ""
    reason = refusal(capability, *asked)
    return _message(plan, capability, reason) if reason else ""


def _plan_gpus(plan: Plan) -> list[str]:
    """The launch.gpu names the plan may run on: its own, or for "auto" every NVIDIA GPU that runs its recipe."""
    if plan.launch.device == "cpu":
        return []
    if plan.launch.gpu != "auto":
        return [plan.launch.gpu] if PLAN_GPUS[plan.launch.gpu].capability else []
    return [g for g, spec in PLAN_GPUS.items() if spec.capability and supports(spec.capability, "fp8", TE.name, plan.precision.te.recipe)]


def plan_refusal(plan: Plan) -> str:
    """The message of rule TE-FP8-DPA-GPU: TE has no FP8 attention backend on launch.gpu, or for "auto" on any GPU that
    runs the recipe ("" otherwise, and where launch.gpu cannot run the recipe at all: rule LAUNCH-GPU-PRECISION)."""
    asked, gpus = _asked(plan), _plan_gpus(plan)
    if asked is None or not gpus:
        return ""
    caps = [PLAN_GPUS[g].capability for g in gpus]
    if not all(supports(c, "fp8", TE.name, asked[0]) for c in caps):
        return ""
    reasons = [refusal(c, *asked) for c in caps]
    if not all(reasons):
        return ""
    where = f"launch.gpu = {plan.launch.gpu!r}" if plan.launch.gpu != "auto" else f'any GPU (launch.gpu = "auto": {", ".join(gpus)})'
    return f"on {where}: " + _message(plan, caps[0], reasons[0])


def _fixes(plan: Plan, capabilities: list[tuple[int, int]], run: bool) -> list[str]:
    """The changes that would give the plan an FP8 attention backend (on every one of `capabilities`)."""
    recipe, head_dim = _asked(plan)
    out = ["set precision.te.fp8_dpa = false"]
    recipes = [f'"{r}"' for r in ("delayed", "current", "mxfp8")
               if r != recipe and all(supports(c, "fp8", TE.name, r) and not refusal(c, r, head_dim) for c in capabilities)]
    if recipes:
        out.append(f"precision.te.recipe = {recipes[0]}" + (f" (or {', '.join(recipes[1:])})" if recipes[1:] else ""))
    family = MOE_SIZES if is_moe(builtin_config(plan.train.model)) else SIZES
    models: dict[int, list[str]] = {}
    for name, cfg in family.items():
        if all(not refusal(c, recipe, cfg.head_dim) for c in capabilities):
            models.setdefault(cfg.head_dim, []).append(f"builtin:{name}")
    if models:
        out.append("a train.model whose head_dim has one (" + "; ".join(f"{', '.join(m)}: head_dim {d}" for d, m in models.items()) + ")")
    gpus = [g for g, spec in PLAN_GPUS.items() if spec.capability and supports(spec.capability, "fp8", TE.name, recipe)
            and not refusal(spec.capability, recipe, head_dim)]
    if gpus:
        out.append(f"run on a GPU that has one ({', '.join(gpus)})" if run else f"launch.gpu = {' or '.join(repr(g) for g in gpus)}")
    return out


def run_fix(plan: Plan, capability: tuple[int, int] | None) -> str:
    """The fix of rule TE-FP8-DPA-BACKEND, naming only what would give this run a backend."""
    return ", or ".join(_fixes(plan, [capability], run=True)) if run_refusal(plan, capability) else FIX


def plan_fix(plan: Plan) -> str:
    """The fix of rule TE-FP8-DPA-GPU, naming only what would give the plan's GPU(s) a backend."""
    if not plan_refusal(plan):
        return FIX
    return ", or ".join(_fixes(plan, [PLAN_GPUS[g].capability for g in _plan_gpus(plan)], run=False))
