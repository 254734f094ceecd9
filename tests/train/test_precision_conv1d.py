"""transformers' Conv1D (GPT-2) trains in FP8: replaced by the equivalent nn.Linear before the backend."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from launcher.errors import EnvironmentProblem
from launcher.train.precision import apply_precision
from launcher.train.precision.conv1d import foreign_matmuls, linearize

from ._precision import fp8_plan

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")


def gpt2(layers: int = 2) -> nn.Module:
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=layers, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def test_conv1d_becomes_an_equal_linear():
    from transformers.pytorch_utils import Conv1D

    model = gpt2()
    before = copy.deepcopy(model)
    convs = {fqn: m for fqn, m in before.named_modules() if isinstance(m, Conv1D)}
    assert len(convs) == 8  # c_attn, c_proj, mlp.c_fc, mlp.c_proj per block
    assert sorted(linearize(model)) == sorted(convs)
    for fqn, conv in convs.items():
        linear = model.get_submodule(fqn)
        assert type(linear) is nn.Linear and (linear.in_features, linear.out_features) == (conv.nx, conv.nf)
        assert torch.equal(linear.weight, conv.weight.t()) and torch.equal(linear.bias, conv.bias)
        assert linear.weight.data_ptr() != conv.weight.data_ptr()
    tokens = torch.randint(0, 128, (2, 16))
    torch.testing.assert_close(model(tokens).logits, before(tokens).logits, rtol=1e-5, atol=1e-5)


def test_gpt2_trains_in_fp8_with_torchao():
    model = gpt2()
    precision = apply_precision(model, fp8_plan(torchao={"skip_small": False}, keep_first_last=False), CPU)
    from torchao.float8.float8_linear import Float8Linear

    converted = sorted(fqn for fqn, m in model.named_modules() if isinstance(m, Float8Linear))
    assert len(converted) == 8 + 1 and "transformer.h.0.attn.c_attn" in converted and "lm_head" in converted
    assert precision.report.fp8_layers == 9
    tokens = torch.randint(0, 128, (2, 16))
    loss = model(tokens, labels=tokens).loss
    loss.backward()
    assert torch.isfinite(loss) and model.transformer.h[0].attn.c_attn.weight.grad.abs().sum() > 0


class Projection(nn.Module):
    """A matrix layer of the user's own that no backend knows."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / n_in**0.5)

    def forward(self, x):
        return x @ self.weight


def test_fp8_not_applied_names_the_module_type():
    model = nn.Sequential(nn.Embedding(16, 32), Projection(32, 32), nn.LayerNorm(32), Projection(32, 16))
    assert foreign_matmuls(model) == ["Projection"]
    with pytest.raises(EnvironmentProblem) as e:
        apply_precision(model, fp8_plan(torchao={"skip_small": False}, keep_first_last=False), CPU)
    assert e.value.rule == "FP8-NOT-APPLIED"
    assert "The model's matrix layers are Projection, not nn.Linear: no FP8 backend converts that module type" in str(e.value)
