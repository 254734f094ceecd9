"""launcher/planning/rules/te_attention.py: where Transformer Engine 2.20.2 has a backend to train FP8 attention, each row one of
TE's rules (attention/dot_product_attention/utils.py get_attention_backend; common/fused_attn/fused_attn.cpp). The
stand-in TE implements the same selection on its own (tests/train/test_te_standin.py) and tests/gpu/test_te_conformance.py
holds it and the real TE to these answers."""

from __future__ import annotations

import pytest

from launcher.planning.rules.te_attention import refusal

H100, B200, L40S, RTX_PRO = (9, 0), (10, 0), (8, 9), (12, 0)

HAS_A_BACKEND = [
    (H100, "delayed", 128, 128),  # sm90: training "bwd d=128 only"
    (B200, "delayed", 128, 128),
    (B200, "delayed", 32, 32),  # sm100: d <= 128, multiples of 16
    (B200, "current", 64, 64),  # current scaling from sm100
    (B200, "mxfp8", 128, 128),
    (B200, "delayed", 192, 128),  # cuDNN 9.21: d_qk = 192, d_v = 128
    ((10, 3), "current", 128, 128),
]
NO_BACKEND = [
    (H100, "delayed", 64, 64, "trains only head_dim 128"),
    (H100, "delayed", 32, 32, "trains only head_dim 128"),
    (H100, "delayed", 256, 256, "trains only head_dim 128"),  # forward-only would take d <= 256; training does not
    (H100, "current", 128, 128, "Float8CurrentScaling below sm100"),
    (H100, "mxfp8", 128, 128, "MXFP8BlockScaling below sm100"),
    (L40S, "delayed", 128, 128, "need sm90 or newer"),
    (RTX_PRO, "delayed", 128, 128, "disabled for FP8 on sm120"),
    (B200, "nvfp4", 128, 128, "NVFP4BlockScaling on every GPU"),
    (B200, "block", 128, 128, "Float8BlockScaling on every GPU"),
    (B200, "delayed", 24, 24, "multiples of 16"),
    (B200, "delayed", 256, 256, "head_dim_qk <= 192 and head_dim_v <= 128"),
    (B200, "delayed", 128, 192, "head_dim_qk <= 192 and head_dim_v <= 128"),
]


@pytest.mark.parametrize("capability,recipe,qk,v", HAS_A_BACKEND)
def test_fused_attention_trains_fp8_attention_here(capability, recipe, qk, v):
    assert refusal(capability, recipe, qk, v) == ""


@pytest.mark.parametrize("capability,recipe,qk,v,why", NO_BACKEND)
def test_no_backend_trains_fp8_attention_here(capability, recipe, qk, v, why):
    assert why in refusal(capability, recipe, qk, v)


def test_the_head_dims_are_named():
    assert refusal(H100, "delayed", 64) == "on sm90 FP8 FusedAttention trains only head_dim 128 (qk and v), not head_dim 64"
    assert refusal(B200, "delayed", 256, 128).endswith("not head_dim_qk 256, head_dim_v 128")
