"""MS-AMP: the pure parts (initialize arguments, DeepSpeed section, which Linears stay) and the thin
call to msamp.initialize, with a stand-in for that call only (MS-AMP needs CUDA and is built from source)."""

from __future__ import annotations

import importlib.util
import types

import pytest
import torch
from torch import nn

from launcher.errors import BackendMissing, EnvironmentProblem, LauncherError
from launcher.train.precision import apply_precision
from launcher.train.precision import msamp as msamp_backend
from launcher.train.precision.msamp import deepspeed_section, initialize_here, msamp_init_args

from ._precision import TinyLlama, make_plan

pytestmark = pytest.mark.usefixtures("msamp_stack")
"""The MS-AMP package's own path, as planned where its stack is installed (elsewhere a backend = "msamp" spec
is planned as its native levels: tests/train/test_msamp_native.py)."""

CPU = torch.device("cpu")


def msamp_plan(opt_level="O2", use_te=False, strategy="ddp", zero_stage=2, **precision):
    return make_plan(
        precision={"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": opt_level, "use_te": use_te}, **precision},
        distributed={"strategy": strategy, "procs_per_node": 1, "deepspeed": {"zero_stage": zero_stage}})


def test_initialize_arguments():
    assert msamp_init_args(msamp_plan("O1")) == {"opt_level": "O1"}
    assert msamp_init_args(msamp_plan("O2", use_te=True)) == {"opt_level": "O2", "use_te": True}
    with pytest.raises(LauncherError, match='distributed.strategy = "deepspeed"') as e:
        msamp_init_args(msamp_plan("O3"))
    assert e.value.rule == "MSAMP-O3-STRATEGY" and e.value.exit_code == 2  # the rule table's message


def test_deepspeed_section_and_who_initializes():
    assert deepspeed_section(msamp_plan("O3", strategy="deepspeed")) == {"enabled": True, "opt_level": "O3", "use_te": False}
    assert deepspeed_section(msamp_plan("O1", use_te=True, strategy="deepspeed")) == {
        "enabled": True, "opt_level": "O1", "use_te": True}
    assert initialize_here(msamp_plan("O2", strategy="ddp"))
    assert not initialize_here(msamp_plan("O2", strategy="deepspeed"))


class ScalingParameter(nn.Parameter):
    """Stands in for msamp.nn.ScalingParameter."""


class FP8Linear(nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = ScalingParameter(linear.weight.detach().clone())

    def forward(self, x):
        return nn.functional.linear(x, self.weight)


def fake_msamp(convert=True):
    """The parts of MS-AMP 0.4 that wrap_optimizer calls: msamp.nn.LinearReplacer.replace (every nn.Linear
    without use_fp32_linear becomes an FP8Linear, msamp/nn/linear.py), msamp.te.TeReplacer, and the
    optimizers msamp.optim.LBAdamW / LBAdam (recorded with their arguments), msamp.clip_grad_norm_."""
    calls = []

    def replace(module):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                if convert and not getattr(child, "use_fp32_linear", False):
                    setattr(module, name, FP8Linear(child))
            else:
                replace(child)
        return module

    def replacer(kind):
        def run(model):
            calls.append(kind)
            return replace(model)
        return types.SimpleNamespace(replace=run)

    def optimizer(name):
        def build(params, **kwargs):
            calls.append((name, kwargs))
            return torch.optim.SGD(params, lr=kwargs["lr"])
        return build

    clipped = []
    return types.SimpleNamespace(nn=types.SimpleNamespace(LinearReplacer=replacer("LinearReplacer")),
                                 te=types.SimpleNamespace(TeReplacer=replacer("TeReplacer")),
                                 optim=types.SimpleNamespace(LBAdamW=optimizer("LBAdamW"), LBAdam=optimizer("LBAdam")),
                                 calls=calls,
                                 clip_grad_norm_=lambda params, max_norm: clipped.append(max_norm) or torch.tensor(0.0),
                                 clipped=clipped)


def test_kept_linears_are_marked_and_initialize_converts_the_rest():
    ms = fake_msamp()
    model = TinyLlama()
    prec = msamp_backend.apply_msamp(model, msamp_plan("O2"), CPU, msamp=ms, scaling_parameter=ScalingParameter)
    assert model.output.use_fp32_linear is True and model.layers[0].attention.wq.use_fp32_linear is True
    assert not hasattr(model.layers[0].attention.wk, "use_fp32_linear")
    assert prec.report.fp8_layers == 13 and "planned" in prec.report.line()
    opt = torch.optim.AdamW(model.parameters())
    model2, opt2 = prec.wrap_optimizer(model, opt)
    assert ms.calls[0] == "LinearReplacer" and ms.calls[1][0] == "LBAdamW"  # AdamW -> MS-AMP's AdamW, not its Adam
    assert opt2 is not opt and {id(q) for q in opt2.param_groups[0]["params"]} == {id(q) for q in model2.parameters()}
    assert sum(isinstance(m, FP8Linear) for m in model2.modules()) == 13
    r = prec.report
    assert (r.backend, r.recipe, r.fp8_layers, r.total_linear) == ("msamp", "O2", 13, 15)
    assert r.line().startswith("precision: fp8 msamp O2, 13 of 15 Linear layers in FP8, 83.3% of GEMM FLOPs")
    assert prec.param_dtype is None
    assert prec.ddp_class is torch.nn.parallel.DistributedDataParallel


def test_initialize_converting_nothing_is_fp8_not_applied():
    ms = fake_msamp(convert=False)
    model = TinyLlama()
    prec = msamp_backend.apply_msamp(model, msamp_plan("O1"), CPU, msamp=ms, scaling_parameter=ScalingParameter)
    with pytest.raises(EnvironmentProblem) as e:
        prec.wrap_optimizer(model, torch.optim.AdamW(model.parameters()))
    assert e.value.rule == "FP8-NOT-APPLIED"


def test_deepspeed_leaves_initialize_to_msamps_engine_and_recount_reports_it():
    ms = fake_msamp()
    model = TinyLlama()
    prec = msamp_backend.apply_msamp(model, msamp_plan("O3", strategy="deepspeed"), CPU, msamp=ms,
                                     scaling_parameter=ScalingParameter)
    opt = torch.optim.AdamW(model.parameters())
    assert prec.wrap_optimizer(model, opt) == (model, opt) and ms.calls == []
    assert prec.autocast_dtype is None and prec.ddp_class is None
    ms.nn.LinearReplacer.replace(model)  # what MS-AMP's DeepSpeed engine does inside deepspeed.initialize
    assert prec.recount(model).fp8_layers == 13 and "planned" not in prec.report.line()


@pytest.mark.parametrize("optimizer,level,cls,dtypes", [
    ("adamw", "O2", "LBAdamW", (torch.uint8, torch.float16)),
    ("adam", "O1", "LBAdam", (torch.float32, torch.float32)),
])
def test_the_optimizer_is_msamps_own_with_the_plans_arguments(optimizer, level, cls, dtypes):
    plan = make_plan(precision={"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": level}},
                     distributed={"strategy": "ddp", "procs_per_node": 1},
                     train={"optimizer": optimizer, "lr": 2e-3, "weight_decay": 0.1})
    name, kwargs = msamp_backend.msamp_optimizer_args(plan)
    assert name == cls
    assert kwargs == {"lr": 2e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1,
                      "exp_avg_dtype": dtypes[0], "exp_avg_sq_dtype": dtypes[1]}
    assert "decoupled_weight_decay" not in kwargs  # torch's AdamW default that MS-AMP's optimizers reject


