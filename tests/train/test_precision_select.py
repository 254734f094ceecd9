"""select.py: which Linear layers run in FP8 and the reason each other one is kept."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from launcher.planning.selection import DIMS, KEEP_FIRST_LAST, SMALL, too_small
from launcher.train.precision import select
from launcher.train.precision.select import classify, fp8_filter

from ._precision import TinyLlama, fp8_plan

TINY_ORDER = [
    f"layers.{i}.{name}"
    for i in range(2)
    for name in ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                 "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
] + ["output"]


def test_every_linear_in_registration_order_first_and_last_kept():
    reasons = classify(TinyLlama(), fp8_plan(torchao={"skip_small": False}))
    assert list(reasons) == TINY_ORDER
    assert {fqn: r for fqn, r in reasons.items() if r} == {
        "layers.0.attention.wq": KEEP_FIRST_LAST,
        "output": KEEP_FIRST_LAST,
    }


def test_keep_first_last_off_converts_every_linear():
    reasons = classify(TinyLlama(), fp8_plan(keep_first_last=False, torchao={"skip_small": False}))
    assert set(reasons.values()) == {None}


def test_keep_globs_win_in_the_order_written_and_before_keep_first_last():
    plan = fp8_plan(keep=["*.feed_forward.w2", "layers.1.*", "outp?t"], torchao={"skip_small": False})
    reasons = classify(TinyLlama(), plan)
    kept = {fqn: r for fqn, r in reasons.items() if r}
    assert kept == {
        "layers.0.attention.wq": KEEP_FIRST_LAST,
        "layers.0.feed_forward.w2": "keep '*.feed_forward.w2'",
        **{f"layers.1.{n}": "keep 'layers.1.*'" for n in ("attention.wq", "attention.wk", "attention.wv",
                                                          "attention.wo", "feed_forward.w1", "feed_forward.w3")},
        "layers.1.feed_forward.w2": "keep '*.feed_forward.w2'",
        "output": "keep 'outp?t'",
    }


def test_globs_match_whole_fqns_case_sensitively():
    reasons = classify(TinyLlama(), fp8_plan(keep_first_last=False, keep=["wq", "*.WQ"], torchao={"skip_small": False}))
    assert set(reasons.values()) == {None}


def test_dims_not_multiples_of_16_are_kept_unless_torchao_pads():
    model = TinyLlama(vocab=250, hidden=200)  # output 64 -> 250 and the feed-forward 64 <-> 200
    reasons = classify(model, fp8_plan(keep_first_last=False, torchao={"skip_small": False}))
    assert {fqn for fqn, r in reasons.items() if r == DIMS} == {
        "layers.0.feed_forward.w1", "layers.0.feed_forward.w2", "layers.0.feed_forward.w3",
        "layers.1.feed_forward.w1", "layers.1.feed_forward.w2", "layers.1.feed_forward.w3", "output"}
    padded = classify(model, fp8_plan(keep_first_last=False, torchao={"skip_small": False, "pad_inner_dim": True}))
    assert set(padded.values()) == {None}


def test_block_recipes_keep_layers_whose_dims_are_not_multiples_of_their_block_and_skip_small_does_not_apply():
    model = TinyLlama(vocab=240, hidden=208)  # 240 = 15 x 16 and 208 = 13 x 16: fine for nvfp4, not for mxfp8's 32
    mx = classify(model, fp8_plan(keep_first_last=False, torchao={"recipe": "mxfp8"}))  # skip_small on (the default)
    assert {fqn for fqn, r in mx.items() if r} == {
        "layers.0.feed_forward.w1", "layers.0.feed_forward.w2", "layers.0.feed_forward.w3",
        "layers.1.feed_forward.w1", "layers.1.feed_forward.w2", "layers.1.feed_forward.w3", "output"}
    assert set(mx.values()) == {None, "dims not multiples of 32"}  # and no skip_small: torchao has no MX heuristic
    nv = classify(model, fp8_plan(keep_first_last=False, torchao={"recipe": "nvfp4"}))
    assert set(nv.values()) == {None}


def test_te_needs_dims_of_16_even_with_torchao_pad_inner_dim_set():
    plan = fp8_plan(backend="te", keep_first_last=False, torchao={"pad_inner_dim": True})
    reasons = classify(TinyLlama(vocab=250), plan)
    assert reasons["output"] == DIMS
    assert sum(r is None for r in reasons.values()) == 14


def test_skip_small_only_applies_to_torchao(msamp_stack):  # MS-AMP's own path, where its stack is installed
    model = TinyLlama()
    assert set(classify(model, fp8_plan(keep_first_last=False)).values()) == {SMALL}
    assert set(classify(model, fp8_plan(backend="te", keep_first_last=False)).values()) == {None}
    assert set(classify(model, fp8_plan(backend="msamp", keep_first_last=False)).values()) == {None}


SIZES = (16, 512, 1008, 1024, 1040, 2048, 2064, 4096, 4112, 8192)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_size_heuristic_agrees_with_torchao_on_every_shape(recipe):
    """too_small() against torchao 0.18.0's own `_auto_filter_for_recipe` (True = convert)."""
    from torchao.float8 import _auto_filter_for_recipe

    torchao_filter = _auto_filter_for_recipe(recipe, filter_fqns=[])
    for k, n in itertools.product(SIZES, SIZES):
        lin = nn.Linear(k, n, bias=False, device="meta")
        assert too_small(recipe, k, n) is (not torchao_filter(lin, "x")), (recipe, k, n)


