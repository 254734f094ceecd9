"""Where a step's time goes, in one vocabulary for CPU and GPU traces (torch-free).

PARTS, and what puts time in each (`part_of`, checked in this order along the chain of events around the work,
outermost first, the work itself last; the fp8launch.* annotations are the training loop's):
- idle (first): inside fp8launch.data, the next batch fetched on the host;
- fp8_cast (first): inside fp8launch.fp8_scales, torchao's precompute_scale after the optimizer step;
- optimizer: inside Optimizer.step# / zero_grad# or the loop's fp8launch.optimizer (clipping, the step);
- loss: inside fp8launch.loss, or an autograd node of the loss (NllLoss, LogSoftmax, CrossEntropy);
- fp8_cast: work whose name says FP8 scaling (amax, abs+max+
  reciprocal, float8 / e4m3 / e5m2, to_mx) and is no GEMM, or any non-GEMM work inside an FP8 GEMM's own autograd
  Function (torchao's matmul_with_hp_or_float8_args, mx_mm, the grouped MX/FP8 GEMMs): the amax, scale, cast and
  transpose of its operands;
- attention: inside scaled-dot-product attention (flash / efficient / cudnn / math / flex, TE's fused attention);
- gemm_fp8: a GEMM that is a scaled GEMM (_scaled_mm, _scaled_grouped_mm, an e4m3 / e5m2 / fp8 kernel) or runs
  inside an FP8 GEMM's Function (torchao's emulated MXFP8 on CPU: bf16 mm on dequantized operands);
- gemm_high_precision: any other GEMM (mm, addmm, bmm, _grouped_mm, cuBLAS / CUTLASS / nvjet kernels);
- communication: collectives (c10d::, nccl, gloo, record_param_comms, all_to_all, FSDP::*, wait_tensor);
- other: everything else (norms, rope, SwiGLU, residuals, embedding, autocast copies);
- idle: the step's time with no work: on a GPU, the device waiting on the host (launch gaps, Python, data);
  on a CPU, Python between ops and the data fetch.

A GPU step is swept over its kernels: each stretch of time goes to one part, compute before communication (so
overlapped communication costs nothing, exposed communication is counted), idle where no kernel runs: the parts
add up to the step window. A CPU step gives every host event its self time: they add up to the step window too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.profiling.trace import Kernel, Node

PARTS = ("gemm_fp8", "gemm_high_precision", "attention", "fp8_cast", "loss", "optimizer", "communication", "other", "idle")

_GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::_scaled_grouped_mm",
                       "aten::_grouped_mm", "aten::_int_mm", "aten::addmv", "aten::mv", "aten::matmul", "aten::linear",
                       "aten::_addmm_activation"})
_SCALED_OPS = ("aten::_scaled_mm", "aten::_scaled_grouped_mm")
_FP8_GEMM_FUNCTIONS = re.compile(r"matmul_with_hp_or_float8_args|mx_mm|_MXFP8GroupedMM|_Float8GroupedMM|_to_mxfp8_then_scaled|"
                                 r"_scaled_grouped_mm|_scaled_mm|NVFP4|nvfp4_mm|_Linear\b|_LayerNormLinear|_LayerNormMLP")
_GEMM_KERNEL = re.compile(r"gemm|xmma|cutlass|nvjet|cublas|wgmma|triton_tem_fused\w*mm", re.I)
_FP8_KERNEL = re.compile(r"e4m3|e5m2|fp8|float8|f8f8|mxf8|mxfp8|nvfp4|e2m1", re.I)
_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|flex_attention|"
                        r"ScaledDotProduct|FlashAttention|EfficientAttention|fmha|flash_fwd|flash_bwd|FusedAttn|fused_attn|"
                        r"DotProductAttention|_sdpa|native_sdpa", re.I)
_LOSS = re.compile(r"NllLoss|nll_loss|LogSoftmax|log_softmax|CrossEntropy|cross_entropy", re.I)
_COMM = re.compile(r"^c10d::|^_c10d_functional::|nccl|gloo|record_param_comms|all_to_all|alltoall|allreduce|all_reduce|"
                   r"all_gather|allgather|reduce_scatter|broadcast|^FSDP::|wait_tensor|^aten::wait", re.I)
_CAST = re.compile(r"amax|float8|e4m3|e5m2|_ToFloat8|ToFloat8|to_mx|to_mxfp8|to_nvfp4|fp8_scales|quantize", re.I)
_ABS_MAX_RECIP = re.compile(r"abs.*max.*reciprocal|abs.*reciprocal.*max|_fused_\w*to_copy\w*clamp|_fused_\w*clamp\w*to_copy", re.I)
"""Inductor's fused kernels (triton_*, cpp_fused_*) are named after the ops they fuse: amax of |x|, a reciprocal scale,
and a saturating clamp before the cast are FP8 scaling; an autocast copy alone (_to_copy) is not."""


@dataclass(frozen=True, slots=True)
class Work:
    """What one piece of work is, for classifying: the chain of host events around it (outermost first) and,
    on a GPU, the kernel's own name."""

    chain: tuple[Node, ...]
    kernel: str | None = None

    def names(self) -> list[str]:
        return [n.name for n in self.chain]


