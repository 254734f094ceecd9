"""CPU runs send torch._scaled_mm to torch's emulated kernel (launcher/train/precision/cpu_scaled_mm.py): the same
bits as torch's own CPU kernel computes where it does not hand the GEMM to oneDNN (mkldnn off), through the functional
and the out= form, for every scaling and dtype pair torch's CPU kernel takes; and the same bits from the Python kernel
that runs where torch has no CPU `_scaled_mm_v2` (torch 2.11, whose own CPU kernel takes tensorwise scales only)."""

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


def _torch_takes(case) -> bool:
    """Whether this torch's own CPU kernel takes the case: 2.13 both scalings, 2.11 tensorwise only."""
    return cpu_scaled_mm._v2_on_cpu() or case[2].numel() == 1


@pytest.fixture(params=["v2", "python"])
def kernel(request, monkeypatch):
    """The kernel fp8launch routes to: torch's `_scaled_mm_v2` (where this torch has its CPU kernel) or the Python one."""
    if request.param == "v2" and not cpu_scaled_mm._V2_ON_CPU:
        pytest.skip("this torch has no CPU _scaled_mm_v2 (torch < 2.13)")
    monkeypatch.setattr(cpu_scaled_mm, "_V2_ON_CPU", request.param == "v2")
    return request.param


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


def test_every_scaling_and_dtype_pair_gives_the_bits_of_torchs_emulated_kernel(torchs_own_kernel, kernel):
    cases = [c for c in CASES if _torch_takes(c)]
    want = _run(cases)
    cpu_scaled_mm.install()
    try:
        got, got_out = _run(cases), _run(cases, out=True)
    finally:
        cpu_scaled_mm.uninstall()
    assert len(cases) == (48 if cpu_scaled_mm._v2_on_cpu() else 24)
    assert all(torch.equal(w, g) for w, g in zip(want, got))
    assert all(torch.equal(w, g) for w, g in zip(want, got_out))
    # a wrong scale would move every value: the check above sees scales, bias and dtype
    a, b, sa, sb, bias, out_dtype = CASES[1]
    assert not torch.equal(want[1], torch._scaled_mm(a, b, sa * 2, sb, bias=bias, out_dtype=out_dtype))


def test_the_python_kernel_gives_the_bits_of_torchs_v2_kernel_for_rowwise_scales_too(kernel):
    """Where torch has the v2 CPU kernel, the Python one (torch 2.11's path) computes its bits for all 48 cases."""
    if not cpu_scaled_mm._v2_on_cpu():
        pytest.skip("this torch has no CPU _scaled_mm_v2 to compare with")
    for a, b, sa, sb, bias, out_dtype in CASES:
        want = torch.ops.aten._scaled_mm_v2.default(a, b, [sa.contiguous()], [int(sa.numel() > 1)], [0], [sb.contiguous()],
                                                    [int(sb.numel() > 1)], [0], bias, out_dtype)
        assert torch.equal(want, cpu_scaled_mm._emulated(a, b, sa, sb, bias, out_dtype))


def test_an_fp8_result_with_its_scale_matches_too(torchs_own_kernel, kernel):
    a, b, sa, sb, _, _ = CASES[0]
    scale = torch.tensor(4.0)
    want = torch._scaled_mm(a, b, sa, sb, scale_result=scale, out_dtype=E4M3)
    cpu_scaled_mm.install()
    try:
        got = torch._scaled_mm(a, b, sa, sb, scale_result=scale, out_dtype=E4M3)
    finally:
        cpu_scaled_mm.uninstall()
    assert torch.equal(want.view(torch.uint8), got.view(torch.uint8))


def test_the_gemm_stays_one_scaled_mm_call_with_the_emulated_kernel_inside(kernel):
    cpu_scaled_mm.install()
    a, b, sa, sb, bias, out_dtype = CASES[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out_dtype)
    names = [e.name for e in prof.events()]
    assert names.count("aten::_scaled_mm") == 1 and names.count("aten::_scaled_mm_v2") == (kernel == "v2")
    assert names.count("aten::matmul") == 1  # the emulated kernel's fp32 GEMM, inside either


def test_scalings_the_cpu_kernel_refuses_are_refused(torchs_own_kernel, kernel):
    a, b, _, _, _, _ = CASES[0]
    bad = (a, b, torch.ones(1, a.shape[1]), torch.ones(1, b.shape[1]))  # a per-column scale for a: neither recipe
    with pytest.raises((ValueError, RuntimeError)):  # torch 2.11's kernel asserts (RuntimeError), 2.13's says ValueError
        torch._scaled_mm(*bad, out_dtype=torch.bfloat16)
    cpu_scaled_mm.install()
    try:
        with pytest.raises(ValueError, match=r"scale_a must have (shape \[16, 1\]|16 Float elements)"):  # 2.13 | 2.15
            torch._scaled_mm(*bad, out_dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="Invalid scaling configuration|Float elements"):  # bf16 scales (2.13 | 2.15)
            torch._scaled_mm(a, b, torch.ones(16, 1, dtype=torch.bfloat16), torch.ones(1, 48), out_dtype=torch.bfloat16)
    finally:
        cpu_scaled_mm.uninstall()
