"""FLOPs per token against hand computations, Linear shares, and the peak-TFLOP/s table."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from launcher.planning.gpus import PEAK_TFLOPS, peak_tflops
from launcher.train.flops import flops_per_token, linear_macs
from launcher.train.models.llama import SIZES, Llama

DEBUG = SIZES["llama-debug"]
# llama-debug by hand: dim 256, 4 layers, 8 heads of 32, 4 kv heads (128 wide), ffn 768, vocab 2048.
PER_LAYER = 256 * 256 + 256 * 128 + 256 * 128 + 256 * 256 + 3 * 256 * 768  # wq wk wv wo w1 w2 w3
LINEAR = 4 * PER_LAYER + 256 * 2048  # + output head; the embedding is a lookup
assert (PER_LAYER, LINEAR) == (786_432, 3_670_016)


@pytest.fixture(scope="module")
def debug_model():
    torch.manual_seed(0)
    return Llama(DEBUG)


def test_debug_flops_per_token_by_hand(debug_model):
    expected = 6 * LINEAR + 12 * 4 * 256 * 128
    assert expected == 23_592_960
    assert flops_per_token(DEBUG, 128) == expected
    assert flops_per_token(debug_model, 128) == expected  # the module path agrees with the config path


def test_8b_flops_per_token_matches_the_usual_estimate():
    # 6N (N without embeddings) + attention: ~48.3 GFLOP/token at 2048 for Llama 3 8B.
    cfg = SIZES["llama3-8b"]
    non_embedding = 8_030_261_248 - 128256 * 4096 - (32 * 2 + 1) * 4096  # minus embedding and norms
    assert flops_per_token(cfg, 2048) == 6 * non_embedding + 12 * 32 * 4096 * 2048


def test_linear_macs_and_fp8_share(debug_model):
    macs = linear_macs(debug_model)
    assert len(macs) == 29
    assert macs["layers.0.attention.wk"] == 256 * 128
    assert macs["layers.3.feed_forward.w2"] == 768 * 256
    assert macs["output"] == 256 * 2048
    assert sum(macs.values()) == LINEAR


def test_any_module_counts_linears_and_finds_layers_from_blocks_and_embedding():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 32)
            self.layers = nn.ModuleList(nn.Linear(32, 64) for _ in range(3))
            self.head = nn.Linear(64, 50, bias=True)

    assert flops_per_token(Net(), 10) == 6 * (3 * 32 * 64 + 64 * 50) + 12 * 3 * 32 * 10
    assert flops_per_token(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)), 10) == 6 * (8 * 16 + 16 * 4)  # no attention found


def test_hugging_face_model_uses_its_config():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=96, tie_word_embeddings=True,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    # The tied head is still a GEMM, so it counts.
    assert flops_per_token(model, 16) == 6 * (2 * per_layer + 64 * 96) + 12 * 2 * 64 * 16


@pytest.mark.parametrize(
    "name, dtype, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H100 80GB HBM3", "fp8", 1979.0),
        ("NVIDIA H100 PCIe", "bfloat16", 756.0),
        ("NVIDIA H200", "fp8", 1979.0),
        ("NVIDIA GH200 480GB", "bf16", 989.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100-SXM4-80GB", "fp8", None),  # no FP8 on Ampere
        ("NVIDIA L40S", "bf16", 362.0),
        ("NVIDIA L4", "fp8", 242.0),
        ("NVIDIA B200", "fp8", 4500.0),
        ("cpu", "bf16", None),
        ("Some Future GPU", "bf16", None),
    ],
)
def test_peak_tflops(name, dtype, peak):
    assert peak_tflops(name, dtype) == peak


def test_peak_table_is_dense_fp8_twice_bf16():
    for name, peaks in PEAK_TFLOPS.items():
        if "fp8" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=0.02), name  # L40S: 733 vs 362.05 on its datasheet