def test_size_heuristic_known_shapes():
    # tensorwise: small when K <= 4096 and N <= 1024 (weight (N, K) = (out, in))
    assert too_small("tensorwise", 4096, 1024) and not too_small("tensorwise", 4096, 1040)
    assert not too_small("tensorwise", 4112, 16)
    # rowwise: N <= 2048, K <= 1024, or N <= 4096 and K <= 2048
    assert too_small("rowwise", 8192, 2048) and too_small("rowwise", 1024, 8192) and too_small("rowwise", 2048, 4096)
    assert not too_small("rowwise", 2064, 4096) and not too_small("rowwise", 1040, 4112)
    # torchao has no heuristic for rowwise_with_gw_hp: the rowwise thresholds apply
    for k, n in itertools.product(SIZES, SIZES):
        assert too_small("rowwise_with_gw_hp", k, n) == too_small("rowwise", k, n)


class EightBLike(nn.Module):
    """Llama-3-8B shapes on the meta device: dim 4096, GQA k/v 1024, ffn 14336, vocab 128256."""

    def __init__(self, n_layers=2):
        super().__init__()
        shapes = {"wq": (4096, 4096), "wk": (4096, 1024), "wv": (4096, 1024), "wo": (4096, 4096),
                  "w1": (4096, 14336), "w2": (14336, 4096), "w3": (4096, 14336)}
        self.layers = nn.ModuleList(
            nn.ModuleDict({k: nn.Linear(*s, bias=False, device="meta") for k, s in shapes.items()})
            for _ in range(n_layers))
        self.output = nn.Linear(4096, 128256, bias=False, device="meta")


def test_skip_small_on_8b_shapes_keeps_only_the_gqa_kv_projections_in_tensorwise():
    reasons = classify(EightBLike(), fp8_plan())
    kept = {fqn: r for fqn, r in reasons.items() if r}
    assert kept == {"layers.0.wq": KEEP_FIRST_LAST, "output": KEEP_FIRST_LAST,
                    "layers.0.wk": SMALL, "layers.0.wv": SMALL, "layers.1.wk": SMALL, "layers.1.wv": SMALL}
    rowwise = classify(EightBLike(), fp8_plan(torchao={"recipe": "rowwise"}))
    assert {fqn for fqn, r in rowwise.items() if r == SMALL} == {"layers.0.wk", "layers.0.wv", "layers.1.wk", "layers.1.wv"}


def test_builtin_llama_debug_is_all_small_for_torchao_heuristics():
    """The builtin debug model (dim 256): every Linear is below torchao's tensorwise threshold except
    the 2048-wide output, which keep_first_last keeps; so skip_small leaves nothing in FP8."""
    llama = pytest.importorskip("launcher.train.models.llama")
    with torch.device("meta"):
        model = llama.Llama(llama.SIZES["llama-debug"])
    reasons = classify(model, fp8_plan())
    assert len(reasons) == 29
    assert reasons["output"] == KEEP_FIRST_LAST and reasons["layers.0.attention.wq"] == KEEP_FIRST_LAST
    assert sum(r == SMALL for r in reasons.values()) == 27
    assert sum(r is None for r in classify(model, fp8_plan(torchao={"skip_small": False})).values()) == 27


def test_filter_is_torchaos_module_filter_fn_and_agrees_with_classify():
    model = TinyLlama(vocab=250)
    plan = fp8_plan(keep=["layers.1.attention.*"], torchao={"skip_small": False})
    keep_fn = fp8_filter(plan, model)
    reasons = classify(model, plan)
    for fqn, mod in select.linears(model):
        assert keep_fn(mod, fqn) is (reasons[fqn] is None)
    assert keep_fn(nn.ReLU(), "layers.0.relu") is False
    assert sum(reasons[f] is None for f in reasons) == 9


