"""torchao float8 on CPU, for real: torch._scaled_mm has a CPU kernel in torch 2.13."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

import launcher.train.precision as precision_pkg
from launcher.errors import BackendMissing, EnvironmentProblem
from launcher.planning.install import INSTALL
from launcher.train.precision import apply_precision
from launcher.train.precision.torchao_fp8 import float8_config, float8_config_kwargs
from tests.support import skip_without_torch_mx

from ._fp8_twin import scaled_mm_calls, train_losses, twins
from ._precision import TinyLlama, fp8_plan, lm_loss

pytest.importorskip("torchao.float8")
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

CPU = torch.device("cpu")
RECIPES = ["tensorwise", "rowwise", "rowwise_with_gw_hp"]


def _fp8_linears(model):
    return sorted(fqn for fqn, m in model.named_modules() if isinstance(m, Float8Linear))


def test_converts_exactly_the_selected_linears_and_reports_them():
    model = TinyLlama()
    prec = apply_precision(model, fp8_plan(torchao={"skip_small": False}), CPU)
    converted = _fp8_linears(model)
    assert len(converted) == 13
    assert "output" not in converted and "layers.0.attention.wq" not in converted
    r = prec.report
    assert (r.backend, r.recipe, r.fp8_layers, r.total_linear) == ("torchao", "tensorwise", 13, 15)
    # per block 4 * 64*64 + 3 * 64*192 = 53248; two blocks + output 64*256 = 122880; FP8: all but wq0 and output
    assert r.fp8_flop_share == pytest.approx((122880 - 4096 - 16384) / 122880)
    assert r.kept == ("layers.0.attention.wq (keep_first_last)", "output (keep_first_last)")
    assert r.line() == ("precision: fp8 torchao tensorwise, 13 of 15 Linear layers in FP8, 83.3% of GEMM FLOPs; "
                        "kept in bf16: output (keep_first_last) and, beyond every Linear but the output layer (torchtitan's and Megatron's "
                        "default), layers.0.attention.wq (keep_first_last)")
    assert prec.param_dtype is torch.bfloat16 and prec.grad_scaler is None and not prec.fsdp_float8_all_gather


def _grads(model):
    return torch.cat([p.grad.flatten().float() for p in model.parameters()])


@pytest.mark.parametrize("recipe", RECIPES)
def test_fp8_gradients_are_close_to_bf16_and_really_fp8(recipe):
    """Relative error of all gradients (one vector) against the same model in bf16 autocast.

    Measured on this model (5 seeds, torch 2.13 CPU): tensorwise 0.059-0.064, rowwise
    0.046-0.048, rowwise_with_gw_hp 0.042-0.044, while bf16 itself is 0.007-0.008 from fp32.
    That is what FP8 rounding predicts: e4m3 keeps 3 mantissa bits (RMS relative rounding
    error 2^-4/sqrt(3) = 3.6% per element), and tensorwise's e5m2 gradients keep 2 (7.2%).
    The upper bound 0.10 leaves ~1.6x margin; the lower bound 0.02 (2.5x bf16's error)
    proves the GEMMs did not silently run in bf16.
    """
    ref = TinyLlama(seed=1)
    model = copy.deepcopy(ref)
    prec = apply_precision(model, fp8_plan(torchao={"recipe": recipe, "skip_small": False}), CPU)
    assert prec.report.fp8_layers == 13
    tokens = torch.randint(0, 256, (4, 65), generator=torch.Generator().manual_seed(1))
    with prec.autocast():
        loss = lm_loss(model, tokens)
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss = lm_loss(ref, tokens)
    ref_loss.backward()
    g, g_ref = _grads(model), _grads(ref)
    rel = ((g - g_ref).norm() / g_ref.norm()).item()
    assert 0.02 < rel < 0.10, rel
    assert abs(loss.item() - ref_loss.item()) < 0.01  # measured over seeds 0-5 x {AMX, AVX2}: 0.00002-0.00062
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_float8_linear_follows_cpu_autocast_dtype_like_on_gpu():
    model = TinyLlama()
    prec = apply_precision(model, fp8_plan(torchao={"skip_small": False}), CPU)
    x = torch.randn(2, 16, 64)
    fp8_layer = model.layers[0].attention.wk
    assert isinstance(fp8_layer, Float8Linear)
    with prec.autocast():
        assert fp8_layer(x).dtype is torch.bfloat16
    assert fp8_layer(x).dtype is torch.float32


def test_training_steps_run_every_converted_gemm_in_fp8_and_track_the_bf16_twin():
    """6 steps on one batch, against the same model in bf16 autocast. Measured over seeds 0-4 (torch 2.13 CPU):
    3 x 13 x 6 = 234 _scaled_mm calls every time (forward, grad_input, grad_weight of each FP8 layer); logits
    0.037-0.041 from the twin's; the first loss 0.0004-0.0014 from the twin's (bf16 against itself: 0), every
    loss within 0.0083 of it, and the loss falling by the twin's amount within 0.008. The bounds leave 2-4x."""
    t = twins(TinyLlama(seed=2), fp8_plan(torchao={"skip_small": False}), CPU)
    assert t.precision.report.fp8_layers == 13
    tokens = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(2))
    assert 0.02 < t.logits_gap(tokens[:, :-1]) < 0.08
    run = {}
    calls = scaled_mm_calls(lambda: run.setdefault("fp8", train_losses(t.model, t.precision, tokens, 6)))
    assert calls == 3 * t.precision.report.fp8_layers * 6
    fp8, bf16 = run["fp8"], train_losses(t.twin, t.twin_precision, tokens, 6)
    assert abs(fp8[0] - bf16[0]) > 1e-4
    assert max(abs(a - b) for a, b in zip(fp8, bf16)) < 0.02, (fp8, bf16)
    assert fp8[0] - fp8[-1] == pytest.approx(bf16[0] - bf16[-1], abs=0.02)
    assert fp8[0] - fp8[-1] > 1.0  # 1.37-1.41 in 6 steps


