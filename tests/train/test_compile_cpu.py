"""Compiled FP8 blocks on CPU: Inductor's AVX-512 kernels write wrong FP8 tiles in torch 2.13, so
compile_ac.cpu_vector_width holds CPU kernels to 256-bit vectors (compile_ac.py says what breaks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from launcher.train.compile_ac import CPU_SIMD_BITS, cpu_vector_width


class TwoLinears(nn.Module):
    """Two FP8 Linears in a row: the first one's output is the second one's FP8 input, cast and stored
    transposed for the second one's weight gradient (the tile AVX-512 gets wrong)."""

    def __init__(self, dim: int = 256):
        super().__init__()
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.wo(self.wq(x))


def _weight_grads(compile_: bool) -> dict[str, torch.Tensor]:
    from torchao.float8 import convert_to_float8_training  # here, not at collection: torchao takes seconds to import

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoLinears().to(torch.bfloat16)
    convert_to_float8_training(model)
    fn = torch.compile(model) if compile_ else model
    x = torch.randn(2, 64, 256, dtype=torch.bfloat16)
    fn(x).float().pow(2).mean().backward()
    return {name: p.grad.float() for name, p in model.named_parameters()}


@pytest.fixture
def simdlen():
    import torch._inductor.config as inductor

    saved = inductor.cpp.simdlen
    yield inductor.cpp
    inductor.cpp.simdlen = saved
    torch._dynamo.reset()


def test_compiled_fp8_weight_gradients_equal_eager_ones_at_256_bits(simdlen):
    """With the width held, the compiled block's weight gradients are finite and those of eager FP8 (the
    same casts, the same emulated GEMMs: measured bit-equal on a Sapphire Rapids; 2% allows another CPU's fused
    reductions)."""
    cpu_vector_width()
    assert simdlen.simdlen == CPU_SIMD_BITS == 256
    eager, compiled = _weight_grads(False), _weight_grads(True)
    for name in eager:
        assert torch.isfinite(compiled[name]).all(), name
        gap = ((compiled[name] - eager[name]).norm() / eager[name].norm()).item()
        assert gap < 0.02, (name, gap)


def _avx512_picked() -> bool:
    import torch._inductor.config as inductor
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    saved, inductor.cpp.simdlen = inductor.cpp.simdlen, None
    try:
        return pick_vec_isa().bit_width() == 512
    finally:
        inductor.cpp.simdlen = saved


def _amx() -> bool:
    """Whether the CPU has AMX tiles (an Intel Sapphire Rapids or later), where the broken kernels were measured."""
    from torch._inductor.cpu_vec_isa import x86_isa_checker

    return "amx_tile" in x86_isa_checker()


@pytest.mark.skipif(not _avx512_picked() or not _amx(), reason="the NaN gradients were measured on AMX CPUs only: an AMD EPYC "
                    "with AVX-512 and no AMX computed them finite with Inductor's AVX-512 kernels (2026-11-28)")
def test_torch_2_13_avx512_kernels_still_break_the_weight_gradient(simdlen):
    """Why the width is held: Inductor's own choice (AVX-512 here) gives NaN weight gradients. Measured with each
    of Inductor's x86 ISAs forced on this Sapphire Rapids: AVX-512 with AMX tiles NaN, AVX-512 alone NaN, AVX2
    finite. When this fails after a torch upgrade, Inductor writes the tile right again and cpu_vector_width can go.
    On an AMD EPYC with AVX-512 (avx512_bf16, no AMX) the same kernels gave finite gradients: the canary runs only where
    the bug was seen; the width is held everywhere (the compiled gradients then equal eager ones on every CPU)."""
    simdlen.simdlen = None
    compiled = _weight_grads(True)
    assert not torch.isfinite(compiled["wo.weight"]).all()
