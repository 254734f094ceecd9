"""The FP8 backends, one record each (torch-free), in the manner of torchtitan's converter registry: what the spec
calls it, the package it imports, its recipes and the key that picks one, the GPUs each recipe needs, and the facts
about what it does to a model that the rest of fp8launch asks about. Code elsewhere asks the record ("does this
backend save FP8 activations? which recipe does the plan pick? what does its GEMM row say?") instead of comparing the
backend's name or identity (tests/test_backends.py fails on either outside this module and the rules), and what only
the training side needs lives in the backend's own module (`apply`) and on the Precision object it returns
(its DeepSpeed entry, its monitor targets).

    b = backend_of(plan.precision)        # None for a run without FP8
    b.recipe(plan.precision)              # "tensorwise", "current", "O2"
    b.needs_capability(recipe)            # ((10, 0), None): lowest compute capability, first refused again

A fourth backend is one new record plus its module (`apply`, imported only when a plan picks it):

    register(Backend(name="mine", package="mine", apply="mine.fp8:apply_mine", default_recipe="default"))

`register` adds the record to BACKENDS, and the spec's schema takes its enum of precision.backend from BACKENDS
(launcher/planning/read.py `schema`), so the new name validates, plans and trains without an edit to schema.json or to
any other file (tests/test_toy_backend.py plans and trains one on CPU). A registered backend has no table of its own
in the spec (section ""): it runs its `default_recipe`, and the rules that name a built-in backend pass it by. A table
of its own (precision.<section>) is a schema and PrecisionConfig field: the built-in backends' tables are the spec's
contract (docs/spec-reference.md). Registration is per process: call it before planning, in the process that plans
and in each training process (the toy's test does both in one process).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

frozen = dataclass(frozen=True, kw_only=True, slots=True, eq=False)
"""eq=False: a record is its own identity, so the records key tables (a dict field would make them unhashable)."""

FP8_MIN_CAPABILITY = (8, 9)
"""FP8 GEMMs need Ada (sm89), Hopper (sm90) or Blackwell (sm100+)."""

FP8_FORMATS = {"HYBRID": "e4m3 fwd / e5m2 grads", "E4M3": "e4m3"}
"""A backend's fp8_format setting (TE's; HYBRID where its table has none) as the precision table names it."""


def _no_keys(recipe: str) -> dict[str, Any]:
    return {}


@frozen
class Backend:
    name: str
    """precision.backend: torchao | te | msamp, or a registered one."""
    package: str
    """The module it imports (launcher/planning/install.py says how to install it)."""
    apply: str
    """`module:function` that converts a model for it (launcher/train/precision), imported only when chosen."""
    default_recipe: str
    """The recipe doctor and init try first (the row that speaks for the backend); a registered backend's only one."""
    section: str = ""
    """Its table in the spec (precision.<section>) and its field on PrecisionConfig; "" for a registered backend."""
    recipe_field: str = ""
    """The field of that table that picks the recipe (MS-AMP: its opt level)."""
    capability: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = field(default_factory=dict)
    """Recipes that need more than FP8 itself: recipe -> (lowest compute capability, first one refused again or None)."""
    cuda_only: bool = False
    """Only a CUDA build runs it (rule CPU-BACKEND); torchao runs FP8 on a CPU through torch's reference kernels."""
    replaces_modules: bool = False
    """It builds its own modules from the model's weights: the model needs its storage before it converts it."""
    saves_fp8_inputs: bool = False
    """Its FP8 layers save their GEMM inputs for backward in FP8 (1 byte an element) rather than in high precision."""
    mixes_recipes: bool = False
    """Each Linear may run its own recipe ([[precision.rules]] recipe)."""
    grouped_experts: bool = False
    """It converts 3D grouped-expert weights (MoE) into low-precision grouped GEMMs."""
    shape_rules: bool = False
    """Its Linears follow torchao's shape rules (block sizes, skip_small's size filter, pad_inner_dim); TE and MS-AMP
    convert every Linear whose dimensions are multiples of 16."""
    schedules: bool = False
    """A [[precision.schedule]] may switch it on, off or to another recipe during a run (rule SCHEDULE-SUPPORT)."""
    scaling_tensors: bool = False
    """It keeps weights and gradients as its own FP8 ScalingTensors, with its own optimizer, master weights, gradient
    all-reduce and clipping, one dtype for every weight (MS-AMP)."""
    deepspeed_section: bool = False
    """deepspeed.json carries its table as a section of its own ({"enabled": true, ...its keys}) for its DeepSpeed
    integration, which builds its FP8 Adam from deepspeed.json's "optimizer" section (MS-AMP's msamp.deepspeed)."""
    max_zero_stage: int = 3
    """The highest DeepSpeed ZeRO stage its DeepSpeed integration takes (MS-AMP asserts 1 or 2: rule MSAMP-ZERO3)."""
    fused_casts: bool = False
    """Amax, scale, cast and transpose run in its own fused kernels (compile changes nothing; the prediction's cost)."""
    costed_as: str = ""
    """The recipe whose kernels the prediction costs its casts by, where its own recipe names none (MS-AMP's opt level)."""
    gemm_efficiency: bool = False
    """The prediction applies the measured scaled-GEMM efficiency of its recipe (1.0 otherwise: not modelled)."""
    float8_tp_recipes: tuple[str, ...] = ()
    """Recipes whose tensor-parallel all-gathers run in FP8 (torchao's Float8 TP styles)."""
    accelerate_recipes: tuple[str, ...] | None = None
    """The recipes Accelerate's fp8 config can express (accelerate.yaml); None: every one."""
    monitored: bool = False
    """The FP8 monitor hooks its layers' casts (its Precision's monitor_targets); MS-AMP's casts are its own."""
    gemms: dict[str, str] = field(default_factory=dict)
    """recipe ("*": any other) -> its GEMMs as the precision table names them ({hp}: the high precision, {fmt}: the
    FP8 formats of its fp8_format setting)."""
    overflow_hints: dict[str, str] = field(default_factory=dict)
    """recipe ("*": any other) -> what usually overflows with it when the loss goes non-finite, and what to try
    ({recipe}: the recipe); the divergence message appends the learning-rate causes."""
    outlier_fix: dict[str, str] = field(default_factory=dict)
    """recipe -> the setting that copes better with one layer's outliers (the FP8 monitor's warnings)."""
    recipe_notes: dict[str, str] = field(default_factory=dict)
    """recipe -> the comment `fp8launch init` writes beside it."""
    native_as: str = ""
    """The backend a spec naming it is planned on where its own stack is not installed, with its recipe's native keys
    (MS-AMP's opt levels on torchao: launcher/planning/levels.py)."""
    deepspeed_recipe: str = ""
    """The recipe `fp8launch init` writes for a DeepSpeed run where it is not default_recipe (MS-AMP's O3)."""
    sample_spec: Callable[[str], dict[str, Any]] = _no_keys
    """recipe -> dotted spec keys beside the recipe that make a plan of it a good one (no plan-stage error of its own):
    the plan `fp8launch doctor` asks the machine about."""

    @property
    def recipe_key(self) -> str:
        """The spec key that picks its recipe; "" for a backend without a table."""
        return f"precision.{self.section}.{self.recipe_field}" if self.section else ""

    def recipe(self, precision) -> str:
        """The recipe a PrecisionConfig picks for this backend."""
        if not self.section:
            return self.default_recipe
        return getattr(getattr(precision, self.section), self.recipe_field)

    @property
    def has_recipes(self) -> bool:
        """Its choice is a scaling recipe (torchao, TE) rather than an opt level (MS-AMP)."""
        return self.recipe_field == "recipe"

    def setting(self, precision, name: str, default=False):
        """A key of its own table (precision.<section>.<name>) as the plan has it; `default` where its table has none,
        so that "does this backend all-gather in float8 / keep FP8 weights / skip small layers" is asked of any one."""
        if not self.section:
            return default
        return getattr(getattr(precision, self.section), name, default)

    def with_recipe(self, precision, recipe: str):
        """The PrecisionConfig with this backend's recipe replaced (unchanged for a backend of one recipe)."""
        if not self.section:
            return precision
        section = dataclasses.replace(getattr(precision, self.section), **{self.recipe_field: recipe})
        return dataclasses.replace(precision, **{self.section: section})

    def float8_tp(self, precision) -> bool:
        """Its tensor-parallel all-gathers run in FP8 for the recipe `precision` picks (torchao's Float8 TP styles)."""
        return self.recipe(precision) in self.float8_tp_recipes

    def float8_all_gather(self, precision, strategy: str) -> bool:
        """FSDP2 all-gathers the weights of its FP8 layers in float8 (torchao's fsdp_float8_all_gather)."""
        return strategy == "fsdp2" and bool(self.setting(precision, "fsdp_float8_all_gather"))

    def needs_capability(self, recipe: str | None) -> tuple[tuple[int, int], tuple[int, int] | None]:
        low, high = self.capability.get(recipe, ((0, 0), None))
        return max(FP8_MIN_CAPABILITY, low), high

    def gemm_text(self, precision) -> str:
        """Its GEMMs for the recipe `precision` picks, as the precision table names them."""
        text = self.gemms.get(self.recipe(precision), self.gemms.get("*", "fp8"))
        return text.format(hp=precision.compute_dtype, fmt=FP8_FORMATS[self.setting(precision, "fp8_format", "HYBRID")])

    def overflow_hint(self, recipe: str) -> str:
        """What usually overflows with `recipe` ("" where the record says nothing)."""
        return self.overflow_hints.get(recipe, self.overflow_hints.get("*", "")).format(recipe=recipe)

    def starter_recipe(self, strategy: str) -> str:
        """The recipe `fp8launch init` writes for `strategy`."""
        return self.deepspeed_recipe if strategy == "deepspeed" and self.deepspeed_recipe else self.default_recipe