def gemm_op(chain) -> Node | None:
    """The outermost GEMM op of the chain: its shapes are the layer's (CPU's _scaled_mm calls mm inside)."""
    return next((n for n in chain if n.name in _GEMM_OPS), None)


def is_fp8_gemm(work: Work) -> bool:
    names = work.names()
    if any(n in _SCALED_OPS for n in names) or any(_FP8_GEMM_FUNCTIONS.search(n) for n in names):
        return True
    return bool(work.kernel and _FP8_KERNEL.search(work.kernel))


def _is_gemm(work: Work) -> bool:
    """A GEMM kernel (by its name, or launched by a GEMM op and not an inductor kernel), or on a CPU any work inside a
    GEMM op (torch's CPU _scaled_mm dequantizes and calls mm inside)."""
    if work.kernel is not None:
        if _ATTENTION.search(work.kernel):
            return False
        launched_by_gemm = bool(work.chain) and any(n.name in _GEMM_OPS for n in work.chain) and not work.kernel.startswith("triton_")
        return bool(_GEMM_KERNEL.search(work.kernel)) or launched_by_gemm
    return any(n.name in _GEMM_OPS for n in work.chain)


def part_of(work: Work) -> str:
    """The part this work's time belongs to (the module docstring gives the order)."""
    names = work.names()
    leaf = work.kernel if work.kernel is not None else (names[-1] if names else "")
    if any(n == "fp8launch.data" for n in names):
        return "idle"
    if any(n == "fp8launch.fp8_scales" for n in names):
        return "fp8_cast"
    if any(n.startswith(("Optimizer.step#", "Optimizer.zero_grad#", "fp8launch.optimizer")) for n in names):
        return "optimizer"
    if any(n == "fp8launch.loss" for n in names) or any(_LOSS.search(n) for n in names if "Backward" in n) or _LOSS.search(leaf):
        return "loss"
    gemm = _is_gemm(work)
    if not gemm and (_CAST.search(leaf) or _ABS_MAX_RECIP.search(leaf)):
        return "fp8_cast"
    if any(_ATTENTION.search(n) for n in names) or _ATTENTION.search(leaf):
        return "attention"
    if gemm:
        return "gemm_fp8" if is_fp8_gemm(work) else "gemm_high_precision"
    if any(_FP8_GEMM_FUNCTIONS.search(n) for n in names) or any(_CAST.search(n) for n in names):
        return "fp8_cast"
    if any(_COMM.search(n) for n in names) or _COMM.search(leaf):
        return "communication"
    return "other"


# --- one step ------------------------------------------------------------------------------------

PRIORITY = {p: i for i, p in enumerate(("gemm_fp8", "gemm_high_precision", "attention", "fp8_cast", "loss", "optimizer",
                                        "other", "communication"))}
"""Where kernels overlap on a GPU, which part the stretch goes to: compute first, communication last (overlapped
communication is free; only exposed communication costs the step)."""


def host_parts(step: Node, nodes) -> dict[str, float]:
    """A CPU step: every host event's self time (seconds) to its part; the step annotation's own to idle."""
    out = dict.fromkeys(PARTS, 0.0)
    out["idle"] += step.self_time * 1e-6
    for node in nodes:
        chain = tuple(node.chain())
        inner = chain[chain.index(step) + 1:] if step in chain else chain
        out[part_of(Work(inner))] += node.self_time * 1e-6
    return out


def device_window(step: Node, kernels: list[Kernel], after: float = float("-inf")) -> tuple[float, float]:
    """The device's time for a step: from the step's start (not before the previous step's device time ended: the
    GPU may still be running it) to the end of the step or of its last kernel, whichever is later (a loop that does
    not wait for the GPU at the end of a step leaves kernels running past it)."""
    return max(step.ts, after), max(step.end, max((k.end for k in kernels), default=step.end))


def device_parts(window: tuple[float, float], kernels: list[Kernel]) -> dict[str, float]:
    """A GPU step: its device window swept over the kernels launched in it (each stretch to the highest-priority
    part running then; none: idle). Seconds."""
    lo, hi = window
    spans = []
    for k in kernels:
        a, b = max(k.ts, lo), min(k.end, hi)
        if b > a:
            chain = tuple(k.launch.chain()) if k.launch is not None else ()
            spans.append((a, b, part_of(Work(chain, k.name))))
    out = dict.fromkeys(PARTS, 0.0)
    edges = sorted({lo, hi, *(a for a, _, _ in spans), *(b for _, b, _ in spans)})
    spans.sort()
    active: list[tuple[float, float, str]] = []
    i = 0
    for a, b in zip(edges, edges[1:]):
        while i < len(spans) and spans[i][0] <= a:
            active.append(spans[i])
            i += 1
        active = [s for s in active if s[1] > a]
        part = min((s[2] for s in active), key=PRIORITY.__getitem__) if active else "idle"
        out[part] += (b - a) * 1e-6
    return out


def kernels_of(step: Node, kernels: list[Kernel]) -> list[Kernel]:
    """The kernels launched during the step (from any host thread: backward launches from autograd's)."""
    return [k for k in kernels if k.launch is not None and step.ts <= k.launch.ts <= step.end]
