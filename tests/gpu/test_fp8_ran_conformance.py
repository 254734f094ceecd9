"""torchao FP8 really ran, on the CPU (torch's _scaled_mm has a CPU kernel) and on a GPU, by the same assertions: every
converted Linear runs its three GEMMs (forward, grad_input, grad_weight) as torch._scaled_mm, counted by the profiler;
the output differs measurably (and no more than FP8 rounding) from the same model's high-precision output on the
same batch; the loss falls. (Transformer Engine's proof: tests/gpu/test_te_gpu.py and test_te_conformance.py.)"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9), reason="no FP8 CUDA GPU")]),
]


def _setup(device_name):
    from tests.train._fp8_twin import twins
    from tests.train._precision import TinyLlama, fp8_plan

    device = torch.device(device_name)
    model = TinyLlama(dim=128, hidden=384, vocab=512, seed=0).to(device)
    t = twins(model, fp8_plan(torchao={"recipe": "tensorwise", "skip_small": False}), device)
    tokens = torch.randint(0, 512, (4, 65), device=device, generator=torch.Generator(device).manual_seed(0))
    return t, tokens


@pytest.mark.parametrize("device_name", DEVICES)
def test_torchao_runs_every_converted_gemm_as_scaled_mm(device_name):
    from tests.train._fp8_twin import scaled_mm_calls
    from tests.train._precision import lm_loss

    t, tokens = _setup(device_name)
    assert t.precision.report.fp8_layers == 13
    if device_name == "cuda":  # torchao's Triton min/max patch is left to torchao there (skipped on CPU only)
        from torch._inductor.codegen.triton import TritonOverrides

        assert TritonOverrides.minimum("a", "b").startswith("tl.where(")

    def step():
        with t.precision.autocast():
            loss = lm_loss(t.model, tokens)
        loss.backward()

    assert scaled_mm_calls(step) == 3 * t.precision.report.fp8_layers


@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
@pytest.mark.parametrize("device_name", DEVICES)
def test_torchao_output_differs_from_its_high_precision_twin_and_trains(device_name):
    from tests.train._fp8_twin import train_losses

    t, tokens = _setup(device_name)
    rel = t.logits_gap(tokens[:, :-1])
    assert 1e-4 < rel < 0.2, rel
    losses = train_losses(t.model, t.precision, tokens, 20)
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4]), losses