TORCHAO = Backend(
    name="torchao", package="torchao", section="torchao", recipe_field="recipe", default_recipe="tensorwise",
    apply="launcher.train.precision.torchao_fp8:apply_torchao",
    # its MX kernels and NVFP4 Triton kernels check is_sm_at_least_100 (torchao/prototype/mx_formats/kernels.py,
    # moe_training/nvfp4_training/quantize_2d_triton.py, 0.18.0)
    capability={"mxfp8": ((10, 0), None), "nvfp4": ((10, 0), None)},
    mixes_recipes=True, grouped_experts=True, shape_rules=True, schedules=True, gemm_efficiency=True,
    float8_tp_recipes=("tensorwise",), accelerate_recipes=("tensorwise",), monitored=True,
    gemms={
        "tensorwise": "fp8: e4m3 inputs/weights, e5m2 output grads, per-tensor scales",
        "rowwise": "fp8: e4m3 everywhere, per-row scales (power of 2)",
        "rowwise_with_gw_hp": "fp8: e4m3 per-row scales; weight-grad GEMM in {hp}",
        "mxfp8": "mxfp8: e4m3, 1x32 e8m0 (power-of-two) block scales, all three GEMMs",
        "nvfp4": "nvfp4: e2m1, 1x16 e4m3 block scales, random Hadamard transform on the weight-grad GEMM",
    },
    overflow_hints={
        "tensorwise": "an overflow in FP8 e4m3 with tensorwise scaling, where one outlier sets the scale of a whole tensor: "
                      'try precision.torchao.recipe = "rowwise", or keep the offending layers in precision.keep',
        "*": "FP8 e4m3 range exceeded in a {recipe}-scaled GEMM (keep the offending layers in precision.keep)",
    },
    outlier_fix={"tensorwise": 'precision.torchao.recipe = "rowwise" (one scale per row: an outlier no longer sets the scale '
                               "of every row)"},
    recipe_notes={"tensorwise": 'or "rowwise": more accurate, less speed-up'},
    # skip_small off: the default debug model's Linears are all below torchao's size rule (FP8-NONE-SELECTED), and
    # whether this precision runs here does not depend on which layers a model converts
    sample_spec=lambda recipe: {"precision.torchao.skip_small": False, "compile.enabled": True},
)
TE = Backend(
    name="te", package="transformer_engine", section="te", recipe_field="recipe", default_recipe="current",
    apply="launcher.train.precision.te:apply_te",
    # block scaling needs Hopper, MXFP8 / NVFP4 Blackwell; TE 2.20 refuses MXFP8 on sm120 (consumer Blackwell)
    capability={"block": ((9, 0), None), "mxfp8": ((10, 0), (12, 0)), "nvfp4": ((10, 0), None)},
    cuda_only=True, replaces_modules=True, saves_fp8_inputs=True, fused_casts=True, gemm_efficiency=True,
    accelerate_recipes=("delayed", "mxfp8"), monitored=True,
    gemms={
        "delayed": "fp8 {fmt}, per-tensor scales from amax history",
        "current": "fp8 {fmt}, per-tensor current scales",
        "block": "fp8 {fmt}, 1x128/128x128 block scales",
        "mxfp8": "mxfp8 (e4m3, 1x32 e8m0 block scales)",
        "nvfp4": "nvfp4 (e2m1, 1x16 block scales)",
    },
    overflow_hints={
        # (a resumed run continues with the checkpoint's amax histories and scales: launcher/train/precision/te_state.py)
        "delayed": "Transformer Engine's delayed scaling takes each scale from the amax history of earlier steps, so a sudden "
                   "activation spike overflows e4m3 (raise precision.te.margin, shorten precision.te.amax_history_len, or use "
                   'precision.te.recipe = "current")',
        "*": "Transformer Engine's {recipe} scaling ran out of FP8 range (keep the offending layers in precision.keep)",
    },
    outlier_fix={"delayed": 'precision.te.recipe = "current" (a scale from this step\'s amax, not from the history)'},
    recipe_notes={"current": '"delayed" needs compile off; "mxfp8" needs compute capability >= 10.0'},
    sample_spec=lambda recipe: {"compile.enabled": recipe != "delayed"},  # rule TE-DELAYED-COMPILE
)
MSAMP = Backend(
    name="msamp", package="msamp", section="msamp", recipe_field="opt_level", default_recipe="O2",
    apply="launcher.train.precision.msamp:apply_msamp",
    cuda_only=True, replaces_modules=True, saves_fp8_inputs=True, scaling_tensors=True, deepspeed_section=True,
    max_zero_stage=2, fused_casts=True, costed_as="delayed",
    gemms={"*": "fp8 {fmt} (MS-AMP)"},
    overflow_hints={"*": "MS-AMP's FP8 gradients and scaled optimizer state overflowed (its loss scaling): try "
                         'precision.msamp.opt_level = "O1"'},
    recipe_notes={"O1": "FP8 weights and gradients", "O2": "FP8 weights, gradients and optimizer states",
                  "O3": "FP8 ZeRO optimizer, through DeepSpeed"},
    deepspeed_recipe="O3", native_as="torchao",
    # FSDP1/DDP only, and O3 exists only through its DeepSpeed ZeRO 1/2 integration; where MS-AMP cannot run, O1 / O2
    # under DDP are planned as their native keys, torchao's FP8 (launcher/planning/levels.py): its skip_small off too
    sample_spec=lambda recipe: ({"distributed.strategy": "deepspeed", "distributed.deepspeed.zero_stage": 2} if recipe == "O3"
                                else {"distributed.strategy": "ddp", "precision.torchao.skip_small": False}),
)

BACKENDS: dict[str, Backend] = {b.name: b for b in (TORCHAO, TE, MSAMP)}
"""precision.backend -> its record: the built-in ones in schema.json's order (a test holds the two to each other), then
the registered ones, which the schema's enum takes from here."""

BUILT_IN = tuple(BACKENDS)
"""The backends schema.json names (the spec's contract); `unregister` refuses them."""


def register(backend: Backend) -> Backend:
    """Make `backend` known to this process: precision.backend accepts its name from now on. Its `apply` module is
    imported only when a plan picks it. A name already taken is refused (ValueError)."""
    if backend.name in BACKENDS:
        raise ValueError(f"precision.backend {backend.name!r} is already registered")
    BACKENDS[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    """Forget a registered backend (a test's cleanup); the built-in ones stay."""
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is a built-in backend")
    BACKENDS.pop(name, None)


def backend_of(precision) -> Backend | None:
    """The record of a PrecisionConfig's backend; None when the precision is not FP8."""
    return BACKENDS[precision.backend] if precision.mode == "fp8" else None


def named(name: str | None) -> Backend | None:
    """The record of a backend named in a run's report ("" or None: no FP8 backend)."""
    return BACKENDS.get(name or "")