def test_use_te_converts_through_msamps_te_replacer():
    from .test_precision_te import fake_te

    te, te_recipe, _ = fake_te()
    ms = fake_msamp()

    def te_replace(model):  # msamp/te/replacer.py: TE modules' weights become ScalingParameters
        ms.calls.append("TeReplacer")
        for m in model.modules():
            if isinstance(m, te.Linear):
                m.weight = ScalingParameter(m.weight.detach().clone())
        return model

    ms.te.TeReplacer = types.SimpleNamespace(replace=te_replace)
    model = TinyLlama()
    prec = msamp_backend.apply_msamp(model, msamp_plan("O2", use_te=True), CPU, msamp=ms,
                                     scaling_parameter=ScalingParameter, te=te, te_recipe=te_recipe)
    prec.wrap_optimizer(model, torch.optim.AdamW(model.parameters()))
    assert ms.calls[0] == "TeReplacer"


def test_clip_grad_norm_goes_through_msamp():
    ms = fake_msamp()
    prec = msamp_backend.apply_msamp(TinyLlama(), msamp_plan(), CPU, msamp=ms, scaling_parameter=ScalingParameter)
    prec.clip_grad_norm_([], 1.0)
    assert ms.clipped == [1.0]


@pytest.mark.skipif(importlib.util.find_spec("msamp") is not None, reason="MS-AMP is installed")
def test_missing_msamp_raises_backend_missing():
    with pytest.raises(BackendMissing) as e:
        apply_precision(TinyLlama(), msamp_plan(), CPU)
    assert e.value.rule == "BACKEND-MISSING" and "github.com/Azure/MS-AMP" in str(e.value)


def test_use_te_swaps_linears_to_te_and_runs_under_te_autocast():
    from .test_precision_te import fake_te

    te, te_recipe, log = fake_te()
    model = TinyLlama()
    prec = msamp_backend.apply_msamp(model, msamp_plan("O2", use_te=True), CPU, msamp=fake_msamp(),
                                     scaling_parameter=ScalingParameter, te=te, te_recipe=te_recipe)
    assert sum(isinstance(m, te.Linear) for m in model.modules()) == 13
    assert type(model.norm) is not te.RMSNorm  # MS-AMP converts TE Linear weights only
    assert prec.report.fp8_layers == 13
    with prec.autocast():
        assert log.in_autocast.cls == "DelayedScaling" and log.in_autocast.fp8_format is te_recipe.Format.HYBRID
