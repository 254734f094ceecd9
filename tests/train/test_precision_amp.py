"""fp32 / bf16 / fp16 and the settings the FP8 backends share; the report and its start line."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from launcher.train.precision import PrecisionReport, apply_precision
from launcher.train.precision.amp import amp_settings
from launcher.train.precision.report import count

from ._precision import TinyLlama, fp8_plan, make_plan

CPU = torch.device("cpu")


def amp_plan(mode, strategy="ddp", **precision):
    return make_plan(precision={"mode": mode, **precision}, distributed={"strategy": strategy, "procs_per_node": 1})


def _linear_out_dtype(prec):
    with prec.autocast():
        return nn.Linear(8, 8)(torch.randn(2, 8)).dtype


def test_fp32_runs_without_autocast_or_scaler():
    prec = apply_precision(TinyLlama(), amp_plan("fp32"), CPU)
    assert _linear_out_dtype(prec) is torch.float32
    assert prec.param_dtype is None and prec.grad_scaler is None and prec.autocast_dtype is None
    assert prec.report.line() == "precision: fp32, no FP8: 15 Linear layers in fp32"
    assert (prec.report.backend, prec.report.recipe, prec.report.fp8_layers, prec.report.kept) == ("amp", "fp32", 0, ())


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_bf16_autocasts_and_sets_the_fsdp2_param_dtype(strategy):
    model = TinyLlama()
    prec = apply_precision(model, amp_plan("bf16", strategy), CPU)
    assert _linear_out_dtype(prec) is torch.bfloat16
    assert prec.param_dtype is torch.bfloat16 and prec.grad_scaler is None
    assert all(p.dtype is torch.float32 for p in model.parameters())  # weights stay fp32 (master copy)
    assert prec.report.line() == "precision: bf16 (autocast), no FP8: 15 Linear layers in bf16"


def test_fp16_uses_a_grad_scaler_and_fsdp2_the_sharded_one():
    ddp = apply_precision(TinyLlama(), amp_plan("fp16", "ddp"), CPU)
    assert type(ddp.grad_scaler) is torch.amp.GradScaler and ddp.grad_scaler.is_enabled()
    assert _linear_out_dtype(ddp) is torch.float16 and ddp.param_dtype is torch.float16
    fsdp = apply_precision(TinyLlama(), amp_plan("fp16", "fsdp2"), CPU)
    assert isinstance(fsdp.grad_scaler, ShardedGradScaler)
    assert "ShardedGradScaler" in fsdp.report.line()


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_deepspeed_casts_the_model_itself_no_autocast_no_scaler(mode):
    prec = apply_precision(TinyLlama(), amp_plan(mode, "deepspeed"), CPU)
    assert _linear_out_dtype(prec) is torch.float32
    assert prec.grad_scaler is None and prec.param_dtype is None
    assert prec.report.line().startswith(f"precision: {mode} (DeepSpeed casts the model")


def test_fp8_non_fp8_parts_use_high_precision_settings():
    s = amp_settings(fp8_plan(strategy="fsdp2", high_precision="fp16"), CPU)
    assert s["autocast_dtype"] is torch.float16 and isinstance(s["grad_scaler"], ShardedGradScaler)
    s = amp_settings(fp8_plan(high_precision="fp32"), CPU)
    assert s["autocast_dtype"] is None and s["param_dtype"] is None


def test_fp8_with_fp16_high_precision_gets_a_scaler_from_torchao_backend():
    prec = apply_precision(TinyLlama(), fp8_plan(high_precision="fp16", torchao={"skip_small": False}), CPU)
    assert type(prec.grad_scaler) is torch.amp.GradScaler
    assert _linear_out_dtype(prec) is torch.float16
    assert "kept in fp16: " in prec.report.line()


def test_clip_grad_norm_is_torchs():
    model = nn.Linear(4, 4)
    model(torch.ones(1, 4)).sum().mul(100).backward()
    prec = apply_precision(model, amp_plan("fp32"), CPU)
    total = prec.clip_grad_norm_(model.parameters(), 1.0)
    assert total > 1.0
    assert torch.cat([p.grad.flatten() for p in model.parameters()]).norm() == pytest.approx(1.0, rel=1e-4)


def test_report_line_example_from_the_brief():
    r = PrecisionReport(
        backend="torchao", recipe="tensorwise", fp8_layers=26, total_linear=28, fp8_flop_share=0.9712,
        kept=("layers.0.attention.wq (keep_first_last)", "output (keep_first_last)"), head="output")
    assert r.line() == ("precision: fp8 torchao tensorwise, 26 of 28 Linear layers in FP8, 97.1% of GEMM FLOPs; "
                        "kept in bf16: output (keep_first_last) and, beyond every Linear but the output layer (torchtitan's and Megatron's "
                        "default), layers.0.attention.wq (keep_first_last)")


def test_report_line_says_what_is_kept_beyond_the_fields_default_only_when_something_is():
    r = PrecisionReport(backend="torchao", recipe="tensorwise", fp8_layers=27, total_linear=28, fp8_flop_share=0.9,
                        kept=("output (keep 'output')",), head="output")
    assert r.line().endswith("; kept in bf16: output (keep 'output')")  # the field's default: nothing to say apart
    r = PrecisionReport(backend="torchao", recipe="tensorwise", fp8_layers=27, total_linear=28, fp8_flop_share=0.95,
                        kept=("layers.0.attention.wq (skip_small)",), head="output")
    assert r.line().endswith("; kept in bf16: layers.0.attention.wq (skip_small)")  # the output layer runs in FP8 here


def test_report_line_names_at_most_eight_kept_layers():
    kept = tuple(f"l{i} (skip_small)" for i in range(11))
    r = PrecisionReport(backend="torchao", recipe="rowwise", fp8_layers=1, total_linear=12, fp8_flop_share=0.5,
                        kept=kept, note="pad_inner_dim")
    assert r.line().endswith("kept in bf16: l0 (skip_small), l1 (skip_small), l2 (skip_small), l3 (skip_small), "
                             "l4 (skip_small), l5 (skip_small), l6 (skip_small), l7 (skip_small) and 3 more")
    assert r.line().startswith("precision: fp8 torchao rowwise (pad_inner_dim), 1 of 12 ")
    assert len(r.kept) == 11


def test_count_weights_flops_by_in_times_out_and_counts_backend_modules_that_are_not_linear():
    class FakeFP8(nn.Module):  # like te.Linear / MS-AMP FP8Linear: not an nn.Linear subclass
        def __init__(self, i, o):
            super().__init__()
            self.in_features, self.out_features = i, o

    model = nn.Sequential(nn.Linear(16, 32), FakeFP8(32, 96), nn.ReLU(), nn.Linear(96, 16))
    r = count(model, backend="te", recipe="delayed", mode="fp8", high_precision="bf16",
              is_fp8=lambda m: isinstance(m, FakeFP8), reasons={"0": "keep_first_last"})
    assert (r.fp8_layers, r.total_linear) == (1, 3)
    assert r.fp8_flop_share == pytest.approx(32 * 96 / (16 * 32 + 32 * 96 + 96 * 16))
    assert r.kept == ("0 (keep_first_last)", "3 (not converted)")
