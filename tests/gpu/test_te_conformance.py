"""One set of assertions about what fp8launch relies on in Transformer Engine, run against the stand-in on the CPU
(tests/train/test_te_standin.py, in every test run) and against the installed TE on a GPU (skipped without
CUDA, TE or an FP8 GPU): if the stand-in drifts from the library, the GPU run of this file says where.

Covered: the keyword names fp8launch passes (and that others are refused); extra state (empty before the first
FP8 forward and for stateless recipes, a pickle TE refuses to load for delayed scaling); the fp8_meta layout and
the delayed-scaling state fp8launch's checkpoint saves and restores (a restored module continues bit for bit);
te.distributed.checkpoint being invisible to torch.compile; DotProductAttention as the builtin attention core
(causal, grouped-query, "bshd") and in FP8 under fp8_dpa; FP8 weights with FusedAdam's fp32 master copy.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train._precision import TinyLlama, make_plan  # noqa: E402
from train.te_2_20 import EXTRA_STATE_REFUSAL, TE_MODULE_STATE_METHODS, UNSAFE_PICKLE_ENV  # noqa: E402
from train.test_te_standin import fake_te  # noqa: E402

from launcher.train.models.llama import CoreAttention  # noqa: E402
from launcher.train.precision import te_state  # noqa: E402
from launcher.train.precision.te import build_recipe, is_quantized_weight, quantized_init, swap_modules, te_autocast  # noqa: E402
from launcher.train.precision.te_recipe import RECIPE_CLASS, fused_adam_args  # noqa: E402
from launcher.train.precision.te_swap import swap_plan  # noqa: E402


def _real_te_missing() -> str:
    if importlib.util.find_spec("transformer_engine") is None:
        return "Transformer Engine is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.get_device_capability() < (8, 9):
        return "FP8 needs compute capability >= 8.9"
    return ""


IMPLEMENTATIONS = [
    pytest.param("stand-in", id="stand-in"),
    pytest.param("transformer_engine", id="te", marks=[pytest.mark.gpu, pytest.mark.skipif(bool(_real_te_missing()),
                                                                                            reason=_real_te_missing() or "-")]),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request, monkeypatch):
    """te, te_recipe and the device for one implementation; NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE unset."""
    monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    if request.param == "stand-in":
        te, te_recipe, _ = fake_te()
        return types.SimpleNamespace(name="stand-in", te=te, te_recipe=te_recipe, device=torch.device("cpu"))
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe

    return types.SimpleNamespace(name="te", te=te, te_recipe=te_recipe, device=torch.device("cuda"))


def te_plan(**te):
    return make_plan(precision={"mode": "fp8", "backend": "te", "keep_first_last": False, "te": te},
                     distributed={"strategy": "ddp", "procs_per_node": 1})


def delayed(impl, history=16):
    return impl.te_recipe.DelayedScaling(fp8_format=impl.te_recipe.Format.HYBRID, amax_history_len=history)


def linear(impl, n=64, seed=0):
    torch.manual_seed(seed)
    return impl.te.Linear(n, n, bias=False, params_dtype=torch.float32, device=impl.device)


def step(impl, module, recipe, x):
    """One FP8 forward and backward of `module` under `recipe`; the output."""
    with te_autocast(impl.te, recipe):
        out = module(x)
    out.float().pow(2).mean().backward()
    return out.detach()


def tokens(impl, n=64, seed=1):
    return torch.randn(32, n, generator=torch.Generator().manual_seed(seed)).to(impl.device)


# --- what fp8launch calls takes fp8launch's keywords, and refuses others ---------------------------------------------

def test_the_modules_take_what_fp8launch_passes_and_refuse_other_keywords(impl):
    model = TinyLlama()
    plan = te_plan(fp8_dpa=True)
    model.layers[0].attention.core = CoreAttention()  # the builtin models' attention core (TinyLlama's own has none)
    model.layers[0].attention.n_heads, model.layers[0].attention.n_kv_heads, model.layers[0].attention.head_dim = 4, 4, 16
    swaps = swap_plan(model, plan.precision.te, plan)
    assert {s.te_class for s in swaps if s.swapped} == {"Linear", "RMSNorm", "DotProductAttention"}
    swap_modules(model.to(impl.device), swaps, impl.te, device=impl.device, recipe=delayed(impl))
    with pytest.raises(TypeError):
        impl.te.Linear(16, 16, not_a_te_argument=1)
    with pytest.raises(TypeError):
        impl.te.DotProductAttention(4, 16, device=impl.device)  # takes no device


@pytest.mark.parametrize("recipe", sorted(RECIPE_CLASS))
def test_every_recipe_builds_from_the_plan(impl, recipe):
    built = build_recipe(te_plan(recipe=recipe).precision.te, impl.te_recipe)
    assert type(built).__name__ == RECIPE_CLASS[recipe]


# --- extra state and the delayed-scaling state -------------------------------------------------------------------------

def test_extra_state_is_empty_before_the_first_fp8_forward(impl):
    m = linear(impl)
    assert all(callable(getattr(m, name, None)) for name in TE_MODULE_STATE_METHODS)
    state = m.get_extra_state()
    assert state.dtype is torch.uint8 and state.numel() == 0
    assert m.get_fp8_meta_tensors() is None


def test_delayed_scaling_extra_state_is_a_pickle_te_refuses_to_load(impl):
    m = linear(impl)
    step(impl, m, delayed(impl), tokens(impl))
    payload = m.get_extra_state()
    assert payload.dtype is torch.uint8 and payload.numel() > 0
    with pytest.raises(RuntimeError, match=EXTRA_STATE_REFUSAL):
        linear(impl).set_extra_state(payload)
    linear(impl).set_extra_state(torch.empty(0, dtype=torch.uint8))  # the empty payload fp8launch saves is ignored


def test_a_stateless_recipe_saves_no_extra_state(impl):
    m = linear(impl)
    step(impl, m, impl.te_recipe.Float8CurrentScaling(), tokens(impl))
    assert m.get_extra_state().numel() == 0
    assert te_state.scaling_state(m) == {}


def test_the_delayed_scaling_state_has_tes_layout_and_moves(impl):
    m = linear(impl)
    recipe = delayed(impl)
    step(impl, m, recipe, tokens(impl))
    (scale_fwd, hist_fwd), (scale_bwd, hist_bwd) = m.get_fp8_meta_tensors().values()
    assert scale_fwd.shape == (3,) and hist_fwd.shape == (16, 3) and scale_bwd.shape == (2,) and hist_bwd.shape == (16, 2)
    assert hist_fwd.abs().sum() > 0 and hist_bwd.abs().sum() > 0  # amaxes of input, weight and grad_output recorded
    assert (scale_fwd[:2] != 1).all()  # the input and weight scales moved off their initial 1


def test_a_module_restored_from_plain_tensors_continues_bit_for_bit(impl):
    """What fp8launch's checkpoint does (launcher/train/precision/te_state.py): scales and amax histories out as plain
    tensors, into a fresh module through TE's own fp8_meta, and the next FP8 step is the same."""
    recipe = delayed(impl, history=4)
    a = linear(impl)
    for s in range(3):
        step(impl, a, recipe, tokens(impl, seed=s))
    saved = te_state.scaling_state(a)[""]
    b = linear(impl, seed=7)
    with torch.no_grad():
        b.weight.copy_(a.weight)
    assert te_state.restore_scaling_state(b, {"": saved}, lambda n: delayed(impl, history=n)) == 1
    x = tokens(impl, seed=9)
    torch.testing.assert_close(step(impl, b, recipe, x), step(impl, a, recipe, x), rtol=0, atol=0)
    fresh = linear(impl, seed=7)
    with torch.no_grad():
        fresh.weight.copy_(a.weight)
    assert not torch.equal(step(impl, fresh, recipe, x), step(impl, a, recipe, x))  # without it: other scales


