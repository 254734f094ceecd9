"""torchao low-precision training of the chosen nn.Linear layers.

tensorwise, rowwise, rowwise_with_gw_hp: swapped for torchao's Float8Linear. They run for real on CPU
too (torch._scaled_mm has a CPU kernel), forward and backward, with torch 2.13.
mxfp8: torchao's MXFP8 training (`quantize_` with MXFP8TrainingOpConfig wraps each weight in
MXFP8TrainingWeightWrapperTensor, whose linear casts to e4m3 with a power-of-two scale per 32 values);
on CPU its emulated kernels run (real numerics, not speed).
nvfp4: torchao's NVFP4 training (`quantize_` with NVFP4TrainingConfig swaps in NVFP4Linear; Triton, CUDA only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections import Counter

import torch
from torch import nn

from launcher.errors import BackendMissing
from launcher.planning.hardware import BLOCK_RECIPES
from launcher.planning.install import INSTALL
from launcher.planning.read import recipes

from . import select
from .amp import Precision, amp_settings
from .report import count
from .torchao_moe import convert_experts, grouped_label, grouped_recipe_of

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


class Float8API(typing.NamedTuple):
    """The torchao.float8 names fp8launch calls."""

    Float8LinearConfig: type
    convert_to_float8_training: typing.Callable
    precompute_float8_dynamic_scale_for_fsdp: typing.Callable
    Float8Linear: type


def _torchao() -> Float8API:
    """torchao.float8's API, imported (BackendMissing where torchao is not installed)."""
    try:
        import torchao  # noqa: F401  (the package itself first: a stale torchao.float8 in sys.modules proves nothing)
        from torchao.float8 import (
            Float8LinearConfig,
            convert_to_float8_training,
            precompute_float8_dynamic_scale_for_fsdp,
        )
        from torchao.float8.float8_linear import Float8Linear
    except ImportError as e:
        raise BackendMissing("torchao", INSTALL["torchao"]) from e
    return Float8API(Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp, Float8Linear)


def float8_config_kwargs(plan: Plan, recipe: str | None = None) -> dict:
    """The fields fp8launch sets on top of Float8LinearConfig.from_recipe_name(recipe) (default: the plan's)."""
    t = plan.precision.torchao
    recipe = recipe or t.recipe
    return {
        # float8 all-gather is an FSDP2 feature for tensorwise scaling; rules FP8-ALLGATHER-* stop other plans,
        # and a [[precision.rules]] recipe other than tensorwise all-gathers its layers in high precision
        "enable_fsdp_float8_all_gather": bool(t.fsdp_float8_all_gather and plan.distributed.strategy == "fsdp2" and recipe == "tensorwise"),
        "pad_inner_dim": bool(t.pad_inner_dim),
    }


def float8_config(plan: Plan, recipe: str | None = None):
    """torchao's Float8LinearConfig for `recipe` (default: the plan's)."""
    Float8LinearConfig = _torchao().Float8LinearConfig
    base = Float8LinearConfig.from_recipe_name(recipe or plan.precision.torchao.recipe)
    return dataclasses.replace(base, **float8_config_kwargs(plan, recipe))


def _follow_cpu_autocast(module: nn.Module, args: tuple) -> tuple | None:
    # Float8Linear casts its input to the autocast dtype only under CUDA autocast ("For now,
    # hardcode to GPU's autocast dtype", torchao/float8/float8_linear.py). Do the same under CPU
    # autocast, so a CPU run has the dtypes of a GPU run (rowwise_with_gw_hp's high-precision
    # weight-gradient GEMM fails on mixed fp32/bf16 operands otherwise).
    if torch.is_autocast_enabled("cpu") and args and isinstance(args[0], torch.Tensor):
        return (args[0].to(torch.get_autocast_dtype("cpu")),) + args[1:]
    return None


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class TorchaoPrecision(Precision):
    precompute_scale: bool
    """precompute_float8_dynamic_scale_for_fsdp after each step (only with float8 all-gather)."""

    def after_optimizer_step(self, model: nn.Module) -> None:
        """One all-reduce computes every float8 weight's scale for the next FSDP2 all-gather."""
        if self.fsdp_float8_all_gather and self.precompute_scale:
            with torch.profiler.record_function("fp8launch.fp8_scales"):  # the profile's fp8_cast part
                _torchao().precompute_float8_dynamic_scale_for_fsdp(model)

    def fp8_label(self, module: nn.Module) -> str | None:
        grouped = grouped_label(module)
        if grouped:
            return grouped
        if isinstance(module, _torchao().Float8Linear):
            return f"fp8 {recipe_of(module.config)}"
        block = block_recipe_of(module)
        return f"fp8 {block}" if block else None

    def monitor_targets(self, model: nn.Module) -> list:
        """Every Float8Linear and MXFP8 Linear, with its casts' scaling (launcher/train/monitor)."""
        return torchao_targets(model)


