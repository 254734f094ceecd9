"""The Transformer Engine recipe for a plan: which class, with which keyword arguments. Pure:
no TE import, so it is tested everywhere; te.py builds the object on a GPU machine.

The constructor fields below are read from Transformer Engine 2.20.2,
transformer_engine/common/recipe/__init__.py (the annotated dataclass fields of each class).
Only these names may be passed; the test checks every mapping against them.
"""

from __future__ import annotations

import typing

from launcher.planning.rules import rule_error

if typing.TYPE_CHECKING:
    from launcher.planning.plan import TEConfig

RECIPE_CLASS = {
    "delayed": "DelayedScaling",
    "current": "Float8CurrentScaling",
    "block": "Float8BlockScaling",
    "mxfp8": "MXFP8BlockScaling",
    "nvfp4": "NVFP4BlockScaling",
}

READS: dict[str, tuple[str, ...]] = {
    "delayed": ("fp8_format", "margin", "amax_history_len", "amax_compute_algo", "reduce_amax", "fp8_dpa", "fp8_mha"),
    "current": ("fp8_format", "fp8_dpa", "fp8_mha"),
    # TE asserts fp8_dpa and fp8_mha are False for Float8BlockScaling ("FP8 attention is not supported")
    "block": ("fp8_format",),
    "mxfp8": ("fp8_format", "margin", "fp8_dpa", "fp8_mha"),
    # NVFP4 asserts fp8_format == E4M3 (the format of its block scales): the spec's format is not passed
    "nvfp4": ("fp8_dpa", "fp8_mha"),
}
"""The precision.te fields each recipe passes to its TE class (same names on both sides)."""

SPEC_FIELDS = ("fp8_format", "margin", "amax_history_len", "amax_compute_algo", "reduce_amax", "fp8_dpa", "fp8_mha")
"""The precision.te fields that configure the recipe (fp8_params and swap configure the model)."""


def recipe_kwargs(te: TEConfig) -> tuple[str, dict]:
    """(TE recipe class name, constructor kwargs). `fp8_format` is the Format member's name;
    te.py turns it into `Format[name]`."""
    if te.recipe == "block" and (te.fp8_dpa or te.fp8_mha):
        raise rule_error("TE-BLOCK-FP8-ATTENTION")  # planning refuses it; a hand-edited plan.json could hold it
    kwargs = {name: getattr(te, name) for name in READS[te.recipe]}
    return RECIPE_CLASS[te.recipe], kwargs


def unread_fields(te: TEConfig, defaults: dict) -> tuple[str, ...]:
    """precision.te recipe fields set to a non-default value that the chosen recipe never reads
    (`defaults`: the schema's precision.te defaults). The start line names them."""
    return tuple(f for f in SPEC_FIELDS if f not in READS[te.recipe] and getattr(te, f) != defaults.get(f))


def fused_adam_args(plan) -> dict:
    """Keyword arguments of transformer_engine.pytorch.optimizers.FusedAdam(params, **args) for precision.te.fp8_params
    (read from TE 2.20.2, optimizers/fused_adam.py): train.optimizer's Adam mode, lr, betas, eps and weight decay, and an
    fp32 master copy (master_weights), which it steps and re-quantizes the FP8 weights from (te.py gives the fp32
    parameters, which it steps in place, none)."""
    import torch

    t = plan.train
    if t.optimizer not in ("adam", "adamw"):
        raise rule_error("TE-FP8-PARAMS-OPTIMIZER")  # planning refuses it; a hand-edited plan.json could hold it
    return {"lr": t.lr, "betas": tuple(t.adam_betas), "eps": t.adam_eps, "weight_decay": t.weight_decay,
            "adam_w_mode": t.optimizer == "adamw", "master_weights": True, "master_weight_dtype": torch.float32}