def test_every_layer_kept_raises_fp8_not_applied():
    model = TinyLlama()
    with pytest.raises(EnvironmentProblem) as e:
        apply_precision(model, fp8_plan(keep=["*"], torchao={"skip_small": False}), CPU)
    assert e.value.rule == "FP8-NOT-APPLIED" and e.value.exit_code == 3
    assert str(e.value).startswith("error[FP8-NOT-APPLIED]: ")
    # the message counts why each layer was kept and the fix names only the key that kept them
    n = sum(1 for m in TinyLlama().modules() if isinstance(m, torch.nn.Linear))
    assert f"All {n} layers were kept: {n} by precision.keep '*'; fix: remove '*' from precision.keep" in str(e.value)


def test_skip_small_on_a_small_model_raises_fp8_not_applied():
    with pytest.raises(EnvironmentProblem) as e:
        apply_precision(TinyLlama(), fp8_plan(), CPU)
    assert e.value.rule == "FP8-NOT-APPLIED" and "by precision.torchao.skip_small" in str(e.value)
    assert "fix: set precision.torchao.skip_small = false" in str(e.value)


def test_missing_torchao_raises_backend_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)
    model = TinyLlama()
    with pytest.raises(BackendMissing) as e:
        apply_precision(model, fp8_plan(torchao={"skip_small": False}), CPU)
    assert e.value.rule == "BACKEND-MISSING" and e.value.exit_code == 3
    assert f"{INSTALL['torchao']}" in str(e.value)
    assert not _fp8_linears(model)


def test_gpu_below_sm89_raises_fp8_hardware_before_touching_the_model(monkeypatch):
    monkeypatch.setattr(precision_pkg, "capability", lambda device: (8, 0))
    model = TinyLlama()
    with pytest.raises(EnvironmentProblem) as e:
        apply_precision(model, fp8_plan(torchao={"skip_small": False}), torch.device("cuda"))
    assert e.value.rule == "FP8-HARDWARE" and "this GPU has 8.0" in str(e.value)
    assert not _fp8_linears(model)


