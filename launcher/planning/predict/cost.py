"""Seconds of one training step on one GPU, in the spec's precision and in bf16: a roofline per GEMM
plus what FP8 adds (casts and scales) and what it leaves alone (attention, norms, elementwise, loss,
optimizer, exposed communication). Torch-free and cheap: a few hundred arithmetic operations.

Every constant says where it comes from. Peaks, memory bandwidth and capability come from
launcher/planning/gpus.py (datasheets); the figures below add what a datasheet does not say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# --- what a GPU achieves, beyond its datasheet peak -------------------------------------------------

GEMM_EFF = {"bf16": 0.80, "fp8": 0.62, "fp4": 0.62}
"""Share of the dense peak a large GEMM reaches. bf16: 790 of 989 TFLOP/s measured for an 8192^3 bf16
matmul on the project's H100 (ENVIRONMENT.md). fp8: chosen so that the model reproduces torchao's
Float8Linear microbenchmark for a large shape (M, K, N = 4096, 8192, 16384: 1.39x with casts,
pytorch/ao torchao/float8/README.md); it means ~1,230 TFLOP/s for cuBLAS FP8 on an H100, ~1.55x bf16
(torchao's README: the GEMM speed-up "approaching 2x as M, K, N increase")."""

SCALED_GEMM_EFF = {"tensorwise": 1.0, "rowwise": 0.85, "block": 0.85, "mxfp8": 1.0, "nvfp4": 1.0}
"""Throughput of a scaled-GEMM kernel relative to the tensorwise FP8 GEMM. Assumption: row-wise and
128-block scales need a per-row/per-block rescale in the GEMM's main loop (CUTLASS/DeepGEMM style
kernels), ~15% slower; MX formats scale in hardware on Blackwell (no penalty)."""

BW_EFF = 0.90
"""Share of the datasheet memory bandwidth a streaming kernel reaches: 3.0 of 3.35 TB/s measured for a
device-to-device copy on the project's H100, 4.3 of 4.8 on the H200 (ENVIRONMENT.md)."""

GEMM_FIXED_S = 4e-6
"""Fixed cost of one GEMM kernel: launch, prologue/epilogue and the tail. Assumption (CUDA kernel launch
latency is a few microseconds); it is what makes tiny GEMMs lose to the casts."""

KERNEL_FIXED_S = 2e-6
"""Fixed cost of one elementwise/reduction kernel (back-to-back launches on one stream). Assumption."""

TILE = (128, 128)
"""Output tile of a GEMM (M, N): tiles are spread over the SMs in waves; a partly filled last wave
runs at the speed of a full one."""

LINK_EFF = 0.80
"""Share of the link bandwidth a NCCL/RCCL collective's bus bandwidth reaches (assumption)."""

INTER_NODE_GBPS = 50.0
"""Per GPU across nodes: one 400 Gb/s InfiniBand/RoCE NIC per GPU, the usual H100 cluster design."""

ATTN_EFF = 0.35
"""Share of the dense bf16 peak a flash-attention kernel reaches, forward and backward together.
Assumption (FlashAttention-2 class kernels on Hopper); attention stays in bf16 in every recipe here."""

# --- what the casts cost ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cast:
    """Turning one high-precision tensor into what a recipe's FP8 GEMMs read."""

    bytes_per_elem: float
    """Bytes moved per element (bf16 reads, fp8 writes, transposed copies)."""
    kernels: int
    """Kernels launched for it."""


def casts(backend: str, recipe: str, compiled: bool) -> dict[str, Cast | None]:
    """The cast of each operand (`input`, `weight`, `grad_output`) of one FP8 Linear's three GEMMs; None
    where the recipe keeps that operand's GEMM in high precision.

    torchao tensorwise, compiled: an amax reduction (read 2 B) and one fused scale+cast kernel that also
    writes the transposed copy the other backward GEMM reads (read 2, write 1 + 1): 6 B, 2 kernels.
    Uncompiled, torchao runs abs, amax, scale, clamp, cast and the transpose as separate eager ops on
    bf16/fp32 intermediates: ~16 B in 6 kernels (why FP8-NO-COMPILE warns). rowwise: each operand is
    scaled along two different axes for its two GEMMs (rows for one, columns for the other): two
    reduce+cast passes, 8 B, 3 kernels (12 B, 8 kernels eager). rowwise_with_gw_hp: the weight-gradient
    GEMM stays in bf16, so input and grad_output are cast along one axis only (3 B, 1 kernel). torchao mxfp8 /
    nvfp4: like rowwise, each operand is cast along both axes (a dim0 and a dim1 cast: torchao's MX README,
    "to_mx cast across dim0 and dim1"), the block scales computed inside the cast.
    Transformer Engine fuses amax, cast and transpose in its own kernels (compile changes nothing):
    delayed scaling reads last steps' amax (cast_transpose: read 2, write 2: 4 B, 1 kernel); current
    scaling adds an amax pass (6 B, 2 kernels); block and MX scales are computed inside the cast kernel
    (4 B, 1 kernel). MS-AMP casts like TE's delayed scaling."""
    if backend in ("te", "msamp"):
        one = {"delayed": Cast(4, 1), "current": Cast(6, 2)}.get(recipe, Cast(4, 1))
        return {"input": one, "weight": one, "grad_output": one}
    if recipe == "tensorwise":
        one = Cast(6, 2) if compiled else Cast(16, 6)
        return {"input": one, "weight": one, "grad_output": one}
    two_axes = Cast(8, 3) if compiled else Cast(12, 8)
    if recipe in ("rowwise", "mxfp8", "nvfp4"):  # MX / NVFP4: each operand quantized along dim0 and dim1 (torchao's MX README)
        return {"input": two_axes, "weight": two_axes, "grad_output": two_axes}
    one_axis = Cast(3, 1) if compiled else Cast(8, 4)
    return {"input": one_axis, "weight": two_axes, "grad_output": one_axis}


def fp8_gemms(backend: str, recipe: str) -> tuple[bool, bool, bool]:
    """Which of (forward, grad-input, grad-weight) run in FP8."""
    return (True, True, False) if (backend, recipe) == ("torchao", "rowwise_with_gw_hp") else (True, True, True)


def scaled_gemm_eff(backend: str, recipe: str) -> float:
    kind = {"rowwise": "rowwise", "rowwise_with_gw_hp": "rowwise", "block": "block", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}
    return SCALED_GEMM_EFF[kind.get(recipe, "tensorwise")] if backend in ("torchao", "te") else 1.0


# --- kernels ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU as the model sees it."""

    name: str
    peak_tflops: dict[str, float]
    bandwidth_tbps: float
    sms: int
    link_gbps: float

    def peak(self, dtype: str) -> float:
        return self.peak_tflops[dtype] * 1e12


def gemm_s(dev: Device, m: int, k: int, n: int, dtype: str, scaled_eff: float = 1.0) -> float:
    """One GEMM (m x k) @ (k x n): fixed cost + the slower of compute (with wave quantization) and memory."""
    tiles = math.ceil(m / TILE[0]) * math.ceil(n / TILE[1])
    wave_fill = tiles / (math.ceil(tiles / dev.sms) * dev.sms)
    compute = 2.0 * m * k * n / (dev.peak(dtype) * GEMM_EFF[dtype] * scaled_eff * wave_fill)
    in_bytes = {"fp8": 1, "fp4": 0.5}.get(dtype, 2)
    memory = ((m * k + k * n) * in_bytes + m * n * 2) / (dev.bandwidth_tbps * 1e12 * BW_EFF)
    return GEMM_FIXED_S + max(compute, memory)


def stream_s(dev: Device, nbytes: float, kernels: int) -> float:
    """Memory-bound work: `nbytes` moved by `kernels` kernels."""
    return kernels * KERNEL_FIXED_S + nbytes / (dev.bandwidth_tbps * 1e12 * BW_EFF)


def cast_s(dev: Device, cast: Cast | None, elements: float) -> float:
    return 0.0 if cast is None else stream_s(dev, cast.bytes_per_elem * elements, cast.kernels)
