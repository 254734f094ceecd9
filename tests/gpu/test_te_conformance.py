"""One set of assertions about what fp8launch relies on in Transformer Engine, run against the stand-in on the CPU
(tests/train/test_te_standin.py, in every test run) and against the installed TE on a GPU (skipped without
CUDA, TE or an FP8 GPU): if the stand-in drifts from the library, the GPU run of this file says where.

Covered: the keyword names fp8launch passes (and that others are refused); extra state (empty before the first
FP8 forward and for stateless recipes, a pickle TE refuses to load for delayed scaling); the fp8_meta layout and
the delayed-scaling state fp8launch's checkpoint saves and restores (a restored module continues bit for bit);
te.distributed.checkpoint being invisible to torch.compile; DotProductAttention as the builtin attention core
(causal, grouped-query, "bshd") and in FP8 under fp8_dpa, at a shape TE trains on an H100 (head_dim 128); where FP8
attention has a backend (launcher/planning/rules/te_attention.py) and TE's own error where it has none; current scaling's
attention state (one delayed GEMM) saved and restored in TE's layout; FP8 weights with FusedAdam's fp32 master copy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.planning.rules.te_attention import NO_BACKEND, refusal  # noqa: E402
from launcher.train.models.llama import CoreAttention  # noqa: E402
from launcher.train.precision import te_state  # noqa: E402
from launcher.train.precision.te import build_recipe, is_quantized_weight, quantized_init, swap_modules, te_autocast  # noqa: E402
from launcher.train.precision.te_recipe import RECIPE_CLASS, fused_adam_args  # noqa: E402
from launcher.train.precision.te_swap import swap_plan  # noqa: E402
from train import test_te_standin as standin  # noqa: E402
from train._precision import TinyLlama, make_plan  # noqa: E402
from train.te_2_20 import EXTRA_STATE_REFUSAL, TE_MODULE_STATE_METHODS, UNSAFE_PICKLE_ENV  # noqa: E402
from train.test_te_standin import META_DO, META_DP, META_O, META_QKV, META_S, fake_te  # noqa: E402


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

HEADS, KV_HEADS, HEAD_DIM, SEQ = 4, 2, 128, 128
"""A shape real TE trains in FP8 on an H100: FusedAttention's FP8 kernels train only head_dim 128 on sm90 (and, with a
cuDNN before 9.7, sequence lengths that are multiples of 128): launcher/planning/rules/te_attention.py."""


def attention(impl, head_dim=HEAD_DIM):
    return impl.te.DotProductAttention(num_attention_heads=HEADS, kv_channels=head_dim, num_gqa_groups=KV_HEADS,
                                       attention_dropout=0.0, qkv_format="bshd", attn_mask_type="causal")


def qkv(impl, dtype=torch.bfloat16, head_dim=HEAD_DIM, seed=3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, SEQ, HEADS, head_dim, generator=g)
    k, v = torch.randn(2, SEQ, KV_HEADS, head_dim, generator=g), torch.randn(2, SEQ, KV_HEADS, head_dim, generator=g)
    return [t.to(impl.device, dtype).requires_grad_(True) for t in (q, k, v)]


def capabilities(impl) -> list[tuple[int, int]]:
    """The GPUs an attention test runs on: the real one, or for the stand-in an H100, a B200, an RTX PRO 6000 and an L40S
    (each emulated: the stand-in selects its backend for STATE.capability)."""
    if impl.name == "te":
        return [torch.cuda.get_device_capability()]
    return [(9, 0), (10, 0), (12, 0), (8, 9)]


@contextlib.contextmanager
def on_gpu(impl, capability):
    if impl.name == "stand-in":
        saved, standin.STATE.capability = standin.STATE.capability, capability
        try:
            yield
        finally:
            standin.STATE.capability = saved
    else:
        yield


def fp8_attention_step(impl, core, recipe, q, k, v):
    """One FP8 forward and backward of `core`; the output."""
    with te_autocast(impl.te, recipe):
        out = core(q, k, v)
    out.float().pow(2).mean().backward()
    return out.detach()


def test_dot_product_attention_computes_the_builtin_attention_core(impl):
    q, k, v = qkv(impl)
    out = attention(impl)(q, k, v)
    assert out.shape == (2, SEQ, HEADS * HEAD_DIM)
    torch.testing.assert_close(out.float(), CoreAttention()(q, k, v).float(), rtol=2e-2, atol=2e-2)


def test_fp8_dpa_runs_the_attention_in_fp8(impl):
    cap = capabilities(impl)[0]
    if refusal(cap, "delayed", HEAD_DIM):
        pytest.skip(f"no FP8 attention backend here: {refusal(cap, 'delayed', HEAD_DIM)}")
    q, k, v = qkv(impl)
    core = attention(impl)
    recipe = impl.te_recipe.DelayedScaling(fp8_format=impl.te_recipe.Format.HYBRID, fp8_dpa=True)
    fp8 = fp8_attention_step(impl, core, recipe, q, k, v)
    fwd, bwd = core.fp8_meta["scaling_fwd"].amax_history, core.fp8_meta["scaling_bwd"].amax_history
    assert fwd.shape[1] == 9 and bwd.shape[1] == 6  # three GEMMs' slots
    assert (fwd[:, [META_QKV, META_O, META_S]].abs().sum(0) > 0).all()  # Q/K/V (one scale), O and S in FP8
    assert (bwd[:, [META_DO, META_DP]].abs().sum(0) > 0).all()  # dO and dP in FP8
    ref = CoreAttention()(*(t.detach() for t in (q, k, v)))
    assert not torch.equal(fp8, ref)
    torch.testing.assert_close(fp8.float(), ref.float(), rtol=0.15, atol=0.15)


@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_attention_has_a_backend_exactly_where_planning_says(impl, recipe, head_dim):
    """te_attention.refusal (what rules TE-FP8-DPA-GPU and TE-FP8-DPA-BACKEND ask) against the library: where it refuses,
    TE raises its own error at the first forward; elsewhere FP8 attention trains."""
    for cap in capabilities(impl):
        with on_gpu(impl, cap):
            built = build_recipe(te_plan(recipe=recipe, fp8_dpa=True).precision.te, impl.te_recipe)
            q, k, v = qkv(impl, head_dim=head_dim)
            why = refusal(cap, recipe, head_dim)
            if why:
                with pytest.raises(ValueError, match=NO_BACKEND):
                    fp8_attention_step(impl, attention(impl, head_dim), built, q, k, v)
            else:
                out = fp8_attention_step(impl, attention(impl, head_dim), built, q, k, v)
                assert torch.isfinite(out).all() and q.grad is not None and torch.isfinite(q.grad).all(), (cap, recipe, head_dim)


def test_current_scaling_attention_keeps_one_delayed_gemm_and_resumes_in_that_layout(impl):
    """Float8CurrentScaling with fp8_dpa: DotProductAttention keeps a DelayedScaling state for S and dP only (3 forward
    and 2 backward slots; num_gemms 3), which fp8launch's checkpoint saves and puts back in that layout (rebuilt as three
    GEMMs its 3 scales would not fit the 9 slots); the restored module's next step is the uninterrupted one's."""
    cap = (10, 0) if impl.name == "stand-in" else capabilities(impl)[0]
    if refusal(cap, "current", HEAD_DIM):
        pytest.skip(f"no FP8 attention backend here: {refusal(cap, 'current', HEAD_DIM)}")
    recipe = impl.te_recipe.Float8CurrentScaling(fp8_dpa=True)
    with on_gpu(impl, cap):
        a = attention(impl)
        for seed in range(3):
            fp8_attention_step(impl, a, recipe, *qkv(impl, seed=seed))
        meta = a.fp8_meta
        assert meta["num_gemms"] == 3 and meta["recipe"].delayed() and meta["recipe"].amax_history_len == 1
        assert [type(r).__name__ for r in meta["local_recipes"]] == ["Float8CurrentScaling", "DelayedScaling"]
        assert meta["scaling_fwd"].scale.shape == (3,) and meta["scaling_fwd"].amax_history.shape == (1, 3)
        assert meta["scaling_bwd"].scale.shape == (2,) and meta["scaling_bwd"].amax_history.shape == (1, 2)
        assert (meta["scaling_fwd"].scale[2] != 1) and (meta["scaling_bwd"].scale[1] != 1)  # S's and dP's scales moved
        saved = te_state.scaling_state(a)[""]
        b = attention(impl)
        delayed = lambda n: impl.te_recipe.DelayedScaling(fp8_format=recipe.fp8_format, amax_history_len=n)  # noqa: E731
        assert te_state.restore_scaling_state(b, {"": saved}, delayed, recipe) == 1
        x = qkv(impl, seed=9)
        same = fp8_attention_step(impl, b, recipe, *x)
        torch.testing.assert_close(same, fp8_attention_step(impl, a, recipe, *qkv(impl, seed=9)), rtol=0, atol=0)
        fresh = fp8_attention_step(impl, attention(impl), recipe, *qkv(impl, seed=9))
        assert not torch.equal(fresh, same)  # without the restore: S scaled by 1, not by the saved scale


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
