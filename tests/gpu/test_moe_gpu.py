"""The builtin MoE's FP8 grouped GEMMs on a GPU: rowwise (torchao Float8TrainingOpConfig, torch._scaled_grouped_mm)
on compute capability >= 9.0 and MXFP8 (MXFP8TrainingOpConfig, SM100 kernels) on >= 10.0, each trained a few
steps beside bf16 from the same seed, with the final losses within 5% and the experts named FP8 in the layers
map. Skips without CUDA or without the capability. Not run yet (docs/moe.md)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available()
CAP = torch.cuda.get_device_capability() if CUDA else (0, 0)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]
STEPS = 8


def _train(model, precision, steps=STEPS):
    from launcher.train.models.moe import update_expert_bias

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(0)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, model.vocab_size, (4, 257), device="cuda", generator=g)
        with precision.autocast():
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        update_expert_bias(model)
        losses.append(loss.item())
    return losses


def _pair(recipe):
    from launcher.planning.models import parse_builtin
    from launcher.train.effects import layer_precisions
    from launcher.train.models.moe import MoETransformer
    from launcher.train.precision import apply_precision
    from tests.train._precision import fp8_plan, make_plan

    torch.manual_seed(0)
    with torch.device("cuda"):
        base = MoETransformer(parse_builtin("builtin:moe-debug"))
    fp8 = copy.deepcopy(base)
    bf16_p = apply_precision(base, make_plan(precision={"mode": "bf16"}, launch={"device": "cuda"}), torch.device("cuda"))
    plan = fp8_plan(torchao={"recipe": recipe}, keep_first_last=False)
    fp8_p = apply_precision(fp8, plan, torch.device("cuda"))
    assert layer_precisions(fp8, fp8_p)["layers.0.moe.experts"] == f"fp8 {recipe} (grouped, 8 experts)"
    assert layer_precisions(fp8, fp8_p)["layers.0.moe.router.gate"] == "bf16"
    return _train(base, bf16_p), _train(fp8, fp8_p)


@pytest.mark.skipif(CAP < (9, 0), reason="rowwise FP8 grouped GEMMs need compute capability >= 9.0")
def test_rowwise_grouped_experts_track_bf16():
    bf16, fp8 = _pair("rowwise")
    assert bf16[-1] < bf16[0] and abs(fp8[-1] / bf16[-1] - 1) < 0.05


@pytest.mark.skipif(CAP < (10, 0), reason="MXFP8 grouped GEMMs need compute capability >= 10.0")
def test_mxfp8_grouped_experts_track_bf16():
    bf16, fp8 = _pair("mxfp8")
    assert bf16[-1] < bf16[0] and abs(fp8[-1] / bf16[-1] - 1) < 0.05