def recipe_of(config) -> str:
    """The torchao recipe a Float8Linear's config is, read from its casts (the FSDP2 all-gather and
    padding settings aside); "custom" when it is none of them."""
    Float8LinearConfig = _torchao().Float8LinearConfig
    for name in (r for r in recipes("torchao") if r not in BLOCK_RECIPES):
        base = Float8LinearConfig.from_recipe_name(name)
        if dataclasses.replace(config, enable_fsdp_float8_all_gather=base.enable_fsdp_float8_all_gather,
                               pad_inner_dim=base.pad_inner_dim) == base:
            return name
    return "custom"


def mx_torch_supported() -> bool:
    """What torchao 0.18's MXFP8 training asserts of torch before it wraps a weight
    (torchao/prototype/moe_training/conversion_utils.py, `_get_tensor_cls_for_config`)."""
    from torch.distributed.tensor import _dispatch, _ops

    return hasattr(_ops, "scaled_mm_single_dim_strategy") and hasattr(_dispatch, "is_pinned_handler")


def block_recipe_of(module: nn.Module) -> str | None:
    """mxfp8 / nvfp4 when torchao's block-scaled training holds this Linear (read from the module as built,
    under FSDP2 too), else None."""
    if not isinstance(module, nn.Linear):
        return None
    if type(module).__name__ == "NVFP4Linear":
        return "nvfp4"
    weight = module.weight
    weight = getattr(weight, "_local_tensor", weight)  # FSDP2 / TP: a DTensor whose local shard is the wrapper
    return "mxfp8" if type(weight).__name__ == "MXFP8TrainingWeightWrapperTensor" else None


def _block_config(recipe: str, plan: Plan, device: torch.device):
    try:
        import torchao  # noqa: F401
        from torchao.quantization import quantize_
    except ImportError as e:
        raise BackendMissing("torchao", INSTALL["torchao"]) from e
    if recipe == "mxfp8":
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

        from .checks import raise_run_errors

        raise_run_errors(plan, device, torchao_mx_supported=mx_torch_supported())
        emulated = device.type != "cuda"  # torchao's hardware-agnostic kernels; its cuBLAS/CUTLASS path needs sm100
        return quantize_, MXFP8TrainingOpConfig.from_recipe(
            MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL if emulated else MXFP8TrainingRecipe.MXFP8_RCEIL)
    from torchao.prototype.moe_training.nvfp4_training.nvfp4_training import NVFP4TrainingConfig

    return quantize_, NVFP4TrainingConfig()


def _emulated_mx_input(module: nn.Module, args: tuple) -> tuple | None:
    # torchao's emulated MX linear dequantizes each operand back to its own dtype before the matmul, so a
    # bf16 activation (CPU autocast) against an fp32 weight (DDP keeps fp32 weights) fails with "expected
    # m1 and m2 to have the same dtype"; the CUDA kernels take both as e4m3 and never meet the mismatch.
    # Give the input the weight's dtype: e4m3 values and power-of-two scales are exact in either dtype.
    weight = module.weight
    dtype = getattr(weight, "_local_tensor", weight).dtype
    if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() and args[0].dtype != dtype:
        return (args[0].to(dtype),) + args[1:]
    return None


def skips_triton_codegen_patch(device: torch.device) -> bool:
    """Whether a conversion for `device` leaves torchao's Triton-only Inductor patch out: off CUDA, where torchao keeps
    its `_PATCHED` flag. The patch (torchao/float8/_inductor_patch.py, applied by every convert_to_float8_training call)
    rewrites how Inductor's Triton code generator emits min/max, against a Triton fp8-store miscompile; importing that
    generator (torch._inductor.codegen.triton and what it pulls in) is 15-20% of a CPU rank's start, and a CPU graph is
    C++. On CUDA, or where torchao no longer keeps the flag, the patch runs as torchao means it to."""
    if device.type == "cuda":
        return False
    from torchao.float8 import _inductor_patch

    return isinstance(getattr(_inductor_patch, "_PATCHED", None), bool)


@contextlib.contextmanager
def triton_codegen_patch_skipped(device: torch.device):
    """Around a conversion for `device`: where skips_triton_codegen_patch, torchao's patch marked applied (so that
    convert_to_float8_training returns before importing it), then its flag set back as it was. The flag is the
    process's: left set, it would keep the patch from a later CUDA conversion in the same process. Yields whether the
    patch was left out."""
    if not skips_triton_codegen_patch(device):
        yield False
        return
    from torchao.float8 import _inductor_patch

    before = _inductor_patch._PATCHED
    _inductor_patch._PATCHED = True
    try:
        yield True
    finally:
        _inductor_patch._PATCHED = before