# --- torch.compile and TE's checkpoint ------------------------------------------------------------------------------------

def test_tes_checkpoint_never_reaches_a_compiled_graph(impl):
    m = linear(impl)
    ops: list[str] = []

    def record(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    x = tokens(impl).requires_grad_(True)
    torch.compile(lambda x: impl.te.distributed.checkpoint(m, x, use_reentrant=False) * 2, backend=record)(x)
    assert not any("linear" in op or "gemm" in op or "checkpoint" in op for op in ops), ops


# --- attention ----------------------------------------------------------------------------------------------------------

def attention(impl):
    return impl.te.DotProductAttention(num_attention_heads=4, kv_channels=16, num_gqa_groups=2, attention_dropout=0.0,
                                       qkv_format="bshd", attn_mask_type="causal")


def qkv(impl, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 32, 4, 16, generator=g)
    k, v = torch.randn(2, 32, 2, 16, generator=g), torch.randn(2, 32, 2, 16, generator=g)
    return [t.to(impl.device, dtype) for t in (q, k, v)]


def test_dot_product_attention_computes_the_builtin_attention_core(impl):
    q, k, v = qkv(impl)
    out = attention(impl)(q, k, v)
    assert out.shape == (2, 32, 64)
    torch.testing.assert_close(out.float(), CoreAttention()(q, k, v).float(), rtol=2e-2, atol=2e-2)


def test_fp8_dpa_runs_the_attention_in_fp8(impl):
    if impl.name == "te" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("FP8 attention (FusedAttention) needs sm90+")
    q, k, v = qkv(impl)
    core = attention(impl)
    recipe = impl.te_recipe.DelayedScaling(fp8_format=impl.te_recipe.Format.HYBRID, fp8_dpa=True)
    with te_autocast(impl.te, recipe):
        fp8 = core(q, k, v)
    assert core.fp8_meta["scaling_fwd"].amax_history.abs().sum() > 0
    ref = CoreAttention()(q, k, v)
    assert not torch.equal(fp8, ref)
    torch.testing.assert_close(fp8.float(), ref.float(), rtol=0.15, atol=0.15)


# --- FP8 weights and FusedAdam's master copy --------------------------------------------------------------------------

def test_fp8_weights_step_through_fused_adams_fp32_master_copy(impl):
    plan = te_plan(recipe="current", fp8_params=True)
    recipe = impl.te_recipe.Float8CurrentScaling()
    torch.manual_seed(0)
    initial = torch.randn(64, 64) * 0.05
    with quantized_init(impl.te, recipe):
        m = impl.te.Linear(64, 64, bias=False, params_dtype=torch.float32, device=impl.device,
                           init_method=lambda w: w.copy_(initial.to(w.device)))
    assert is_quantized_weight(m.weight)
    hp = m.weight.get_high_precision_init_val()
    assert hp is not None and torch.equal(hp.float().cpu(), initial)
    opt = impl.te.optimizers.FusedAdam([m.weight], **fused_adam_args(plan))
    opt.initialize_state(m.weight, store_param_remainders=False)
    opt.set_scaled_state(m.weight, "master_param", hp.to(impl.device, torch.float32))
    m.weight.clear_high_precision_init_val()
    before = m.weight.dequantize().clone()
    step(impl, m, recipe, tokens(impl))
    opt.step()
    master = opt.state[m.weight]["master_param"]
    assert is_quantized_weight(m.weight) and master.dtype is torch.float32
    assert not torch.equal(m.weight.dequantize(), before)  # the FP8 weight was re-quantized from the stepped master
    assert not torch.equal(master, m.weight.dequantize().float())  # which keeps what FP8 rounds away
