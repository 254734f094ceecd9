"""Seconds of one training step on one GPU, in the spec's precision and in bf16: a roofline per GEMM
plus what FP8 adds (casts and scales) and what it leaves alone (attention, norms, elementwise, loss,
optimizer, exposed communication). Torch-free and cheap: a few hundred arithmetic operations.

Every constant says where it comes from. Peaks, memory bandwidth and capability come from
launcher/planning/gpus.py (datasheets); the figures below add what a datasheet does not say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.planning.backends import BACKENDS

# --- what a GPU achieves, beyond its datasheet peak -------------------------------------------------

GEMM_EFF = {"bf16": 0.80, "fp8": 0.62, "fp4": 0.62}
"""Share of the dense peak a large GEMM reaches. bf16: 790 of 989 TFLOP/s measured for an 8192^3 bf16
matmul on the project's H100 (ENVIRONMENT.md). fp8: chosen so that the model reproduces torchao's
Float8Linear microbenchmark for a large shape (M, K, N = 4096, 8192, 16384: 1.39x with casts,
pytorch/ao torchao/float8/README.md); it means ~1,230 TFLOP/s for cuBLAS FP8 on an H100, ~1.55x bf16
(torchao's README: the GEMM speed-up "approaching 2x as M, K, N increase"). fp4: as fp8, i.e. FP4 GEMMs twice
FP8's, as the datasheet peaks are (only Blackwell has an fp4 peak)."""

BLACKWELL = ("b200",)
"""The `launch.gpu` choices of the Blackwell generation (sm100)."""

BLACKWELL_GEMM_SCALE = 0.73
"""FIT: on a Blackwell GPU a GEMM reaches this share of what GEMM_EFF says it reaches on an H100, in every dtype
(BLACKWELL_GEMM_EFF). One number fit by least squares on the two published end-to-end points marked `fit` in
tests/data/published_speedups.json (torchtitan's Llama-3-8B MXFP8 and NVFP4-with-bf16-tail runs; the fit:
`python benchmarks/prediction_table.py --fit`); every other Blackwell point is held out. No B200 GEMM was measured
for this project: with GEMM_EFF's H100 shares the model put FP4 GEMMs at 3.1x bf16 and still predicted NVFP4 1.23x
where 1.37x was measured, i.e. the bf16 step is slower than the roofline. Keeping Hopper's ratios between dtypes
(FP8 GEMMs 1.55x bf16, FP4 twice FP8 as the datasheet peaks are) and lowering all three shares is the one-parameter
account of that. The bf16 share it implies (58% of the B200's peak) puts the predicted bf16 tokens/s within 2% of
torchtitan's Llama and Qwen3 runs and of NeMo's Llama run (docs/prediction.md), which were not fit to."""

BLACKWELL_GEMM_EFF = {dtype: eff * BLACKWELL_GEMM_SCALE for dtype, eff in GEMM_EFF.items()}
"""GEMM_EFF on a Blackwell GPU (b200)."""

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

GB200_BENCH_GBPS = 7928.1
"""GB/s the NVFP4 kernel benchmarks divide by (CUDA device properties of their GB200; pytorch/ao
benchmarks/prototype/nvfp4_training/README.md, commit 36027d8): the shares below are measured GB/s over it."""

NVFP4_TRITON_EFF = {"rht_amax": 2550.39 / GB200_BENCH_GBPS, "rht_quant": 1564.42 / GB200_BENCH_GBPS,
                    "rht_quant_sr": 1101.29 / GB200_BENCH_GBPS, "weight_2d": 790.407 / GB200_BENCH_GBPS}
"""Share of the datasheet bandwidth torchao's NVFP4 training kernels reach: the Triton kernels `nvfp4_linear`
calls (torchao/prototype/moe_training/nvfp4_training/nvfp4_linear.py, 0.18), measured on a GB200 for the largest
shape of pytorch/ao benchmarks/prototype/nvfp4_training/README.md (2048 x 28672 activations, 8192 x 28672 weight):
`triton_rht_amax` 2,550 GB/s (its bytes: the bf16 read), `triton_rht_quantize_row_col` 1,564 GB/s round-to-nearest
and 1,101 GB/s with stochastic rounding (the bf16 read + two FP4 outputs with their scales),
`triton_weight_quantize_2d` 790 GB/s (the same bytes, 16x16 blocks). They are 10-32% of the 7.9 TB/s the GPU can
stream: the random Hadamard transform runs on CUDA cores, stochastic rounding draws Philox numbers per element."""

NVFP4_TE_EFF = {"rht_amax": 3087.8 / GB200_BENCH_GBPS, "rht_quant": 2699.6 / GB200_BENCH_GBPS,
                "rht_quant_sr": 2699.6 / GB200_BENCH_GBPS * NVFP4_TRITON_EFF["rht_quant_sr"] / NVFP4_TRITON_EFF["rht_quant"],
                "weight_2d": 2513.2 / GB200_BENCH_GBPS}
"""The same for Transformer Engine's NVFP4 kernels. TE publishes no kernel figures; assumption: they run like
torchao's CuteDSL kernels, which also do the Hadamard transform on the tensor cores ("we are using MMA hardware for
computing RHT", transformer_engine/pytorch/csrc/quantizer.cpp, NVFP4Quantizer::quantize_impl), measured in the same
README for the same shapes: amax 3,088 GB/s, row+col quantize 2,700 GB/s, 2D weight quantize 2,513 GB/s; stochastic
rounding slows the quantize by the ratio measured for the Triton kernel (1,101 / 1,564)."""

MXFP8_CAST_EFF = {"dim0": 5888.83 / 8000.0, "dim1": 5716.72 / 8000.0}
"""Share of the datasheet bandwidth (8 TB/s) torchao's MXFP8 casts reach on a B200: the Triton dim0 (rows) and the
CUDA dim1 (columns) kernels with RCEIL scales, 5,889 and 5,717 GB/s on 16384 x 16384 (pytorch/ao
docs/source/workflows/training.md, commit 36027d8, mxfp8 "quantization kernel microbenchmarks", B200 at 1000 W);
the kernels torchao/prototype/moe_training/mxfp8_linear.py (0.18) calls whether or not the model is compiled."""

FP4_BYTES = 0.5 + 1 / 16
"""One FP4 (e2m1) value and its share of an e4m3 scale per 16 values."""

NVFP4_ROW_COL = 2 + 2 * FP4_BYTES
"""An NVFP4 row+column quantize: read bf16, write the row-scaled copy (forward / grad-input GEMM) and the
column-scaled one (grad-weight GEMM)."""

NVFP4_WEIGHT_2D = 2 + 2 * (0.5 + 1 / 256)
"""The 2D weight quantize: one e4m3 scale per 16x16 block, shared by the weight and its transpose."""

MX_CAST = 2 + 1 + 1 / 32
"""One MXFP8 cast along one axis: read bf16, write e4m3 and one e8m0 scale per 32 values."""


@dataclass(frozen=True, slots=True)
class Pass:
    """One kernel of a cast."""

    bytes_per_elem: float
    """Bytes it moves per element of the operand (reads and writes)."""
    bw_eff: float = BW_EFF
    """Share of the datasheet memory bandwidth it reaches."""


@dataclass(frozen=True, slots=True)
class Cast:
    """Turning one high-precision tensor into what a recipe's low-precision GEMMs read: the kernels it launches."""

    passes: tuple[Pass, ...]

    @classmethod
    def streaming(cls, bytes_per_elem: float, kernels: int) -> "Cast":
        """`bytes_per_elem` moved by `kernels` streaming kernels at BW_EFF."""
        return cls((Pass(bytes_per_elem / kernels),) * kernels)

    @property
    def bytes_per_elem(self) -> float:
        return sum(p.bytes_per_elem for p in self.passes)

    @property
    def kernels(self) -> int:
        return len(self.passes)


SCALE_KERNEL = Pass(0.0)
"""A kernel on a few scalars (a global scale from an amax, a random offset): only its fixed cost."""


def _nvfp4(eff: dict[str, float], compiled: bool) -> dict[str, Cast]:
    """NVFP4 as torchao's nvfp4_linear and TE's NVFP4BlockScaling do it (the paper's recipe, arXiv 2509.25149): every
    operand first gets a global amax (an FP32 scale over the 16-value e4m3 block scales), then one quantize kernel
    writes the row-scaled copy and the column-scaled one. Input and grad_output: the amax pass also computes the amax
    of the random Hadamard transform (16x16) of the columns, which the quantize applies to the column-scaled copy only
    (the grad-weight GEMM's operands); grad_output is quantized with stochastic rounding (two random offsets drawn per
    Linear). Weight: a plain amax (torchao: `x.float().abs().max()`, fused into one reduction when compiled, three eager
    kernels on an FP32 copy otherwise; TE: nvte_compute_amax), then the 2D-block quantize, no transform. Each global
    scale costs a tiny kernel. All of this happens on the full weight every micro-batch (FSDP2 all-gathers it in bf16)."""
    amax_w = (Pass(2.0),) if compiled else (Pass(6.0), Pass(8.0), Pass(4.0))
    return {"input": Cast((Pass(2.0, eff["rht_amax"]), Pass(NVFP4_ROW_COL, eff["rht_quant"]), SCALE_KERNEL)),
            "weight": Cast(amax_w + (Pass(NVFP4_WEIGHT_2D, eff["weight_2d"]), SCALE_KERNEL)),
            "grad_output": Cast((Pass(2.0, eff["rht_amax"]), Pass(NVFP4_ROW_COL, eff["rht_quant_sr"]), SCALE_KERNEL,
                                 SCALE_KERNEL, SCALE_KERNEL))}


def casts(backend: str, recipe: str, compiled: bool) -> dict[str, Cast | None]:
    """The cast of each operand (`input`, `weight`, `grad_output`) of one FP8 Linear's three GEMMs; None
    where the recipe keeps that operand's GEMM in high precision.

    torchao tensorwise, compiled: an amax reduction (read 2 B) and one fused scale+cast kernel that also
    writes the transposed copy the other backward GEMM reads (read 2, write 1 + 1): 6 B, 2 kernels.
    Uncompiled, torchao runs abs, amax, scale, clamp, cast and the transpose as separate eager ops on
    bf16/fp32 intermediates: ~16 B in 6 kernels (why FP8-NO-COMPILE warns). rowwise: each operand is
    scaled along two different axes for its two GEMMs (rows for one, columns for the other): two
    reduce+cast passes, 8 B, 3 kernels (12 B, 8 kernels eager). rowwise_with_gw_hp: the weight-gradient
    GEMM stays in bf16, so input and grad_output are cast along one axis only (3 B, 1 kernel). torchao
    mxfp8: each operand is cast along dim0 (Triton) and dim1 (CUDA), 3.03 B each at the bandwidth they
    were measured at (MXFP8_CAST_EFF); they are kernels of their own, compiled or not. torchao / TE
    nvfp4: see `_nvfp4`.
    Transformer Engine fuses amax, cast and transpose in its own kernels (compile changes nothing):
    delayed scaling reads last steps' amax (cast_transpose: read 2, write 2: 4 B, 1 kernel); current
    scaling adds an amax pass (6 B, 2 kernels); block and MX scales are computed inside the cast kernel
    (4 B, 1 kernel). MS-AMP casts like TE's delayed scaling."""
    b = BACKENDS[backend]
    recipe = b.costed_as or recipe
    if b.fused_casts and recipe == "nvfp4":
        return _nvfp4(NVFP4_TE_EFF, compiled=True)  # TE's own CUDA kernels: compile changes nothing
    if b.fused_casts:
        one = {"delayed": Cast.streaming(4, 1), "current": Cast.streaming(6, 2)}.get(recipe, Cast.streaming(4, 1))
        return {"input": one, "weight": one, "grad_output": one}
    if recipe == "tensorwise":
        one = Cast.streaming(6, 2) if compiled else Cast.streaming(16, 6)
        return {"input": one, "weight": one, "grad_output": one}
    if recipe == "nvfp4":
        return _nvfp4(NVFP4_TRITON_EFF, compiled)
    if recipe == "mxfp8":
        mx = Cast((Pass(MX_CAST, MXFP8_CAST_EFF["dim0"]), Pass(MX_CAST, MXFP8_CAST_EFF["dim1"])))
        return {"input": mx, "weight": mx, "grad_output": mx}
    two_axes = Cast.streaming(8, 3) if compiled else Cast.streaming(12, 8)
    if recipe == "rowwise":
        return {"input": two_axes, "weight": two_axes, "grad_output": two_axes}
    one_axis = Cast.streaming(3, 1) if compiled else Cast.streaming(8, 4)
    return {"input": one_axis, "weight": two_axes, "grad_output": one_axis}


def fp8_gemms(backend: str, recipe: str) -> tuple[bool, bool, bool]:
    """Which of (forward, grad-input, grad-weight) run in FP8."""
    return (True, True, False) if recipe == "rowwise_with_gw_hp" else (True, True, True)  # torchao's recipe


def scaled_gemm_eff(backend: str, recipe: str) -> float:
    kind = {"rowwise": "rowwise", "rowwise_with_gw_hp": "rowwise", "block": "block", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}
    return SCALED_GEMM_EFF[kind.get(recipe, "tensorwise")] if BACKENDS[backend].gemm_efficiency else 1.0


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
    """One GEMM (m x k) @ (k x n): fixed cost + the slower of compute (with wave quantization) and memory; none for an
    empty one (a dimension split over more ranks than it has rows: rules refuse such a plan, the prediction runs first)."""
    if m <= 0 or k <= 0 or n <= 0:
        return 0.0
    tiles = math.ceil(m / TILE[0]) * math.ceil(n / TILE[1])
    wave_fill = tiles / (math.ceil(tiles / dev.sms) * dev.sms)
    compute = 2.0 * m * k * n / (dev.peak(dtype) * gemm_eff(dev, dtype) * scaled_eff * wave_fill)
    in_bytes = {"fp8": 1, "fp4": 0.5}.get(dtype, 2)
    memory = ((m * k + k * n) * in_bytes + m * n * 2) / (dev.bandwidth_tbps * 1e12 * BW_EFF)
    return GEMM_FIXED_S + max(compute, memory)


def gemm_eff(dev: Device, dtype: str) -> float:
    """Share of `dtype`'s dense peak a large GEMM reaches on `dev`: BLACKWELL_GEMM_EFF on a Blackwell, else GEMM_EFF."""
    return (BLACKWELL_GEMM_EFF if dev.name in BLACKWELL else GEMM_EFF)[dtype]


def stream_s(dev: Device, nbytes: float, kernels: int) -> float:
    """Memory-bound work: `nbytes` moved by `kernels` kernels."""
    return kernels * KERNEL_FIXED_S + nbytes / (dev.bandwidth_tbps * 1e12 * BW_EFF)


def cast_s(dev: Device, cast: Cast | None, elements: float) -> float:
    """One operand's cast over `elements` values: each kernel's fixed cost plus its bytes at its bandwidth."""
    if cast is None:
        return 0.0
    bw = dev.bandwidth_tbps * 1e12
    return sum(KERNEL_FIXED_S + p.bytes_per_elem * elements / (bw * p.bw_eff) for p in cast.passes)


# -- what FP8 does not touch (docs/prediction.md "What FP8 does not touch"); assumptions of the first cost model
# (commit f433341), held to the published and measured steps by the error table of docs/prediction.md, not fitted one by one

ATTN_BACKWARD = 2.5
"""Causal flash attention's backward FLOPs over its forward's (FlashAttention-2, Dao 2023, section 3: the backward runs
five matmuls to the forward's two, recomputing the scores)."""
ELEMENTWISE_PER_DIM = 26
"""Elements per token and block that the norms, residual adds and RoPE read and write, forward and backward, per model
dim (two RMSNorms and two residual adds over the hidden state, RoPE on q and k: docs/prediction.md's 26 d)."""
ELEMENTWISE_PER_QKV = 4
"""Elements per token and block per q / k / v feature (RoPE and the attention's input and output layout copies)."""
ELEMENTWISE_PER_FFN = 8
"""Elements per token and block per SwiGLU hidden feature (the gate's SiLU and the product, forward and backward)."""
ELEMENTWISE_RECOMPUTED = 0.4
"""The share of a block's elementwise traffic that activation checkpointing runs again: its forward's, about 2 of the
5 passes forward + backward take."""
LOSS_BYTES_PER_VOCAB = 22
"""Bytes per token and vocabulary entry of the fp32 loss, forward and backward: the bf16 logits read, their fp32 copy
and log-softmax written and read, the gradient written back in bf16."""
LOSS_BYTES_PER_DIM = 6
"""Bytes per token and model dim of the loss's input side (the final hidden state read, its gradient written)."""
LOSS_KERNELS = 8
"""Kernels of the eager loss, forward and backward (upcast, max, sum, log, gather; their gradients)."""
OPTIMIZER_BYTES = {"adam": 36, "adamw": 36}
"""Bytes an optimizer step moves per local fp32 parameter: Adam(W) reads and writes the parameter and both moments and
reads the gradient (28 B), and the gradient-norm clipping reads and scales the gradient (8 B); SGD (OPTIMIZER_BYTES_OTHER)
the parameter and the gradient with momentum."""
OPTIMIZER_BYTES_OTHER = 16
OPTIMIZER_KERNELS = 24
"""Kernels of one optimizer step (torch's foreach implementation: a few per parameter group and state)."""
