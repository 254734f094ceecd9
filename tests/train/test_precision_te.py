"""Transformer Engine: the recipe mapping and the swap plan are pure and tested against TE 2.20.2's
recorded signatures; the application is tested with a stand-in for the TE library calls only
(TE cannot be installed on a CPU machine; tests/gpu/test_te_gpu.py runs the real one)."""

from __future__ import annotations

import contextlib
import importlib.util
import types

import pytest
import torch
from torch import nn

from launcher.errors import BackendMissing, EnvironmentProblem, LauncherError
from launcher.planning.install import INSTALL
from launcher.planning.read import defaults
from launcher.train.precision import apply_precision
from launcher.train.precision import te as te_backend
from launcher.train.precision.te_recipe import RECIPE_CLASS, recipe_kwargs, unread_fields
from launcher.train.precision.te_swap import swap_plan

from ._precision import TinyLlama, fp8_plan, make_plan
from .te_2_20 import TE_FORMATS, TE_MODULE_ARGS, TE_RECIPE_FIELDS
from .test_te_standin import fake_te  # noqa: F401 - test_precision_msamp imports it from here

CPU = torch.device("cpu")
TE_DEFAULTS = defaults()["precision"]["te"]


def te_plan(keep_first_last=True, keep=(), high_precision="bf16", strategy="ddp", **te):
    return make_plan(
        precision={"mode": "fp8", "backend": "te", "keep_first_last": keep_first_last, "keep": list(keep),
                   "high_precision": high_precision, "te": te},
        distributed={"strategy": strategy, "procs_per_node": 1})


# --- recipe ---------------------------------------------------------------------------------

def test_recipe_kwargs_for_every_recipe():
    cfg = lambda **kw: te_plan(**kw).precision.te  # noqa: E731
    assert recipe_kwargs(cfg(recipe="delayed", margin=1, amax_history_len=16, amax_compute_algo="most_recent",
                             reduce_amax=False, fp8_dpa=True)) == ("DelayedScaling", {
        "fp8_format": "HYBRID", "margin": 1, "amax_history_len": 16, "amax_compute_algo": "most_recent",
        "reduce_amax": False, "fp8_dpa": True, "fp8_mha": False})
    assert recipe_kwargs(cfg(recipe="current", fp8_format="E4M3", fp8_mha=True)) == (
        "Float8CurrentScaling", {"fp8_format": "E4M3", "fp8_dpa": False, "fp8_mha": True})
    assert recipe_kwargs(cfg(recipe="block")) == ("Float8BlockScaling", {"fp8_format": "HYBRID"})
    assert recipe_kwargs(cfg(recipe="mxfp8", margin=2, fp8_format="E4M3")) == (
        "MXFP8BlockScaling", {"fp8_format": "E4M3", "margin": 2, "fp8_dpa": False, "fp8_mha": False})
    assert recipe_kwargs(cfg(recipe="nvfp4")) == ("NVFP4BlockScaling", {"fp8_dpa": False, "fp8_mha": False})


@pytest.mark.parametrize("recipe", sorted(RECIPE_CLASS))
def test_every_kwarg_is_a_field_of_the_te_2_20_class(recipe):
    name, kwargs = recipe_kwargs(te_plan(recipe=recipe).precision.te)
    assert set(kwargs) <= TE_RECIPE_FIELDS[name]
    assert kwargs.get("fp8_format", "E4M3") in TE_FORMATS


def test_block_with_fp8_attention_is_refused_with_the_fix():
    with pytest.raises(LauncherError, match="precision.te.fp8_dpa = false") as e:
        recipe_kwargs(te_plan(recipe="block", fp8_dpa=True).precision.te)
    assert e.value.rule == "TE-BLOCK-FP8-ATTENTION"  # the rule table's message, not a copy of it


def test_unread_fields_name_what_the_recipe_ignores():
    assert unread_fields(te_plan(recipe="current", margin=3, amax_history_len=1024).precision.te, TE_DEFAULTS) == ("margin",)
    assert unread_fields(te_plan(recipe="delayed", margin=3).precision.te, TE_DEFAULTS) == ()
    assert unread_fields(te_plan(recipe="nvfp4", fp8_format="E4M3").precision.te, TE_DEFAULTS) == ("fp8_format",)


# --- the TE stand-in (tests/train/test_te_standin.py): TE 2.20's signatures, FP8 casts, extra state ------------