def test_fsdp_float8_all_gather_is_set_in_the_config_and_the_modules():
    plan = fp8_plan(strategy="fsdp2", torchao={"skip_small": False, "fsdp_float8_all_gather": True})
    assert float8_config_kwargs(plan) == {"enable_fsdp_float8_all_gather": True, "pad_inner_dim": False}
    assert float8_config(plan).enable_fsdp_float8_all_gather is True
    model = TinyLlama()
    prec = apply_precision(model, plan, CPU)
    assert prec.fsdp_float8_all_gather is True
    layer = model.layers[1].feed_forward.w1
    assert layer.config.enable_fsdp_float8_all_gather is True
    assert type(layer.weight).__name__ == "WeightWithDynamicFloat8CastTensor"
    assert "float8 all-gather" in prec.report.line()


def test_all_gather_flag_stays_off_outside_fsdp2_and_pad_inner_dim_passes_through():
    plan = fp8_plan(strategy="ddp", torchao={"fsdp_float8_all_gather": True, "pad_inner_dim": True})
    assert float8_config_kwargs(plan) == {"enable_fsdp_float8_all_gather": False, "pad_inner_dim": True}
    rowwise = float8_config(fp8_plan(torchao={"recipe": "rowwise"}))
    assert rowwise.round_scales_to_power_of_2 is True  # from_recipe_name's rowwise config is kept


@pytest.mark.parametrize("all_gather,precompute,calls", [(True, True, 1), (True, False, 0), (False, True, 0)])
def test_after_optimizer_step_precomputes_scales_only_with_all_gather(monkeypatch, all_gather, precompute, calls):
    import torchao.float8

    seen = []
    monkeypatch.setattr(torchao.float8, "precompute_float8_dynamic_scale_for_fsdp", seen.append)
    plan = fp8_plan(strategy="fsdp2", torchao={"skip_small": False, "fsdp_float8_all_gather": all_gather,
                                              "precompute_scale": precompute})
    model = TinyLlama()
    prec = apply_precision(model, plan, CPU)
    prec.after_optimizer_step(model)
    assert seen == [model] * calls


def test_torchao_drops_a_precomputed_scale_when_fsdp2_copies_an_offloaded_shard():
    """Why rule FP8-PRECOMPUTE-OFFLOAD refuses precompute_scale with FSDP2 cpu_offload: FSDP2 moves each offloaded
    shard with .to(device) before the float8 all-gather (FSDPParam.all_gather_inputs), and torchao's wrapper
    rebuilds itself on aten._to_copy without `_precomputed_scale` (torchao/float8/fsdp_utils.py), so every weight
    all-reduces its own amax again. If this starts to fail, torchao keeps the scale and the rule can go."""
    from torchao.float8.float8_linear import Float8LinearConfig
    from torchao.float8.float8_training_tensor import LinearMMConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    w = WeightWithDynamicFloat8CastTensor(torch.randn(8, 8), LinearMMConfig(), Float8LinearConfig().cast_config_weight.target_dtype,
                                          torch.tensor(3.0))
    assert w._precomputed_scale is not None
    moved = w.to("cpu", copy=True)  # what .to(device) does for a shard on another device: aten._to_copy
    assert isinstance(moved, WeightWithDynamicFloat8CastTensor) and moved._precomputed_scale is None


