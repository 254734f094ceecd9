"""GPU acceptance: every committed spec that fits one GPU runs 5 steps through the real entrypoint
(`fp8launch run`, torchrun, one process), with ?layers=2; a torchao matrix on top (FSDP2 and DDP,
compile, activation checkpointing, each recipe, float8 all-gather); checkpoint and resume; and the
Transformer Engine / MS-AMP argument tables against the installed libraries' real signatures.

Needs a CUDA GPU: everything here skips without one. The parts that are plain functions
(tests/gpu/one_gpu.py) are exercised on CPU by tests/test_gpu_acceptance.py.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from tests.gpu.one_gpu import (
    STEPS,
    TWIN_FIRST_LOSS_GAP,
    TWIN_LOSS_GAP,
    expected_scaled_mm,
    fits,
    losses_with_bf16_twin,
    planned,
    recipe_field_gaps,
    run,
    scaled_mm_per_step,
    signature_gaps,
    variants,
)

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]
VARIANTS = variants("cuda")


def _gpu_gib() -> float:
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def _check_fits(variant, tmp_path):
    plan = planned(variant, str(tmp_path / "plan"))
    ok, why = fits(plan, _gpu_gib())
    if not ok:
        pytest.skip(why)
    if plan.precision.mode == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability >= 8.9")
    return plan


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_spec_trains_5_steps_on_one_gpu(variant, tmp_path):
    """Each spec trains, and its FP8 ran by its ops: step 3, profiled, makes the torch._scaled_mm calls its FP8
    layers must (expected_scaled_mm: 3 per layer and micro-batch for torchao's tensorwise and rowwise), none in bf16."""
    plan = _check_fits(variant, tmp_path)
    r, records = run(variant, tmp_path / "out", profile=1)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    steps = [rec for rec in records if rec.get("event") == "step"]
    assert len(steps) == STEPS and all(math.isfinite(rec["loss"]) for rec in steps)
    start = next(rec for rec in records if rec.get("event") == "start")
    assert start["device"] == "cuda" and start["world_size"] == 1
    assert (start["fp8_layers"] > 0) == plan.precision.fp8
    assert next(rec for rec in records if rec.get("event") == "end").get("profile_error") is None
    expected = expected_scaled_mm(plan, start["fp8_layers"])
    if expected is not None:
        assert expected[0] <= scaled_mm_per_step(tmp_path / "out") <= expected[1], expected


def test_an_fp8_spec_trains_as_its_bf16_twin(tmp_path):
    """cpu-smoke (torchao tensorwise, llama-debug) on the GPU against the same spec in bf16: FP8 moves the first loss,
    and no step's loss by more than FP8 rounding does (one_gpu.TWIN_LOSS_GAP)."""
    variant = next(v for v in VARIANTS if v.name == "cpu-smoke")
    _check_fits(variant, tmp_path)
    fp8, bf16 = losses_with_bf16_twin(variant, tmp_path)
    assert len(fp8) == len(bf16) == STEPS
    assert abs(fp8[0] - bf16[0]) > TWIN_FIRST_LOSS_GAP, (fp8, bf16)
    assert max(abs(a - b) for a, b in zip(fp8, bf16)) < TWIN_LOSS_GAP, (fp8, bf16)


def test_checkpoint_and_resume_on_one_gpu(tmp_path):
    variant = next(v for v in VARIANTS if "+" not in v.name and v.data.get("precision", {}).get("backend", "torchao") == "torchao"
                   and v.data.get("precision", {}).get("mode") == "fp8")
    _check_fits(variant, tmp_path)
    out = tmp_path / "out"
    first, records = run(variant, out, "train.checkpoint_every=3")
    assert first.returncode == 0, first.stderr[-4000:]
    again, records = run(variant, out, "train.checkpoint_every=3", f"train.steps={STEPS + 3}", 'train.resume="auto"')
    assert again.returncode == 0, again.stderr[-4000:]
    start = [rec for rec in records if rec.get("event") == "start"][-1]
    assert start["resumed_from"] and start["start_step"] == STEPS
    assert [rec["step"] for rec in records if rec.get("event") == "step"][-3:] == [STEPS + 1, STEPS + 2, STEPS + 3]


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None, reason="Transformer Engine is not installed")
def test_te_argument_tables_match_the_installed_library():
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe

    from tests.train.te_2_20 import TE_MODULE_ARGS, TE_RECIPE_FIELDS

    for name, args in TE_MODULE_ARGS.items():
        assert not signature_gaps(args, getattr(te, name)), (name, signature_gaps(args, getattr(te, name)))
    for name, fields in TE_RECIPE_FIELDS.items():
        cls = getattr(te_recipe, name, None)
        if cls is not None:  # recipes newer than the installed TE are refused by TE-RECIPE-HARDWARE / check_support
            assert not recipe_field_gaps(fields, cls), (name, recipe_field_gaps(fields, cls))
    assert callable(getattr(getattr(te, "distributed", None), "checkpoint", None) or getattr(te, "checkpoint", None))


@pytest.mark.skipif(importlib.util.find_spec("msamp") is None, reason="MS-AMP is not installed")
def test_msamp_initialize_arguments_match_the_installed_library():
    import msamp

    from launcher.train.precision.msamp import msamp_init_args, msamp_optimizer_args
    from tests.train._precision import make_plan

    for level in ("O1", "O2"):
        args = msamp_init_args(make_plan(precision={"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": level}}))
        assert not signature_gaps(args, msamp.initialize), signature_gaps(args, msamp.initialize)
        for optimizer in ("adamw", "adam"):  # the optimizer wrap_optimizer builds instead of handing torch's to msamp.initialize
            name, kwargs = msamp_optimizer_args(make_plan(precision={"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": level}},
                                                          distributed={"strategy": "ddp"}, train={"optimizer": optimizer}))
            cls = getattr(msamp.optim, name)
            assert not signature_gaps(kwargs, cls), signature_gaps(kwargs, cls)