class NormsModel(nn.Module):
    """Every norm kind fp8launch may swap, and the ones it must not."""

    class GemmaRMSNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.eps = 1e-6
            self.weight = nn.Parameter(torch.zeros(dim))

    class LlamaRMSNorm(nn.Module):  # Hugging Face's: variance_epsilon, no eps
        def __init__(self, dim):
            super().__init__()
            self.variance_epsilon = 1e-6
            self.weight = nn.Parameter(torch.ones(dim))

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(64, eps=1e-4)
        self.ln_no_bias = nn.LayerNorm(64, bias=False)
        self.ln_no_affine = nn.LayerNorm(64, elementwise_affine=False)
        self.ln_2d = nn.LayerNorm((4, 16))
        self.torch_rms = nn.RMSNorm(64)
        self.torch_rms_no_affine = nn.RMSNorm(64, elementwise_affine=False)
        self.gemma = self.GemmaRMSNorm(64)
        self.hf = self.LlamaRMSNorm(64)
        self.proj = nn.Linear(64, 64, bias=True)
        self.head = nn.Linear(64, 32)


# --- swap plan ------------------------------------------------------------------------------------

def test_swap_plan_on_the_tiny_llama():
    plan = te_plan()
    swaps = swap_plan(TinyLlama(), plan.precision.te, plan)
    assert [(s.kind, s.swapped) for s in swaps].count(("linear", True)) == 13
    assert [(s.kind, s.swapped) for s in swaps].count(("rmsnorm", True)) == 5
    by = {s.fqn: s for s in swaps}
    assert by["output"].reason == "keep_first_last" and by["layers.0.attention.wq"].reason == "keep_first_last"
    w1 = by["layers.1.feed_forward.w1"]
    assert (w1.te_class, w1.kwargs, w1.params) == (
        "Linear", {"in_features": 64, "out_features": 192, "bias": False, "params_dtype": torch.float32},
        (("weight", "weight"),))
    norm = by["layers.0.attention_norm"]
    assert (norm.te_class, norm.kwargs, norm.params) == (
        "RMSNorm", {"normalized_shape": 64, "eps": 1e-5, "params_dtype": torch.float32}, (("weight", "weight"),))
    for s in swaps:
        assert set(s.kwargs) <= TE_MODULE_ARGS[s.te_class]


def test_swap_plan_norm_kinds_and_why_not():
    plan = te_plan(keep_first_last=False, keep=["hf"])
    by = {s.fqn: s for s in swap_plan(NormsModel(), plan.precision.te, plan)}
    assert by["ln"].kwargs == {"normalized_shape": 64, "eps": 1e-4, "params_dtype": torch.float32}
    assert by["ln"].params == (("weight", "weight"), ("bias", "bias"))
    assert by["ln_no_bias"].reason == "no bias (te.LayerNorm always has one)"
    assert by["ln_no_affine"].reason == "no affine weight (elementwise_affine=False)"
    assert by["ln_2d"].reason == "normalized_shape (4, 16) is not 1-D"
    assert by["torch_rms"].kwargs["eps"] == torch.finfo(torch.float32).eps  # torch's eps=None default
    assert by["torch_rms_no_affine"].reason == "no weight (elementwise_affine=False)"
    assert by["gemma"].kwargs == {"normalized_shape": 64, "eps": 1e-6, "params_dtype": torch.float32,
                                  "zero_centered_gamma": True}
    assert by["hf"].reason == "keep 'hf'"
    assert by["proj"].swapped and by["proj"].params == (("weight", "weight"), ("bias", "bias"))
    assert by["proj"].kwargs["bias"] is True


def test_swap_only_linear_leaves_norms_with_the_reason():
    plan = te_plan(swap=["linear"])
    swaps = swap_plan(TinyLlama(), plan.precision.te, plan)
    norms = [s for s in swaps if s.kind == "rmsnorm"]
    assert len(norms) == 5 and {s.reason for s in norms} == {"'rmsnorm' not in precision.te.swap"}


def test_swap_plan_on_the_builtin_llama_debug():
    llama = pytest.importorskip("launcher.train.models.llama")
    model = llama.Llama(llama.SIZES["llama-debug"])
    plan = te_plan()
    swaps = swap_plan(model, plan.precision.te, plan)
    assert sum(s.swapped and s.kind == "linear" for s in swaps) == 27
    assert sum(s.swapped and s.kind == "rmsnorm" for s in swaps) == 9


# --- application with the stand-in ---------------------------------------------------------------

