"""CPU runs send torch._scaled_mm to torch's emulated kernel (launcher/train/precision/cpu_scaled_mm.py): the same
bits as torch's own CPU kernel computes where it does not hand the GEMM to oneDNN (mkldnn off), through the functional
and the out= form, for every scaling and dtype pair torch's CPU kernel takes."""

from __future__ import annotations

import itertools

import pytest
import torch

from launcher.train.precision import cpu_scaled_mm

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _cases():
    g = torch.Generator().manual_seed(0)
    for (m, k, n), (da, db), rowwise, out_dtype, bias in itertools.product(
            [(16, 32, 48), (64, 256, 96)], [(E4M3, E4M3), (E5M2, E4M3), (E4M3, E5M2)], [False, True],
            [torch.bfloat16, torch.float32], [False, True]):
        a = (torch.randn(m, k, generator=g) * 3).to(da)
        b = (torch.randn(n, k, generator=g) * 3).to(db).t()  # column-major, as torchao passes the weight
        if rowwise:
            sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5
        else:
            sa, sb = torch.tensor(0.37), torch.tensor(1.7)
        yield a, b, sa, sb, (torch.randn(n, generator=g).to(out_dtype) if bias else None), out_dtype


CASES = list(_cases())


@pytest.fixture
def torchs_own_kernel():
    """torch's CPU kernel as it is shipped, with oneDNN off: the emulated path every CPU without AMX takes."""
    cpu_scaled_mm.uninstall()
    with torch.backends.mkldnn.flags(enabled=False):
        yield
    cpu_scaled_mm.install()


def _run(cases, out=False):
    results = []
    for a, b, sa, sb, bias, out_dtype in cases:
        if out:
            o = torch.empty(0, dtype=out_dtype)
            torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype, out=o)
            results.append(o)
        else:
            results.append(torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype))
    return results


def test_every_scaling_and_dtype_pair_gives_the_bits_of_torchs_emulated_kernel(torchs_own_kernel):
    want = _run(CASES)
    cpu_scaled_mm.install()
    try:
        got, got_out = _run(CASES), _run(CASES, out=True)
    finally:
        cpu_scaled_mm.uninstall()
    assert len(CASES) == 48
    assert all(torch.equal(w, g) for w, g in zip(want, got))
    assert all(torch.equal(w, g) for w, g in zip(want, got_out))
    # a wrong scale would move every value: the check above sees scales, bias and dtype
    a, b, sa, sb, bias, out_dtype = CASES[1]
    assert not torch.equal(want[1], torch._scaled_mm(a, b, sa * 2, sb, bias=bias, out_dtype=out_dtype))


def test_an_fp8_result_with_its_scale_matches_too(torchs_own_kernel):
    a, b, sa, sb, _, _ = CASES[0]
    scale = torch.tensor(4.0)
    want = torch._scaled_mm(a, b, sa, sb, scale_result=scale, out_dtype=E4M3)
    cpu_scaled_mm.install()
    try:
        got = torch._scaled_mm(a, b, sa, sb, scale_result=scale, out_dtype=E4M3)
    finally:
        cpu_scaled_mm.uninstall()
    assert torch.equal(want.view(torch.uint8), got.view(torch.uint8))


def test_the_gemm_stays_one_scaled_mm_call_with_the_emulated_kernel_inside():
    cpu_scaled_mm.install()
    a, b, sa, sb, bias, out_dtype = CASES[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
    names = [e.name for e in prof.events()]
    assert names.count("aten::_scaled_mm") == 1 and names.count("aten::_scaled_mm_v2") == 1


def test_scalings_the_cpu_kernel_refuses_are_refused(torchs_own_kernel):
    a, b, _, _, _, _ = CASES[0]
    bad = (a, b, torch.ones(1, a.shape[1]), torch.ones(1, b.shape[1]))  # a per-column scale for a: neither recipe
    with pytest.raises(ValueError):
        torch._scaled_mm(*bad, out_dtype=torch.bfloat16)
    cpu_scaled_mm.install()
    with pytest.raises(ValueError, match=r"scale_a must have shape \[16, 1\]"):
        torch._scaled_mm(*bad, out_dtype=torch.bfloat16)
