"""MS-AMP's optimizers held to their real signature, as the Transformer Engine stand-in holds TE's: the stand-in of
tests/train/test_precision_msamp.py records any keyword; here its optimizers accept only the keywords MS-AMP's
LBAdamW / LBAdam take (read from Azure/MS-AMP, msamp/optim/adamw.py and adam.py), so a keyword fp8launch passes
that MS-AMP does not take fails here, not on a GPU. MS-AMP's use_te path goes through the TE stand-in.
tests/gpu/test_msamp_gpu.py checks the record against the installed MS-AMP."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from launcher.train.precision import msamp as msamp_backend

from ._precision import TinyLlama, make_plan
from .test_precision_msamp import ScalingParameter, fake_msamp

pytestmark = pytest.mark.usefixtures("msamp_stack")
"""The MS-AMP package's own path, as planned where its stack is installed (elsewhere a backend = "msamp" spec
is planned as its native levels: tests/train/test_msamp_native.py)."""

MSAMP_OPTIMIZER_ARGS: dict[str, frozenset[str]] = {
    # LBAdamW.__init__(self, params, lr, bias_correction, betas, eps, weight_decay, amsgrad, *, maximize, exp_avg_dtype,
    #                  exp_avg_sq_dtype, tensor_scale)
    "LBAdamW": frozenset({"lr", "bias_correction", "betas", "eps", "weight_decay", "amsgrad", "maximize", "exp_avg_dtype",
                          "exp_avg_sq_dtype", "tensor_scale"}),
    # LBAdam.__init__(self, params, lr, betas, eps, weight_decay, amsgrad, maximize, *args, **kwargs): the rest to LBAdamW
    "LBAdam": frozenset({"lr", "bias_correction", "betas", "eps", "weight_decay", "amsgrad", "maximize", "exp_avg_dtype",
                         "exp_avg_sq_dtype", "tensor_scale"}),
}
"""Keyword names of MS-AMP 0.4's optimizers (params positional)."""

STATE_DTYPES = {torch.float32, torch.float16, torch.uint8}


def strict_optimizers(calls: list):
    """msamp.optim with LBAdamW / LBAdam that refuse keywords MS-AMP's do not take (TypeError, as Python would)."""

    def optimizer(name):
        def build(params, **kwargs):
            unknown = set(kwargs) - MSAMP_OPTIMIZER_ARGS[name]
            if unknown:
                raise TypeError(f"{name}.__init__() got unexpected keyword arguments {sorted(unknown)}")
            assert {kwargs.get("exp_avg_dtype", torch.uint8), kwargs.get("exp_avg_sq_dtype", torch.float16)} <= STATE_DTYPES
            calls.append((name, kwargs))
            return torch.optim.SGD(params, lr=kwargs["lr"])
        build.__signature__ = inspect.Signature([inspect.Parameter("params", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
            inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in sorted(MSAMP_OPTIMIZER_ARGS[name])])
        return build

    return types.SimpleNamespace(LBAdamW=optimizer("LBAdamW"), LBAdam=optimizer("LBAdam"))


@pytest.mark.parametrize("optimizer,level", [("adamw", "O2"), ("adam", "O1")])
def test_wrap_optimizer_passes_only_what_msamps_optimizer_takes(optimizer, level):
    ms = fake_msamp()
    calls: list = []
    ms.optim = strict_optimizers(calls)
    plan = make_plan(precision={"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": level}},
                     distributed={"strategy": "ddp", "procs_per_node": 1}, train={"optimizer": optimizer})
    model = TinyLlama()
    prec = msamp_backend.apply_msamp(model, plan, torch.device("cpu"), msamp=ms, scaling_parameter=ScalingParameter)
    prec.wrap_optimizer(model, torch.optim.AdamW(model.parameters()))
    (name, kwargs), = calls
    assert name == ("LBAdamW" if optimizer == "adamw" else "LBAdam") and "decoupled_weight_decay" not in kwargs


def test_the_strict_stand_in_refuses_a_keyword_msamp_does_not_take():
    optim = strict_optimizers([])
    with pytest.raises(TypeError, match="foreach"):
        optim.LBAdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3, foreach=True)