def test_precision_rules_mix_recipes_per_module_and_keep_by_mode_first_match_wins():
    """torchao converts each Linear on its own: feed-forward w2 rowwise, layer 1's w1 in MXFP8 (emulated on CPU), the
    attention of layer 1 kept by a mode rule, the rest tensorwise; the first matching entry decides a layer."""
    skip_without_torch_mx()
    rules = [{"match": "layers.1.attention.*", "mode": "bf16"}, {"match": "*.feed_forward.w2", "recipe": "rowwise"},
             {"match": "layers.1.feed_forward.w1", "recipe": "mxfp8"}, {"match": "layers.1.*", "recipe": "rowwise_with_gw_hp"}]
    model = TinyLlama()
    p = apply_precision(model, fp8_plan(torchao={"skip_small": False}, rules=rules), torch.device("cpu"))
    labels = {fqn: p.fp8_label(m) for fqn, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert labels == {
        "layers.0.attention.wq": None,  # keep_first_last (no rule matches it)
        "layers.0.attention.wk": "fp8 tensorwise", "layers.0.attention.wv": "fp8 tensorwise", "layers.0.attention.wo": "fp8 tensorwise",
        "layers.0.feed_forward.w1": "fp8 tensorwise", "layers.0.feed_forward.w2": "fp8 rowwise",
        "layers.0.feed_forward.w3": "fp8 tensorwise",
        "layers.1.attention.wq": None, "layers.1.attention.wk": None, "layers.1.attention.wv": None, "layers.1.attention.wo": None,
        "layers.1.feed_forward.w1": "fp8 mxfp8", "layers.1.feed_forward.w2": "fp8 rowwise",
        "layers.1.feed_forward.w3": "fp8 rowwise_with_gw_hp",
        "output": None,  # keep_first_last
    }
    assert p.report.fp8_layers == 9 and "layers.1.attention.wk (rule 'layers.1.attention.*': bf16)" in p.report.kept
    assert "2 in rowwise by precision.rules" in p.report.note and "1 in mxfp8 by precision.rules" in p.report.note
    tokens = torch.randint(0, 256, (2, 33))
    with p.autocast():
        loss = lm_loss(model, tokens)
    loss.backward()
    assert all(mod.weight.grad is not None for fqn, mod in model.named_modules() if labels.get(fqn))


def test_a_rule_mode_gives_layers_their_own_dtype_outside_autocast():
    """{ match = "*.feed_forward.w2", mode = "fp32" } in a bf16 FP8 run: those Linears stay out of FP8 and compute in
    fp32 (autocast would give bf16), their gradients flow; the others are unchanged."""
    from launcher.train.precision.module_dtype import dtype_of

    model = TinyLlama()
    plan = fp8_plan(torchao={"skip_small": False}, rules=[{"match": "*.feed_forward.w2", "mode": "fp32"}])
    p = apply_precision(model, plan, torch.device("cpu"))
    w2, w1 = model.get_submodule("layers.1.feed_forward.w2"), model.get_submodule("layers.1.feed_forward.w1")
    assert dtype_of(w2) == "fp32" and not isinstance(w2, Float8Linear) and isinstance(w1, Float8Linear)
    assert p.report.fp8_layers == 11 and "layers.1.feed_forward.w2 (rule '*.feed_forward.w2': fp32)" in p.report.kept
    outputs = {}
    for name in ("layers.1.feed_forward.w2", "layers.1.feed_forward.w3"):
        model.get_submodule(name).register_forward_hook(lambda m, a, out, name=name: outputs.__setitem__(name, out.dtype))
    with p.autocast():
        lm_loss(model, torch.randint(0, 256, (2, 33))).backward()
    assert outputs == {"layers.1.feed_forward.w2": torch.float32, "layers.1.feed_forward.w3": torch.bfloat16}
    assert w2.weight.grad is not None and w2.weight.grad.abs().sum() > 0


_CONVERT_IN_A_FRESH_PROCESS = """
import sys, torch
from launcher.train.precision import apply_precision
from tests.train._precision import TinyLlama, fp8_plan
from torchao.float8 import _inductor_patch
from torchao.float8.float8_linear import Float8Linear
model = TinyLlama()
apply_precision(model, fp8_plan(torchao={"skip_small": False}), torch.device("cpu"))
print(sum(isinstance(m, Float8Linear) for m in model.modules()), "torch._inductor.codegen.triton" in sys.modules,
      _inductor_patch._PATCHED)
"""


def test_a_cpu_conversion_finds_torchaos_triton_patch_marked_applied(monkeypatch):
    """torchao 0.18's convert_to_float8_training calls _patch_inductor_min_max_codegen, which returns at once where
    `_PATCHED` is set, before it imports Inductor's Triton code generator: on CPU fp8launch sets it for the conversion,
    then sets it back. (If torchao stopped calling it, `calls` would be empty and the skip would be dead code.)"""
    from torchao.float8 import _inductor_patch

    real, calls = _inductor_patch._patch_inductor_min_max_codegen, []

    def patch():
        calls.append(_inductor_patch._PATCHED)
        real()

    monkeypatch.setattr(_inductor_patch, "_PATCHED", False)
    monkeypatch.setattr(_inductor_patch, "_patch_inductor_min_max_codegen", patch)
    model = TinyLlama()
    apply_precision(model, fp8_plan(torchao={"skip_small": False}), CPU)
    assert calls == [True] and len(_fp8_linears(model)) == 13 and _inductor_patch._PATCHED is False


def test_a_cuda_conversion_after_a_cpu_one_in_the_same_process_still_gets_torchaos_patch(monkeypatch):
    """`_PATCHED` is the process's: a CPU conversion that left it set would keep torchao's Triton workaround from a CUDA
    conversion later in the same process. The CUDA conversion (its device only: the decision and the conversion need no
    GPU) finds the flag as it was and calls the patch to apply it; one that had applied it before keeps it applied."""
    from torchao.float8 import _inductor_patch

    from launcher.train.precision.torchao_fp8 import apply_torchao

    calls = []
    monkeypatch.setattr(_inductor_patch, "_PATCHED", False)
    monkeypatch.setattr(_inductor_patch, "_patch_inductor_min_max_codegen", lambda: calls.append(_inductor_patch._PATCHED))
    plan = fp8_plan(torchao={"skip_small": False})
    for device in (CPU, torch.device("cuda"), CPU):
        assert apply_torchao(TinyLlama(), plan, device).report.fp8_layers == 13
    assert calls == [True, False, True]  # the CUDA conversion's call would patch (the stand-in records, patches nothing)
    _inductor_patch._PATCHED = True  # as torchao's patch leaves it once applied
    apply_torchao(TinyLlama(), plan, CPU)
    assert _inductor_patch._PATCHED is True


@pytest.mark.slow  # a new process importing torch and torchao: ~6 s
def test_a_cpu_conversion_leaves_torchaos_triton_patch_and_its_import_out():
    """convert_to_float8_training imports Inductor's Triton code generator to patch it (torchao 0.18); on CPU the
    conversion is the same 13 Float8Linears without that import (in a fresh process: this one may hold it already)."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]  # where `tests` imports from
    out = subprocess.run([sys.executable, "-c", _CONVERT_IN_A_FRESH_PROCESS], cwd=repo, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["13", "False", "False"], out.stderr[-2000:]  # the flag set back after the conversion


def test_on_cuda_torchaos_triton_patch_is_left_to_torchao(monkeypatch):
    from torchao.float8 import _inductor_patch

    from launcher.train.precision.torchao_fp8 import skips_triton_codegen_patch, triton_codegen_patch_skipped

    monkeypatch.setattr(_inductor_patch, "_PATCHED", False)
    assert skips_triton_codegen_patch(torch.device("cuda")) is False and skips_triton_codegen_patch(CPU) is True
    with triton_codegen_patch_skipped(torch.device("cuda")) as skipped:
        assert skipped is False and _inductor_patch._PATCHED is False
    with pytest.raises(RuntimeError), triton_codegen_patch_skipped(CPU) as skipped:
        assert skipped is True and _inductor_patch._PATCHED is True
        raise RuntimeError("a conversion that fails")
    assert _inductor_patch._PATCHED is False  # set back even so
    monkeypatch.delattr(_inductor_patch, "_PATCHED")  # a torchao without the flag: its patch runs as it means to
    assert skips_triton_codegen_patch(CPU) is False
