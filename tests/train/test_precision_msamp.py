"""MS-AMP: the pure parts (initialize arguments, DeepSpeed section, which Linears stay) and the thin
call to msamp.initialize, with a stand-in for that call only (MS-AMP needs CUDA and is built from source)."""

from __future__ import annotations

import copy
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
    """Stands in for msamp.nn.ScalingParameter: a weight MS-AMP holds (in fp16, its kfloat16 master copy). Its
    FP8 gradient is a ScalingTensor, here `grad` (the scaled E4M3 values) and `grad_scale_inv` (its meta.scale_inv)."""


E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _scaled(t: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, scale_inv) of t cast to `fp8` as MS-AMP casts it in time: the scale is the power of two
    2^floor(log2(fp8 max / amax)), msamp/common/tensor/meta.py compute_scaling_factor with margin 0."""
    amax = t.detach().abs().max().float()
    scale = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(torch.finfo(fp8).max / amax))), torch.ones(()))
    return (t.float() * scale).to(fp8), 1 / scale


def _fp8(t: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """t through the FP8 cast and back: the values an MS-AMP FP8 GEMM multiplies."""
    value, scale_inv = _scaled(t, fp8)
    return value.float() * scale_inv


def grad_of(p: nn.Parameter) -> torch.Tensor:
    """p's gradient as MS-AMP reads it: a ScalingTensor's float() (value times meta.scale_inv), a tensor's as it is."""
    scale_inv = getattr(p, "grad_scale_inv", None)
    return p.grad.float() if scale_inv is None else p.grad.float() * scale_inv


class _FP8Gemm(torch.autograd.Function):
    """msamp/nn/functional.py _FP8GemmFunction: input and weight cast to E4M3, the output gradient to E5M2; the
    weight gradient (accumulated over micro-batches) is cast to E4M3 and assigned to weight.grad directly."""

    @staticmethod
    def forward(ctx, x, weight, out_dtype):
        with torch.autocast(x.device.type, enabled=False):
            x8, w8 = _fp8(x, E4M3), _fp8(weight, E4M3)
            ctx.save_for_backward(x8, w8)
            ctx.weight, ctx.x_dtype = weight, x.dtype
            return (x8 @ w8.t()).to(out_dtype)

    @staticmethod
    def backward(ctx, grad):
        x8, w8 = ctx.saved_tensors
        g8 = _fp8(grad.contiguous(), E5M2)
        weight = ctx.weight
        wgrad = g8.t() @ x8 + (grad_of(weight) if weight.grad is not None else 0)
        value, weight.grad_scale_inv = _scaled(wgrad, E4M3)
        weight.grad = value.to(weight.dtype)
        return (g8 @ w8).to(ctx.x_dtype), None, None


