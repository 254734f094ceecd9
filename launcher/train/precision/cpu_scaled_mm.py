"""torch._scaled_mm on CPU through torch's own emulated kernel, on every CPU.

torch 2.13's CPU `_scaled_mm` (aten/src/ATen/native/Blas.cpp, `_scaled_mm_out_cpu`) hands the GEMM to oneDNN
where the CPU has AMX-INT8 (both operands of one FP8 dtype) or AMX-FP16 (mixed dtypes), and to its own emulated
kernel (`_scaled_mm_out_cpu_emulated`: upcast, scale, fp32 matmul, cast) elsewhere. oneDNN 3.12 has no fast FP8
matmul there: with one scale per tensor it runs its reference implementation (ONEDNN_VERBOSE: `ref:any`), about
1 s for a 64 x 256 x 768 GEMM on a Sapphire Rapids core against 4 ms emulated. A tensorwise FP8 step of a tiny
model then takes seconds on one CPU generation and milliseconds on the one before, and the two compute the
products in different orders.

So a CPU run sends `_scaled_mm` (and its `out=` form, which Inductor's compiled graphs call) to
`_scaled_mm_v2`, whose CPU kernel (`_scaled_mm_cpu_v2_out`) always runs the same emulated kernel: the numerics
every CPU without AMX already gets, on every machine. Only the two scalings that kernel takes reach it
(tensorwise, rowwise); it refuses the others as `_scaled_mm` does. The GEMM stays one `aten::_scaled_mm` call
(profiles and op counts see it as before, with `_scaled_mm_v2` inside).

torch 2.11 (the GPU image's) declares `_scaled_mm_v2` without a CPU kernel, and its CPU `_scaled_mm` takes per-tensor
scales only: there the same emulated kernel runs in Python (`_emulated`: the same ops in the same order, bit for bit
torch 2.13's, tests/train/test_cpu_scaled_mm.py), with the v2 kernel's checks.
"""

from __future__ import annotations

import warnings

import torch

_TENSORWISE, _ROWWISE = 0, 1
"""torch.nn.functional.ScalingType values (`_scaled_mm_v2` takes them as ints)."""
_NO_SWIZZLE = 0

_library: torch.library.Library | None = None


def _recipe(scale: torch.Tensor) -> int:
    return _TENSORWISE if scale.numel() == 1 else _ROWWISE


def _v2_on_cpu() -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm_v2", "CPU")


_V2_ON_CPU = _v2_on_cpu()
"""Whether this torch has `_scaled_mm_v2`'s CPU kernel (torch >= 2.13); else `_emulated`."""


def _check(mat_a, mat_b, scale_a, scale_b) -> None:
    """The v2 CPU kernel's checks: FP8 operands, fp32 scales, both tensorwise or both rowwise."""
    m, n = mat_a.shape[0], mat_b.shape[1]
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    tensorwise = scale_a.numel() == 1 and scale_b.numel() == 1
    if not tensorwise and scale_a.numel() != 1 and tuple(scale_a.shape) != (m, 1):
        raise ValueError(f"scale_a must have shape [{m}, 1], got [{list(scale_a.shape)}]")
    if not tensorwise and scale_b.numel() != 1 and tuple(scale_b.shape) != (1, n):
        raise ValueError(f"scale_b must have shape [1, {n}], got [{list(scale_b.shape)}]")
    rowwise = tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n)
    if (mat_a.dtype not in fp8 or mat_b.dtype not in fp8 or scale_a.dtype != torch.float32
            or scale_b.dtype != torch.float32 or not (tensorwise or rowwise)):
        raise ValueError(f"Invalid scaling configuration: FP8 operands and fp32 scales, both singletons (TensorWise) or "
                         f"scale_a ({m}, 1) and scale_b (1, {n}) (RowWise); got {mat_a.dtype}, {mat_b.dtype}, "
                         f"scales {list(scale_a.shape)} {scale_a.dtype}, {list(scale_b.shape)} {scale_b.dtype}")


def _emulated(mat_a, mat_b, scale_a, scale_b, bias, out_dtype):
    """torch 2.13's `_scaled_mm_cpu_v2_out`: upcast and scale each operand, fp32 matmul, bias, cast."""
    _check(mat_a, mat_b, scale_a, scale_b)
    product = torch.matmul(mat_a.to(torch.float32) * scale_a, mat_b.to(torch.float32) * scale_b)
    if bias is not None:
        product = product + bias
    return product.to(out_dtype or mat_a.dtype)


def _v2(mat_a, mat_b, scale_a, scale_b, bias, out_dtype, use_fast_accum, out=None):
    if not _V2_ON_CPU:
        result = _emulated(mat_a, mat_b, scale_a, scale_b, bias, out_dtype)
        return result if out is None else out.resize_(result.shape).copy_(result)
    args = (mat_a, mat_b, [scale_a.contiguous()], [_recipe(scale_a)], [_NO_SWIZZLE],
            [scale_b.contiguous()], [_recipe(scale_b)], [_NO_SWIZZLE], bias, out_dtype)
    if out is None:
        return torch.ops.aten._scaled_mm_v2.default(*args, use_fast_accum=use_fast_accum)
    return torch.ops.aten._scaled_mm_v2.out(*args, use_fast_accum=use_fast_accum, out=out)


def _fp8_result(out_dtype) -> bool:
    return out_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _scaled_mm(mat_a, mat_b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    if scale_result is not None and _fp8_result(out_dtype):
        # the emulated kernel's output scaling (v1 only): fp32 product and bias, divided by the scale, then cast
        product = _v2(mat_a, mat_b, scale_a, scale_b, bias, torch.float32, use_fast_accum)
        return torch.mul(product, 1 / scale_result.item()).to(out_dtype)
    return _v2(mat_a, mat_b, scale_a, scale_b, bias, out_dtype, use_fast_accum)


def _scaled_mm_out(mat_a, mat_b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False, *, out):
    if scale_result is not None and _fp8_result(out_dtype):
        result = _scaled_mm(mat_a, mat_b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
        out.resize_(result.shape).copy_(result)
        return out
    return _v2(mat_a, mat_b, scale_a, scale_b, bias, out_dtype, use_fast_accum, out=out)


def install() -> None:
    """Route this process's CPU `_scaled_mm` to torch's emulated kernel (idempotent; CPU tensors only: CUDA keeps
    cuBLASLt)."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point
        warnings.simplefilter("ignore")
        library.impl("_scaled_mm", _scaled_mm, "CPU")
        library.impl("_scaled_mm.out", _scaled_mm_out, "CPU")
    _library = library


def uninstall() -> None:
    """torch's own CPU kernels again (tests compare the two)."""
    global _library
    if _library is not None:
        _library._destroy()
        _library = None
