"""Transformer Engine for real: needs a CUDA GPU with compute capability >= 8.9 and TE installed.

Proof that FP8 ran, not only a finite loss: TE modules in place, the delayed-scaling amax history filled and its
scales moved, the output measurably different from the same model's high-precision output on the same batch,
the loss falling; and a delayed- and a current-scaling run resumed from a checkpoint continue as the
uninterrupted run (tests/train/test_te_resume.py runs the same with the stand-in on the CPU).
"""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is None, reason="Transformer Engine is not installed"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture(autouse=True)
def fp8_gpu():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability >= 8.9")


def _plan(recipe, **te):
    from train._precision import make_plan

    return make_plan(precision={"mode": "fp8", "backend": "te", "te": {"recipe": recipe, **te}},
                     distributed={"strategy": "ddp", "procs_per_node": 1})


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_te_runs_fp8_gemms_that_move_the_output_and_train(recipe):
    import transformer_engine.pytorch as te

    from tests.train._fp8_twin import train_losses, twins
    from tests.train._precision import TinyLlama

    device = torch.device("cuda")
    t = twins(TinyLlama(seed=0).to(device), _plan(recipe), device)
    model, prec = t.model, t.precision
    assert prec.report.fp8_layers == 13
    assert sum(isinstance(m, te.Linear) for m in model.modules()) == 13
    tokens = torch.randint(0, 256, (4, 65), device=device, generator=torch.Generator(device).manual_seed(0))
    rel = t.logits_gap(tokens[:, :-1])
    assert 1e-4 < rel < 0.2, rel  # FP8 rounding is visible, and no more than rounding

    losses = train_losses(model, prec, tokens, 30)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses  # one batch, 30 steps: it must fit
    if recipe == "delayed":
        lin = model.layers[1].feed_forward.w1
        (scale_fwd, hist_fwd), (scale_bwd, hist_bwd) = lin.get_fp8_meta_tensors().values()
        assert hist_fwd.abs().sum() > 0 and hist_bwd.abs().sum() > 0
        assert (scale_fwd[:2] != 1).all() and (scale_bwd[:1] != 1).all()


def _run(tmp_path, name, **keys):
    from train._engine_setup import make_plan, train_in_process

    out = tmp_path / name
    _, plan_dir = make_plan(tmp_path / f"plan-{name}", **{
        "launch.device": "cuda", "distributed.procs_per_node": 1, "distributed.strategy": "ddp",
        "train.model": "builtin:llama-debug?layers=2",
        "train.seq_len": 64, "train.micro_batch_size": 4, "train.steps": 8, "train.checkpoint_every": 4, "train.lr": 3e-3,
        "precision.mode": "fp8", "precision.backend": "te", "precision.keep_first_last": False, "train.output_dir": str(out), **keys})
    train_in_process(f"{plan_dir}/plan.json", stream=io.StringIO())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["event"] == "step"}, out


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_a_resumed_te_run_continues_as_the_uninterrupted_one(tmp_path, recipe, monkeypatch):
    monkeypatch.delenv("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", raising=False)  # no unsafe opt-in: none is needed
    keys = {"precision.te.recipe": recipe, "precision.te.amax_history_len": 4}
    ref, out = _run(tmp_path, "ref", **keys)
    step4 = out / "checkpoints" / "step-4"
    saved = torch.load(step4 / "rank-00000.pt", weights_only=True)
    assert bool(saved["te_scaling"]) == (recipe == "delayed")
    resumed, _ = _run(tmp_path, "resumed", **keys, **{"train.resume": str(step4)})
    after = {s: v for s, v in ref.items() if s > 4}
    assert resumed.keys() == after.keys()
    # the same kernels on the same inputs; a non-deterministic attention backward may move the last bits
    torch.testing.assert_close(torch.tensor(list(resumed.values())), torch.tensor(list(after.values())), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_fp8_weights_train_checkpoint_and_resume(tmp_path, strategy):
    """precision.te.fp8_params for real: FP8 weights, FusedAdam's fp32 master copy (FSDP2 all-gathering the FP8 weights),
    the loss falling, and a checkpoint (FP8 weights and the master copy through DCP) that resumes as the run continues."""
    keys = {"precision.te.recipe": "current", "precision.te.fp8_params": True, "distributed.strategy": strategy}
    ref, out = _run(tmp_path, "ref", **keys)
    start = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert start["effects"]["fp8_weights"]["master"] == "float32" and start["effects"]["optimizer"] == "FusedAdam"
    if strategy == "fsdp2":
        assert start["effects"]["all_gather_dtype"] == "float8_e4m3fn"
    assert sum(list(ref.values())[-2:]) < sum(list(ref.values())[:2])
    resumed, _ = _run(tmp_path, "resumed", **keys, **{"train.resume": str(out / "checkpoints" / "step-4")})
    after = {s: v for s, v in ref.items() if s > 4}
    torch.testing.assert_close(torch.tensor(list(resumed.values())), torch.tensor(list(after.values())), rtol=1e-4, atol=1e-4)
