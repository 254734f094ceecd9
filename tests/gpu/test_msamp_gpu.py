"""MS-AMP for real: needs a CUDA GPU and MS-AMP (built from source).

Proof that FP8 ran, not only a finite loss: the converted weights are MS-AMP ScalingParameters holding 1-byte
values, the output differs measurably from the same model's high-precision output on the same batch, the loss
falls; and the optimizer fp8launch builds takes exactly the keywords fp8launch passes (the CPU stand-in checks
the same against MS-AMP's recorded signature: tests/train/test_te_msamp_standin.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("msamp") is None, reason="MS-AMP is not installed"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _plan(opt_level):
    from train._precision import make_plan

    return make_plan(precision={"mode": "fp8", "backend": "msamp", "msamp": {"opt_level": opt_level}},
                     distributed={"strategy": "ddp", "procs_per_node": 1})


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_the_installed_optimizer_takes_fp8launchs_arguments(opt_level):
    import msamp

    from launcher.train.precision.msamp import msamp_optimizer_args
    from one_gpu import signature_gaps
    from train.test_te_msamp_standin import MSAMP_OPTIMIZER_ARGS

    name, kwargs = msamp_optimizer_args(_plan(opt_level))
    cls = getattr(msamp.optim, name)
    assert signature_gaps(kwargs, cls) == set()
    assert signature_gaps(MSAMP_OPTIMIZER_ARGS["LBAdamW"], msamp.optim.LBAdamW) == set()  # the record is still true


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_msamp_trains_in_fp8(opt_level):
    from msamp.nn import ScalingParameter

    from launcher.train.precision import apply_precision
    from train._precision import TinyLlama, lm_loss

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = TinyLlama().to(device)
    twin = TinyLlama().to(device)
    twin.load_state_dict(model.state_dict())
    prec = apply_precision(model, _plan(opt_level), device)
    model, opt = prec.wrap_optimizer(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
    assert prec.report.fp8_layers == 13 and "planned" not in prec.report.line()
    w = model.layers[1].feed_forward.w1.weight
    assert isinstance(w, ScalingParameter) and w.value.element_size() == 1  # stored in one byte
    tokens = torch.randint(0, 256, (4, 65), device=device, generator=torch.Generator(device).manual_seed(0))
    with torch.no_grad(), prec.autocast():
        fp8 = model(tokens[:, :-1]).float()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        high = twin(tokens[:, :-1]).float()
    rel = ((fp8 - high).norm() / high.norm()).item()
    assert 1e-4 < rel < 0.2, rel
    losses = []
    for _ in range(30):
        with prec.autocast():
            loss = lm_loss(model, tokens)
        loss.backward()
        prec.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses
