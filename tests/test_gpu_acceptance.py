"""The parts of the GPU acceptance (tests/gpu/test_specs_gpu.py) that need no GPU: every committed
spec cut to one GPU plans (the same code the GPU run starts with), the torchao matrix covers what
the issue lists, the fit decision reads the memory estimate, and the signature comparison finds a
keyword a library does not take. One variant really runs on CPU through the same runner (slow)."""

from __future__ import annotations

import math

import pytest

from tests.gpu.one_gpu import (
    MATRIX,
    SPECS,
    STEPS,
    TWIN_FIRST_LOSS_GAP,
    TWIN_LOSS_GAP,
    Variant,
    expected_scaled_mm,
    fits,
    losses_with_bf16_twin,
    one_gpu_sets,
    planned,
    run,
    scaled_mm_per_step,
    signature_gaps,
    variants,
)


def test_every_committed_spec_has_a_one_gpu_variant_that_plans(tmp_path):
    vs = variants("cuda")
    assert {v.name for v in vs if "+" not in v.name} == {p.stem for p in SPECS}
    for v in vs:
        plan = planned(v, str(tmp_path / v.name))
        assert plan.world_size == 1 and plan.train.steps == STEPS and plan.launch.device == "cuda", v.name
        assert plan.launch.launcher == "torchrun" and plan.train.seq_len <= 4096
        if plan.train.model.startswith("builtin:"):
            assert plan.train.model.endswith("layers=2"), plan.train.model


def test_the_torchao_matrix_covers_engines_compile_checkpointing_recipes_and_float8_all_gather(tmp_path):
    cells = {v.name.split("+")[1]: planned(v, str(tmp_path / v.name)) for v in variants("cuda") if "+" in v.name}
    assert set(cells) == set(MATRIX)
    assert {p.distributed.strategy for p in cells.values()} == {"fsdp2", "ddp"}
    assert {p.compile.enabled for p in cells.values()} == {True, False}
    assert cells["ac-full"].activation_checkpointing.mode == "full"
    assert {p.precision.torchao.recipe for p in cells.values()} == {"tensorwise", "rowwise", "rowwise_with_gw_hp"}
    assert cells["tensorwise-allgather"].precision.torchao.fsdp_float8_all_gather


def test_fit_reads_the_memory_estimate_and_the_installed_backends(tmp_path):
    v8b = next(v for v in variants("cuda") if v.name == "llama3-8b-torchao-fsdp2")
    plan = planned(v8b, str(tmp_path / "a"))
    assert fits(plan, 80.0) == (True, "")
    ok, why = fits(plan, 8.0)
    assert not ok and why.startswith("needs ") and why.endswith("the GPU has 8.0")
    te = next(v for v in variants("cuda") if v.name.startswith("te-"))
    assert fits(planned(te, str(tmp_path / "b")), 80.0) == (False, "transformer_engine is not installed")


def test_signature_gaps_names_what_the_library_does_not_take():
    class Linear:
        def __init__(self, in_features, out_features, bias=True, *, params_dtype=None):
            pass

    assert signature_gaps({"in_features", "bias", "params_dtype"}, Linear) == set()
    assert signature_gaps({"in_features", "device", "init_method"}, Linear) == {"device", "init_method"}
    assert signature_gaps({"anything"}, lambda **kw: None) == set()


def test_one_gpu_sets_keep_the_other_model_options():
    sets = one_gpu_sets({"train": {"model": "builtin:llama3-1b?vocab=512&layers=9", "seq_len": 8192}})
    assert 'train.model="builtin:llama3-1b?vocab=512&layers=2"' in sets and "train.seq_len=4096" in sets


@pytest.mark.slow
def test_the_runner_trains_a_variant_through_the_real_entrypoint_on_cpu(tmp_path):
    """The GPU acceptance's checks on the CPU: the profiled step makes 3 torch._scaled_mm calls per FP8 layer (4 with
    full activation checkpointing), and the run stays within FP8 rounding of its bf16 twin."""
    smoke = next(p for p in SPECS if p.stem == "cpu-smoke")
    variant = Variant("cpu-smoke", smoke, tuple(one_gpu_sets({"train": {"model": "builtin:llama-debug", "seq_len": 64}}, device="cpu")))
    r, records = run(variant, tmp_path / "out", timeout=300, profile=1)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [rec for rec in records if rec.get("event") == "step"]
    assert len(steps) == STEPS and all(math.isfinite(rec["loss"]) for rec in steps)
    layers = next(rec for rec in records if rec.get("event") == "start")["fp8_layers"]
    assert layers == 13
    assert expected_scaled_mm(planned(variant, str(tmp_path / "plan")), layers) == (39, 39)
    assert scaled_mm_per_step(tmp_path / "out") == 39
    ac = Variant("cpu-smoke+ac-full", smoke, variant.sets + ('activation_checkpointing.mode="full"',))
    r, records = run(ac, tmp_path / "ac", timeout=300, profile=1)
    assert r.returncode == 0, r.stderr[-3000:]
    assert expected_scaled_mm(planned(ac, str(tmp_path / "ac-plan")), layers) == (52, 52)
    assert scaled_mm_per_step(tmp_path / "ac") == 52  # each block's forward again in the backward
    fp8, bf16 = losses_with_bf16_twin(variant, tmp_path / "twin")
    assert abs(fp8[0] - bf16[0]) > TWIN_FIRST_LOSS_GAP and max(abs(a - b) for a, b in zip(fp8, bf16)) < TWIN_LOSS_GAP


def test_expected_scaled_mm_follows_the_recipe_checkpointing_and_backend(tmp_path):
    cells = {v.name.split("+")[1]: planned(v, str(tmp_path / v.name)) for v in variants("cuda") if "+" in v.name}
    assert expected_scaled_mm(cells["eager"], 13) == (39, 39)  # forward, input gradient, weight gradient
    assert cells["ac-full"].compile.enabled  # Inductor may drop recomputes the backward does not need: at least one stays
    assert expected_scaled_mm(cells["ac-full"], 13) == (40, 52)
    eager_ac = next(v for v in variants("cuda") if v.name.endswith("+ac-full"))
    eager_ac = Variant(eager_ac.name, eager_ac.spec, eager_ac.sets + ("compile.enabled=false",))
    assert expected_scaled_mm(planned(eager_ac, str(tmp_path / "e")), 13) == (52, 52)  # every forward again in the backward
    assert expected_scaled_mm(cells["rowwise_with_gw_hp"], 13) == (26, 26)  # the weight gradient in bf16
    assert expected_scaled_mm(planned(next(v for v in variants("cuda") if v.name == "bf16-baseline"), str(tmp_path / "b")), 0) == (0, 0)
    assert expected_scaled_mm(planned(next(v for v in variants("cuda") if v.name.startswith("te-")), str(tmp_path / "t")), 13) is None
