"""The FP8 backends, one record each (torch-free), in the manner of torchtitan's converter registry: what the spec
calls it, the package it imports, its recipes and the key that picks one, the GPUs each recipe needs, the rules that
are its own, and the facts about what it does to a model that the rest of fp8launch asks about. Code elsewhere asks
the record ("does this backend save FP8 activations? which recipe does the plan pick?") instead of comparing the
backend's name, and a new backend is one new record.

    b = backend_of(plan.precision)        # None for a run without FP8
    b.recipe(plan.precision)              # "tensorwise", "current", "O2"
    b.needs_capability(recipe)            # ((10, 0), None): lowest compute capability, first refused again
"""

from __future__ import annotations

from dataclasses import dataclass, field

frozen = dataclass(frozen=True, kw_only=True, slots=True, eq=False)
"""eq=False: a record is its own identity, so the records key tables (a dict field would make them unhashable)."""

FP8_MIN_CAPABILITY = (8, 9)
"""FP8 GEMMs need Ada (sm89), Hopper (sm90) or Blackwell (sm100+)."""


@frozen
class Backend:
    name: str
    """precision.backend: torchao | te | msamp."""
    package: str
    """The module it imports (launcher/planning/install.py says how to install it)."""
    section: str
    """Its table in the spec (precision.<section>) and its field on PrecisionConfig."""
    recipe_field: str
    """The field of that table that picks the recipe (MS-AMP: its opt level)."""
    default_recipe: str
    """The recipe doctor and init try first (the row that speaks for the backend)."""
    apply: str
    """`module:function` that converts a model for it (launcher/train/precision), imported only when chosen."""
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
    """The FP8 monitor hooks its layers' casts (launcher/train/monitor/hooks.py); MS-AMP's are its own."""
    rule_prefix: str = ""
    """The rule ids that are its own start with this."""
    hardware_rule: str = "FP8-HARDWARE"
    """The rule that refuses a recipe of it on a GPU below its capability (needs_capability)."""

    @property
    def recipe_key(self) -> str:
        return f"precision.{self.section}.{self.recipe_field}"

    def recipe(self, precision) -> str:
        """The recipe a PrecisionConfig picks for this backend."""
        return getattr(getattr(precision, self.section), self.recipe_field)

    @property
    def has_recipes(self) -> bool:
        """Its choice is a scaling recipe (torchao, TE) rather than an opt level (MS-AMP)."""
        return self.recipe_field == "recipe"

    def setting(self, precision, name: str, default=False):
        """A key of its own table (precision.<section>.<name>) as the plan has it; `default` where its table has none,
        so that "does this backend all-gather in float8 / keep FP8 weights / skip small layers" is asked of any one."""
        return getattr(getattr(precision, self.section), name, default)

    def with_recipe(self, precision, recipe: str):
        """The PrecisionConfig with this backend's recipe replaced."""
        import dataclasses

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


TORCHAO = Backend(
    name="torchao", package="torchao", section="torchao", recipe_field="recipe", default_recipe="tensorwise",
    apply="launcher.train.precision.torchao_fp8:apply_torchao",
    # its MX kernels and NVFP4 Triton kernels check is_sm_at_least_100 (torchao/prototype/mx_formats/kernels.py,
    # moe_training/nvfp4_training/quantize_2d_triton.py, 0.18.0)
    capability={"mxfp8": ((10, 0), None), "nvfp4": ((10, 0), None)},
    mixes_recipes=True, grouped_experts=True, shape_rules=True, schedules=True, gemm_efficiency=True,
    float8_tp_recipes=("tensorwise",), accelerate_recipes=("tensorwise",),
    monitored=True, rule_prefix="TORCHAO-", hardware_rule="TORCHAO-BLOCK-HARDWARE",
)
TE = Backend(
    name="te", package="transformer_engine", section="te", recipe_field="recipe", default_recipe="current",
    apply="launcher.train.precision.te:apply_te",
    # block scaling needs Hopper, MXFP8 / NVFP4 Blackwell; TE 2.20 refuses MXFP8 on sm120 (consumer Blackwell)
    capability={"block": ((9, 0), None), "mxfp8": ((10, 0), (12, 0)), "nvfp4": ((10, 0), None)},
    cuda_only=True, replaces_modules=True, saves_fp8_inputs=True, fused_casts=True, gemm_efficiency=True,
    accelerate_recipes=("delayed", "mxfp8"), monitored=True, rule_prefix="TE-", hardware_rule="TE-RECIPE-HARDWARE",
)
MSAMP = Backend(
    name="msamp", package="msamp", section="msamp", recipe_field="opt_level", default_recipe="O2",
    apply="launcher.train.precision.msamp:apply_msamp",
    cuda_only=True, replaces_modules=True, saves_fp8_inputs=True, scaling_tensors=True, fused_casts=True, costed_as="delayed",
    rule_prefix="MSAMP-",
)

BACKENDS: dict[str, Backend] = {b.name: b for b in (TORCHAO, TE, MSAMP)}
"""precision.backend -> its record, in the schema's order (a test holds the two to each other)."""


def backend_of(precision) -> Backend | None:
    """The record of a PrecisionConfig's backend; None when the precision is not FP8."""
    return BACKENDS[precision.backend] if precision.mode == "fp8" else None


def named(name: str | None) -> Backend | None:
    """The record of a backend named in a run's report ("" or None: no FP8 backend)."""
    return BACKENDS.get(name or "")