def test_filter_without_model_refuses_keep_first_last_instead_of_ignoring_it():
    with pytest.raises(ValueError, match="keep_first_last"):
        fp8_filter(fp8_plan())
    keep_fn = fp8_filter(fp8_plan(keep_first_last=False, keep=["output"], torchao={"skip_small": False}))
    assert keep_fn(nn.Linear(64, 64), "layers.0.attention.wq") is True
    assert keep_fn(nn.Linear(64, 64), "output") is False
    assert keep_fn(nn.Linear(64, 60), "layers.0.attention.wq") is False


def test_single_linear_model_first_is_last():
    model = nn.Sequential(nn.Linear(32, 32))
    assert classify(model, fp8_plan(torchao={"skip_small": False})) == {"0": KEEP_FIRST_LAST}


def test_multihead_attention_out_proj_is_never_counted_as_fp8():
    """Its weight goes to F.multi_head_attention_forward: converting the module would run nothing in FP8."""
    from torch import nn

    from launcher.train.precision.select import FUNCTIONAL, classify
    from tests.train._precision import fp8_plan

    model = nn.ModuleDict({"attn": nn.MultiheadAttention(64, 4, batch_first=True), "a": nn.Linear(64, 64), "b": nn.Linear(64, 64),
                           "c": nn.Linear(64, 64)})
    reasons = classify(model, fp8_plan(torchao={"skip_small": False}))
    assert reasons == {"attn.out_proj": FUNCTIONAL, "a": "keep_first_last", "b": None, "c": "keep_first_last"}


def test_kept_blocks_hold_every_linear_of_the_first_and_last_blocks_after_keep_first_last():
    from launcher.planning.selection import KEEP_FIRST_BLOCKS, KEEP_LAST_BLOCKS

    reasons = classify(TinyLlama(), fp8_plan(keep_first_blocks=1, torchao={"skip_small": False}))
    assert {fqn: r for fqn, r in reasons.items() if r} == {
        **{f"layers.0.{n}": KEEP_FIRST_BLOCKS for n in ("attention.wk", "attention.wv", "attention.wo",
                                                       "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")},
        "layers.0.attention.wq": KEEP_FIRST_LAST, "output": KEEP_FIRST_LAST}
    last = classify(TinyLlama(), fp8_plan(keep_first_last=False, keep_last_blocks=1, torchao={"skip_small": False}))
    assert {fqn for fqn, r in last.items() if r == KEEP_LAST_BLOCKS} == {f for f in TINY_ORDER if f.startswith("layers.1.")}
    assert last["output"] is None  # the head is in no block
    both = classify(TinyLlama(), fp8_plan(keep_first_blocks=1, keep_last_blocks=1, keep_first_last=False, torchao={"skip_small": False}))
    assert [fqn for fqn, r in both.items() if r is None] == ["output"]
    flt = fp8_filter(fp8_plan(keep_first_blocks=1, torchao={"skip_small": False}), TinyLlama())
    model = TinyLlama()
    assert [fqn for fqn, m in model.named_modules() if flt(m, fqn)] == [f for f in TINY_ORDER if f.startswith("layers.1.")]


def test_kept_blocks_on_a_model_without_blocks_stop_instead_of_converting_them():
    from launcher.errors import LauncherError

    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
    with pytest.raises(LauncherError, match="keep_first_blocks / keep_last_blocks ask to keep blocks of a Sequential"):
        classify(model, fp8_plan(keep_last_blocks=1))


def test_keep_and_rule_globs_that_name_no_layer_of_the_built_model_are_reported_grouped_experts_included():
    """For py: models (planning cannot see their names) the run reports both kinds; an MoE's expert groups count as layers."""
    from launcher.planning.models import parse_builtin
    from launcher.train.models.moe import MoETransformer

    plan = fp8_plan(keep=["attention.wk", "*.feed_forward.w2"], rules=[{"match": "*.mlp.w9", "mode": "bf16"}],
                    torchao={"skip_small": False})
    assert select.unmatched_rules(TinyLlama(), plan) == {"PRECISION-RULE-UNMATCHED": ["*.mlp.w9"],
                                                         "PRECISION-KEEP-UNMATCHED": ["attention.wk"]}
    moe = MoETransformer(parse_builtin("builtin:moe-debug"))
    plan = fp8_plan(keep=["layers.0.moe.experts"], rules=[{"match": "*.moe.experts", "recipe": "mxfp8"}], torchao={"skip_small": False})
    assert select.unmatched_rules(moe, plan) == {}
