"""torchao FP8 really ran, on the CPU (torch's _scaled_mm has a CPU kernel) and on a GPU, by the same assertions: every
converted Linear runs its three GEMMs (forward, grad_input, grad_weight) as torch._scaled_mm, counted by the profiler;
the output differs measurably (and no more than FP8 rounding) from the same model's high-precision output on the
same batch; the loss falls. (Transformer Engine's proof: tests/gpu/test_te_gpu.py and test_te_conformance.py.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="no FP8 CUDA GPU")]),
]


def _setup(device_name):
    from train._precision import TinyLlama, fp8_plan

    from launcher.train.precision import apply_precision

    device = torch.device(device_name)
    torch.manual_seed(0)
    model = TinyLlama(dim=128, hidden=384, vocab=512).to(device)
    twin = TinyLlama(dim=128, hidden=384, vocab=512).to(device)
    twin.load_state_dict(model.state_dict())
    prec = apply_precision(model, fp8_plan(torchao={"recipe": "tensorwise", "skip_small": False}), device)
    g = torch.Generator(device).manual_seed(0)
    tokens = torch.randint(0, 512, (4, 65), device=device, generator=g)
    return model, twin, prec, tokens


@pytest.mark.parametrize("device_name", DEVICES)
def test_torchao_runs_every_converted_gemm_as_scaled_mm(device_name):
    from train._precision import lm_loss

    model, _, prec, tokens = _setup(device_name)
    assert prec.report.fp8_layers == 13
    with torch.profiler.profile() as prof:
        with prec.autocast():
            loss = lm_loss(model, tokens)
        loss.backward()
    scaled = sum(1 for e in prof.events() if e.name == "aten::_scaled_mm")
    assert scaled == 3 * prec.report.fp8_layers, scaled


@pytest.mark.parametrize("device_name", DEVICES)
def test_torchao_output_differs_from_its_high_precision_twin_and_trains(device_name):
    from train._precision import lm_loss

    model, twin, prec, tokens = _setup(device_name)
    with torch.no_grad(), prec.autocast():
        fp8 = model(tokens[:, :-1]).float()
    with torch.no_grad(), torch.autocast(tokens.device.type, dtype=torch.bfloat16):
        high = twin(tokens[:, :-1]).float()
    rel = ((fp8 - high).norm() / high.norm()).item()
    assert 1e-4 < rel < 0.2, rel
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        with prec.autocast():
            loss = lm_loss(model, tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4]), losses