def test_apply_swaps_copies_weights_and_the_model_computes_the_same():
    te, te_recipe, log = fake_te()
    ref = TinyLlama(seed=3)
    model = TinyLlama(seed=3)
    with torch.no_grad():  # non-trivial norm weights, so copying them is visible
        for name, p in list(ref.named_parameters()) + list(model.named_parameters()):
            if p.dim() == 1:
                p.copy_(torch.linspace(0.5, 1.5, p.numel()))
    prec = te_backend.apply_te(model, te_plan(high_precision="fp32"), CPU, te=te, te_recipe=te_recipe)
    assert type(model.layers[0].attention.wk) is te.Linear
    assert type(model.layers[0].attention.wq) is nn.Linear  # keep_first_last
    assert type(model.norm) is te.RMSNorm
    assert torch.equal(model.layers[1].feed_forward.w2.weight, ref.layers[1].feed_forward.w2.weight)
    tokens = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(model(tokens), ref(tokens), rtol=0, atol=0)  # outside te.autocast: the same model
    with prec.autocast():
        out = model(tokens)
        assert log.in_autocast is prec.recipe
    assert log.in_autocast is None
    assert not torch.equal(out, ref(tokens))  # inside: the swapped GEMMs read FP8 operands
    torch.testing.assert_close(out, ref(tokens), rtol=0.1, atol=0.05)
    assert not log.quantized_init
    r = prec.report
    assert (r.backend, r.recipe, r.fp8_layers, r.total_linear) == ("te", "delayed", 13, 15)
    assert r.line().startswith("precision: fp8 te delayed (HYBRID, 5 norms in TE), 13 of 15 Linear layers in FP8, 83.3% of GEMM FLOPs")
    assert r.kept == ("layers.0.attention.wq (keep_first_last)", "output (keep_first_last)")


def test_apply_builds_the_recipe_object_from_the_plan():
    te, te_recipe, _ = fake_te()
    prec = te_backend.apply_te(TinyLlama(), te_plan(recipe="current", fp8_format="E4M3"), CPU, te=te, te_recipe=te_recipe)
    assert prec.recipe.cls == "Float8CurrentScaling"
    assert prec.recipe.fp8_format is te_recipe.Format.E4M3
    assert (prec.recipe.fp8_dpa, prec.recipe.fp8_mha) == (False, False)


def test_fp8_params_builds_only_linears_under_quantized_model_init():
    te, te_recipe, log = fake_te()
    model = TinyLlama()
    prec = te_backend.apply_te(model, te_plan(fp8_params=True), CPU, te=te, te_recipe=te_recipe)
    assert log.quantized_init == [prec.recipe] * 13
    assert model.layers[1].attention.wq.fp8_weight is True
    assert not hasattr(model.norm, "fp8_weight")
    assert isinstance(model.layers[1].attention.wq.weight, te.Float8Tensor) and type(model.norm.weight) is nn.Parameter
    assert "fp8 weights, fp32 master copy in FusedAdam" in prec.report.line()
    # the high-precision initial values were taken off the FP8 weights, for the optimizer's master copy
    assert set(prec.high_precision_init) == {f"layers.{i}.{m}.weight" for i in (0, 1) for m in (
        "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")} | {
        "layers.1.attention.wq.weight"}
    assert model.layers[1].attention.wq.weight.get_high_precision_init_val() is None


def test_autocast_nests_torch_autocast_for_what_stays_in_torch():
    te, te_recipe, log = fake_te()
    model = TinyLlama()
    prec = te_backend.apply_te(model, te_plan(), CPU, te=te, te_recipe=te_recipe)
    with prec.autocast():
        assert torch.is_autocast_enabled("cpu") and log.in_autocast is prec.recipe
        assert model.output(torch.randn(2, 64)).dtype is torch.bfloat16


def test_frozen_parameters_stay_frozen():
    te, te_recipe, _ = fake_te()
    model = TinyLlama()
    model.layers[1].feed_forward.w1.weight.requires_grad_(False)
    te_backend.apply_te(model, te_plan(), CPU, te=te, te_recipe=te_recipe)
    assert model.layers[1].feed_forward.w1.weight.requires_grad is False
    assert model.layers[1].feed_forward.w3.weight.requires_grad is True


def test_hardware_check_uses_tes_own_reason():
    te, _, _ = fake_te()
    te.is_mxfp8_available = lambda return_reason=False: (False, "MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures yet.")
    with pytest.raises(EnvironmentProblem) as e:
        te_backend.check_support(te, "mxfp8")
    assert e.value.rule == "TE-RECIPE-HARDWARE" and "12.0+" in str(e.value)
    te.is_fp8_available = lambda return_reason=False: (True, "")
    te_backend.check_support(te, "delayed")


def test_recipe_hardware_rule_on_an_old_gpu(monkeypatch):
    import launcher.train.precision as precision_pkg

    monkeypatch.setattr(precision_pkg, "capability", lambda device: (9, 0))
    with pytest.raises(EnvironmentProblem) as e:
        apply_precision(TinyLlama(), te_plan(recipe="mxfp8"), torch.device("cuda"))
    assert e.value.rule == "TE-RECIPE-HARDWARE" and "this GPU has 9.0" in str(e.value)


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine is installed")
def test_missing_transformer_engine_raises_backend_missing():
    with pytest.raises(BackendMissing) as e:
        apply_precision(TinyLlama(), te_plan(), CPU)
    assert e.value.rule == "BACKEND-MISSING" and f"{INSTALL['transformer_engine']}" in str(e.value)