class FP8Linear(nn.Module):
    """msamp.nn.FP8Linear: the weight as a ScalingParameter, the GEMM in FP8, the output in the autocast dtype."""

    def __init__(self, linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = ScalingParameter(linear.weight.detach().to(torch.float16))
        self.bias = linear.bias

    def forward(self, x):
        device = x.device.type
        out_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        out = _FP8Gemm.apply(x.reshape(-1, x.shape[-1]), self.weight, out_dtype).view(*x.shape[:-1], -1)
        return out if self.bias is None else out + self.bias.to(out_dtype)


def msamp_clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """msamp/nn/clip_grad.py clip_grad_norm_: the total norm of the gradients as MS-AMP reads them; clipping scales
    a ScalingTensor gradient's meta.scale_inv (ScalingTensor.mul_) and a tensor gradient's values."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(grad_of(p), norm_type) for p in params]), norm_type)
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    if coef.item() < 1.0:
        for p in params:
            if getattr(p, "grad_scale_inv", None) is not None:
                p.grad_scale_inv = p.grad_scale_inv * coef
            else:
                p.grad.detach().mul_(coef)
    return total


def fake_msamp(convert=True):
    """The parts of MS-AMP 0.4 that wrap_optimizer and the engine call, with MS-AMP's numerics where it computes:
    msamp.nn.LinearReplacer.replace (every nn.Linear without use_fp32_linear becomes an FP8Linear, msamp/nn/linear.py),
    msamp.te.TeReplacer, msamp.clip_grad_norm_, and the optimizers msamp.optim.LBAdamW / LBAdam (recorded with
    their arguments)."""
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

    return types.SimpleNamespace(nn=types.SimpleNamespace(LinearReplacer=replacer("LinearReplacer")),
                                 te=types.SimpleNamespace(TeReplacer=replacer("TeReplacer")),
                                 optim=types.SimpleNamespace(LBAdamW=optimizer("LBAdamW"), LBAdam=optimizer("LBAdam")),
                                 calls=calls, clip_grad_norm_=msamp_clip_grad_norm_)


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
    """With use_te the Linears become te.Linear, MS-AMP's TeReplacer holds their weights as fp16 ScalingParameters
    (msamp/te/replacer.py: weight.data.cast(Dtypes.kfloat16)), and the forward runs TE's FP8 GEMMs on those weights:
    the logits are bit-equal to the swapped model's with its te.Linear weights rounded to fp16, and they differ
    from the bf16 twin's as FP8 does. Without the TeReplacer the weights stay fp32 (another FP8 rounding: 2% off),
    without TE's autocast no GEMM is FP8 (the bf16 twin's logits)."""
    from .test_precision_te import fake_te

    te, te_recipe, _ = fake_te()
    ms = fake_msamp()

    def te_replace(model):  # msamp/te/replacer.py: TE modules' weights become fp16 ScalingParameters
        for m in model.modules():
            if isinstance(m, te.Linear):
                m.weight = ScalingParameter(m.weight.detach().to(torch.float16))
        return model

    ms.te.TeReplacer = types.SimpleNamespace(replace=te_replace)
    tokens = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    twin = TinyLlama()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_logits = twin(tokens).float()
    model = TinyLlama()
    prec = msamp_backend.apply_msamp(model, msamp_plan("O2", use_te=True), CPU, msamp=ms,
                                     scaling_parameter=ScalingParameter, te=te, te_recipe=te_recipe)
    reference = copy.deepcopy(model)  # swapped to te.Linear, not converted
    for m in reference.modules():
        if isinstance(m, te.Linear):
            m.weight.data = m.weight.data.to(torch.float16)
    model, _ = prec.wrap_optimizer(model, torch.optim.AdamW(model.parameters()))
    assert sum(isinstance(m.weight, ScalingParameter) for m in model.modules() if isinstance(m, te.Linear)) == 13
    with torch.no_grad(), prec.autocast():
        logits, expected = model(tokens).float(), reference(tokens).float()
    assert torch.equal(logits, expected)
    # FP8 vs bf16: 0.040-0.047 relative (seeds 0-5 of the model and the tokens); bf16 itself would be 0
    assert 0.01 < ((logits - bf16_logits).norm() / bf16_logits.norm()).item() < 0.15


def test_clip_grad_norm_goes_through_msamp():
    """The engine clips MS-AMP's FP8 gradients with MS-AMP's clip_grad_norm_, which reads them as MS-AMP holds them
    (the E4M3 values times their scale_inv): the norm it returns is the fp32 twin's within FP8's error, and after
    clipping the gradients' norm is max_norm. torch's clip_grad_norm_ would read the scaled E4M3 values (a norm
    near 2e4 here) and leave the true gradients 4 orders of magnitude below max_norm."""
    from launcher.train.engines.base import Engine

    from ._precision import lm_loss

    tokens = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(0))
    twin = TinyLlama()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lm_loss(twin, tokens).backward()
    twin_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in twin.parameters()])).item()
    model = TinyLlama()
    prec = msamp_backend.apply_msamp(model, msamp_plan(), CPU, msamp=fake_msamp(), scaling_parameter=ScalingParameter)
    model, optimizer = prec.wrap_optimizer(model, torch.optim.AdamW(model.parameters()))
    engine = Engine(model=model, module=model, optimizer=optimizer, scheduler=None, precision=prec, accum_steps=1)
    logits = engine.forward(tokens[:, :-1])
    engine.backward(nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()), last=True)
    assert sum(isinstance(p, ScalingParameter) and p.grad is not None for p in model.parameters()) == 13
    before = [grad_of(p).clone() for p in model.parameters()]
    max_norm = twin_norm / 2
    norm = engine.clip_grad_norm(max_norm).item()
    # 0.002-0.004 relative to the twin's norm (seeds 0-7 of the model and the tokens)
    assert norm == pytest.approx(twin_norm, rel=0.02)
    after = [grad_of(p) for p in model.parameters()]
    assert torch.linalg.vector_norm(torch.stack([g.norm() for g in after])).item() == pytest.approx(max_norm, rel=1e-5)
    for b, a in zip(before, after):  # every gradient scaled by the same factor, max_norm / norm
        torch.testing.assert_close(a, b * (max_norm / norm), rtol=1e-5, atol=1e-12)


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
