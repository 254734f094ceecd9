"""What each GPU can do: dense peak TFLOP/s per dtype, memory and memory bandwidth. Torch-free, one
table for the run's MFU (matched by the name torch reports) and for planning (`launch.gpu`).

Figures are the vendors' datasheet numbers for dense math (no 2:4 sparsity):
- H100 SXM5 / PCIe / NVL, H200 SXM / NVL: NVIDIA H100 and H200 Tensor Core GPU datasheets
  (H100 SXM: 989 TFLOP/s bf16, 1,979 fp8, 80 GB HBM3 at 3.35 TB/s; H200 SXM: same math,
  141 GB HBM3e at 4.8 TB/s).
- B200 / GB200: NVIDIA HGX B200 / GB200 NVL72 datasheets (B200: 2,250 bf16, 4,500 fp8 dense;
  DGX B200: 1,440 GB and 64 TB/s over 8 GPUs = 180 GB, 8 TB/s each).
- A100 SXM 80GB: NVIDIA A100 datasheet (312 bf16, no FP8 tensor cores, 2.039 TB/s).
- L40S: NVIDIA L40S datasheet (362 bf16, 733 fp8 dense, 48 GB GDDR6 at 864 GB/s).
- MI300X: AMD Instinct MI300X datasheet (1,307 bf16, 2,615 fp8 dense, 192 GB HBM3 at 5.3 TB/s).
"""

from __future__ import annotations

from dataclasses import dataclass

PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"fp8": 1513.0, "bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"fp8": 1671.0, "bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0},
    "H100": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0},  # SXM5
    "H200 NVL": {"fp8": 1671.0, "bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0},
    "GH200": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0},
    "H200": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0},  # SXM
    "GB200": {"fp4": 10000.0, "fp8": 5000.0, "bf16": 2500.0, "fp16": 2500.0},
    "B200": {"fp4": 9000.0, "fp8": 4500.0, "bf16": 2250.0, "fp16": 2250.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"fp8": 733.0, "bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L40": {"fp8": 362.0, "bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5},
    "L4": {"fp8": 242.0, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "MI300X": {"fp8": 2615.0, "bf16": 1307.0, "fp16": 1307.0, "tf32": 654.0, "fp32": 163.4},
}
"""Dense peak TFLOP/s by a substring of torch.cuda.get_device_name(), matched in this order,
case-insensitively: the more specific names come first ("H100 PCIe" before "H100", "GB200" before
"B200", "L40S" before "L40" before "L4")."""

MFU_BASIS = "bf16 dense"
"""What MFU is measured against, for every precision: the device's dense bf16 peak (fp32 / fp16 runs: their own)."""

MFU_NOTE = ("an FP8 step also uses the FP8 tensor cores, so its MFU against the bf16 peak reads as bf16-equivalent "
            "utilization and can exceed what bf16 could reach")
"""The one wording of what MFU means for an FP8 run (the start line, bench, README)."""

DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32", "float8": "fp8"}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One `launch.gpu` choice: the figures planning uses."""

    name: str
    """The device-name key in PEAK_TFLOPS (the SXM part where there are several)."""
    memory_gib: float
    """Memory per GPU in GiB (datasheet GB converted: GB * 1e9 / 2**30)."""
    bandwidth_tbps: float
    """Memory bandwidth, TB/s (1e12 bytes per second)."""
    capability: tuple[int, int] | None
    """CUDA compute capability; None for AMD."""
    sms: int
    """Streaming multiprocessors (AMD: compute units), from the vendors' architecture whitepapers."""
    link_gbps: float
    """GB/s per direction a GPU can send to its node's peers: NVLink 4 (H100/H200) 900 GB/s and NVLink 5
    (B200) 1.8 TB/s bidirectional, NVLink 3 (A100) 600; L40S has no NVLink (PCIe Gen4 x16, 64 GB/s
    bidirectional); MI300X Infinity Fabric 7 x 64 GB/s. Datasheets."""

    def peak_tflops(self, dtype: str) -> float | None:
        return PEAK_TFLOPS[self.name].get(DTYPE_ALIASES.get(dtype, dtype))


def _gib(gb: float) -> float:
    return round(gb * 1e9 / 2**30, 1)


PLAN_GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100", _gib(80), 3.35, (9, 0), sms=132, link_gbps=450.0),
    "h200": GpuSpec("H200", _gib(141), 4.8, (9, 0), sms=132, link_gbps=450.0),
    "b200": GpuSpec("B200", _gib(180), 8.0, (10, 0), sms=148, link_gbps=900.0),
    "a100": GpuSpec("A100", _gib(80), 2.039, (8, 0), sms=108, link_gbps=300.0),
    "l40s": GpuSpec("L40S", _gib(48), 0.864, (8, 9), sms=142, link_gbps=32.0),
    "mi300x": GpuSpec("MI300X", _gib(192), 5.3, None, sms=304, link_gbps=448.0),
}
"""`launch.gpu` -> its figures. "auto" plans for an h100 (see `plan_gpu`)."""

DEFAULT_PLAN_GPU = "h100"
BLOCK_PLAN_GPU = "b200"
"""What "auto" plans for when the precision needs Blackwell (mxfp8, nvfp4)."""


def plan_gpu_name(choice: str, mode: str = "bf16", backend: str | None = None, recipe: str | None = None) -> str:
    """The `launch.gpu` a plan is predicted on: its own, or for "auto" an h100, a b200 where the precision
    needs compute capability 10.0 (an h100 cannot run it)."""
    from launcher.planning.hardware import supports

    if choice != "auto":
        return choice
    return DEFAULT_PLAN_GPU if supports(PLAN_GPUS[DEFAULT_PLAN_GPU].capability, mode, backend, recipe) else BLOCK_PLAN_GPU


def plan_gpu(choice: str, mode: str = "bf16", backend: str | None = None, recipe: str | None = None) -> GpuSpec:
    """The GpuSpec a plan's `launch.gpu` names (see `plan_gpu_name` for "auto")."""
    return PLAN_GPUS[plan_gpu_name(choice, mode, backend, recipe)]


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Dense peak TFLOP/s of `device_name` for `dtype` (fp8, bf16, fp16, tf32, fp32, fp4);
    None for a CPU, an unknown device or a dtype it has no figure for (MFU is then null)."""
    dtype = DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    name = device_name.lower()
    for key, peaks in PEAK_TFLOPS.items():
        if key.lower() in name:
            return peaks.get(dtype)
    return None