def test_nothing_swapped_is_fp8_not_applied(monkeypatch):
    te, te_recipe, _ = fake_te()
    monkeypatch.setattr(te_backend, "_te", lambda: (te, te_recipe))
    with pytest.raises(EnvironmentProblem) as e:
        apply_precision(TinyLlama(), te_plan(swap=["rmsnorm"]), CPU)
    assert e.value.rule == "FP8-NOT-APPLIED"
    assert fp8_plan().precision.te.swap == ("linear", "layernorm", "rmsnorm")


# --- issue 29: attention, FP8 weights' optimizer, TE's current and older names ------------------------------------

def test_fp8_dpa_plans_te_attention_for_the_builtin_cores_with_te_2_20_keywords():
    llama = pytest.importorskip("launcher.train.models.llama")
    model = llama.Llama(llama.SIZES["llama-debug"])
    cfg = model.config
    plan = te_plan(fp8_dpa=True)
    cores = [s for s in swap_plan(model, plan.precision.te, plan) if s.kind == "attention"]
    assert [s.fqn for s in cores] == [f"layers.{i}.attention.core" for i in range(cfg.n_layers)]
    assert all(s.swapped for s in cores)
    assert cores[0].kwargs == {"num_attention_heads": cfg.n_heads, "kv_channels": cfg.head_dim, "num_gqa_groups": cfg.kv_heads,
                               "attention_dropout": 0.0, "qkv_format": "bshd", "attn_mask_type": "causal"}
    assert set(cores[0].kwargs) <= TE_MODULE_ARGS["DotProductAttention"]
    off = [s for s in swap_plan(model, te_plan().precision.te, te_plan()) if s.kind == "attention"]
    assert {s.reason for s in off} == {"precision.te.fp8_dpa is false"}


def test_fp8_dpa_without_an_attention_core_is_refused_by_the_run():
    te, te_recipe, _ = fake_te()  # TinyLlama's attention calls SDPA itself: like an hf: / py: model's
    with pytest.raises(LauncherError) as e:
        te_backend.apply_te(TinyLlama(), te_plan(fp8_dpa=True), CPU, te=te, te_recipe=te_recipe)
    assert e.value.rule == "TE-FP8-ATTENTION-MODEL"


def test_fused_adam_gets_the_plans_optimizer_with_an_fp32_master_copy():
    from launcher.train.precision.te_recipe import fused_adam_args

    from .te_2_20 import TE_OPTIMIZER_ARGS

    plan = make_plan(precision={"mode": "fp8", "backend": "te", "te": {"fp8_params": True}},
                     train={"optimizer": "adam", "lr": 2e-3, "weight_decay": 0.1})
    args = fused_adam_args(plan)
    assert args == {"lr": 2e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1, "adam_w_mode": False,
                    "master_weights": True, "master_weight_dtype": torch.float32}
    assert set(args) <= TE_OPTIMIZER_ARGS["FusedAdam"]
    with pytest.raises(LauncherError) as e:
        fused_adam_args(make_plan(precision={"mode": "fp8", "backend": "te", "te": {"fp8_params": True}}, train={"optimizer": "sgd"}))
    assert e.value.rule == "TE-FP8-PARAMS-OPTIMIZER"


def test_te_2_x_names_first_and_the_deprecated_ones_only_where_they_are_all_there_is():
    from launcher.train.precision.te import quantized_init, te_autocast

    te, te_recipe, log = fake_te()
    recipe = te_recipe.DelayedScaling()
    with te_autocast(te, recipe):
        assert log.in_autocast is recipe
    entered = []
    older = types.SimpleNamespace(fp8_autocast=lambda enabled, fp8_recipe: entered.append(fp8_recipe) or contextlib.nullcontext(),
                                  fp8_model_init=lambda enabled=True: entered.append("fp8_model_init") or contextlib.nullcontext())
    with te_autocast(older, recipe), quantized_init(older, recipe):  # TE 1.x: neither recipe= nor the high-precision value
        pass
    assert entered == [recipe, "fp8_model_init"]
    with quantized_init(te, recipe):
        assert log.quantized_init == [recipe]


def test_a_recipe_class_the_installed_te_lacks_stops_the_run_naming_it():
    te, te_recipe, _ = fake_te()
    del te_recipe.Float8CurrentScaling  # a TE older than 2.2
    with pytest.raises(EnvironmentProblem, match="no recipe class Float8CurrentScaling") as e:
        te_backend.apply_te(TinyLlama(), te_plan(recipe="current"), CPU, te=te, te_recipe=te_recipe)
    assert "Transformer Engine 2.20 has it" in str(e.value)