def apply_torchao(model: nn.Module, plan: Plan, device: torch.device) -> TorchaoPrecision:
    """Convert each chosen Linear with its recipe: the plan's, or a `[[precision.rules]]` entry's (one
    conversion per recipe, each over its own layers)."""
    choices = select.choices(model, plan)
    reasons = {fqn: why for fqn, (_, why) in choices.items()}
    chosen = Counter(recipe for recipe, _ in choices.values() if recipe is not None)  # in the order layers first use them
    main = plan.precision.torchao.recipe
    all_gather = False
    for recipe in chosen:

        def only(module: nn.Module, fqn: str, recipe=recipe) -> bool:
            return choices.get(fqn, (None,))[0] == recipe

        if recipe in BLOCK_RECIPES:
            quantize_, config = _block_config(recipe, plan, device)
            quantize_(model, config, filter_fn=only)
        else:
            convert = _torchao().convert_to_float8_training
            config = float8_config(plan, recipe)
            all_gather = all_gather or config.enable_fsdp_float8_all_gather
            with triton_codegen_patch_skipped(device):
                convert(model, config=config, module_filter_fn=only)
    reasons.update(convert_experts(model, plan, lambda: _block_config("mxfp8", plan, device)[1]))  # the MoE expert modules: grouped GEMMs
    if device.type == "cpu":  # (Float8Linear's autocast follows CUDA's only; emulated MX needs one operand dtype)
        for m in model.modules():
            if isinstance(m, _torchao().Float8Linear):
                m.register_forward_pre_hook(_follow_cpu_autocast)
            elif block_recipe_of(m) == "mxfp8":
                m.register_forward_pre_hook(_emulated_mx_input)
    others = {r: n for r, n in chosen.items() if r != main}
    note = ", ".join([name for name, on in (("float8 all-gather", all_gather),
                                            ("pad_inner_dim", plan.precision.torchao.pad_inner_dim and main not in BLOCK_RECIPES)) if on]
                     + [f"{n} in {r} by precision.rules" for r, n in others.items()])
    report = count(
        model, backend="torchao", recipe=main, mode="fp8", high_precision=plan.precision.high_precision,
        is_fp8=lambda m: isinstance(m, _torchao().Float8Linear) or block_recipe_of(m) is not None or grouped_recipe_of(m) is not None,
        reasons=reasons, note=note,
    )
    s = amp_settings(plan, device)
    return TorchaoPrecision(
        report=report, device_type=device.type, autocast_dtype=s["autocast_dtype"], param_dtype=s["param_dtype"],
        grad_scaler=s["grad_scaler"], fsdp_float8_all_gather=all_gather,
        precompute_scale=plan.precision.torchao.precompute_scale,
    )


# --- what the FP8 monitor hooks (launcher/train/monitor) ----------------------------------------------

MXFP8_CASTS = dict(fmt="e4m3", rowwise=True, block=32, power_of_2=True)
"""torchao's MXFP8 training cast (RCEIL): one power-of-two scale per 32 values along the last dim, the largest
that keeps the block's amax within e4m3's range (the monitor's power_of_2 rounds fp8_max / amax down)."""


def torchao_targets(model: nn.Module) -> list:
    """Every torchao Float8Linear, with its config's casts for the forward GEMM and grad_output, and every
    Linear torchao's MXFP8 training holds (its three operands cast in 1 x 32 blocks)."""
    from torchao.float8.config import ScalingGranularity, ScalingType
    from torchao.float8.float8_linear import Float8Linear

    from launcher.train.fqn import clean_fqn
    from launcher.train.monitor.hooks import OPERANDS, Target
    from launcher.train.monitor.stats import Scaling, format_name

    targets = []
    for fqn, m in model.named_modules():
        if block_recipe_of(m) == "mxfp8":
            targets.append(Target(layer=clean_fqn(fqn), module=m, operands={op: Scaling(**MXFP8_CASTS) for op in OPERANDS}))
            continue
        if not isinstance(m, Float8Linear):
            continue
        c = m.config
        ops = {}
        for name, cc in zip(OPERANDS, (c.cast_config_input, c.cast_config_weight, c.cast_config_grad_output)):
            if cc.scaling_type is ScalingType.DISABLED:
                continue
            ops[name] = Scaling(fmt=format_name(cc.target_dtype), rowwise=cc.scaling_granularity is ScalingGranularity.AXISWISE,
                                power_of_2=bool(c.round_scales_to_power_of_2))
        targets.append(Target(layer=clean_fqn(fqn), module=m, operands=ops))
    return targets
