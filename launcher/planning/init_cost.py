"""How long one rank takes to give a meta-built model its initial weights (launcher/train/materialize.py):
torch-free, for `fp8launch plan` (text and JSON: `init`) and the GPU session's per-bench estimates, so that both
read one figure.

Every rank draws every module whole (the price of initial weights that do not depend on the world size), so the time
grows with the whole model, not the rank's shard:

- on a GPU (launch.device "cuda" or "auto"): each module's full tensors are drawn in the GPU's memory, then the rank
  keeps its slice: memory traffic (GPU_BYTES_PER_PARAM at the GPU's streaming bandwidth) plus a host cost per module
  (MODULE_S); for an 8B-shaped model under a second;
- on the CPU (launch.device "cpu"): one thread draws them (CPU_S_PER_BILLION).

A model read from a Hugging Face folder's weights files is read, not drawn: its time is the disk's, not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.planning.gpus import plan_gpu
from launcher.planning.predict.cost import BW_EFF

CPU_S_PER_BILLION = 12.7
"""Seconds per billion parameters a rank spends drawing on one CPU thread (every parameter: the whole model): the 8B
shape with 15 layers (4.32B parameters) took 55 s per run on the GPU machine's host (docs/benchmarks.md). On this
project's shared 2-core CPU machine (`benchmarks/init_time.py --world 2`, 480M parameters): 14.6-15.7 s at load 3-5,
22-33 s at load 5-7 (about half of it torch's normal_, a quarter the NaN check)."""

GPU_BYTES_PER_PARAM = 22.0
"""Bytes of GPU memory traffic per fp32 parameter drawn (launcher/train/materialize.py `_initialise`): the module's
full copy filled with NaN (4 written), the draw (4 written; torch's Philox normal/uniform kernels run at streaming
speed), the check that nothing stayed NaN (4 read, a 1-byte mask written and read), the rank's slice copied into its
shard (at most 4 read and 4 written: all of it at world size 1)."""

MODULE_S = 1e-3
"""Host seconds per module initialised on a GPU: its full copy made, the generators forked and seeded, the model's
rule run in Python, ~6 kernel launches and one wait per tensor (the NaN check). Measured on this project's shared
2-core CPU machine with modules of 16 x 16, whose draws cost nothing (`benchmarks/init_time.py --overhead 400
--world 1|2`): 0.36 ms (whole tensors) and 0.56 ms (FSDP2 shards, which add DTensor bookkeeping) per module at load
2, 0.9 and 2.7 ms at load 10; a GPU's launches and waits add some 50 us a tensor. Not measured on a GPU yet
(tests/gpu/test_materialize_gpu.py prints it)."""

MODULES_PER_BLOCK = 9
"""Modules holding parameters in a Llama-style block (two norms, wq, wk, wv, wo, w1, w2, w3); the model adds its
embedding, final norm and head."""


@dataclass(frozen=True, slots=True)
class InitTime:
    """A rank's initialisation: seconds, where the values are drawn, and what the figure counts."""

    seconds: float
    where: str
    how: str

    def line(self) -> str:
        return f"initialisation time per rank: ~{self.seconds:.2g} s {self.where} ({self.how})"

    def to_json(self) -> dict:
        return {"seconds_per_rank": round(self.seconds, 3), "where": self.where, "how": self.how}


def gpu_init_seconds(params: int, modules: int, gpu: str = "h100") -> float:
    """Seconds a rank spends drawing `params` parameters in `modules` modules on one `gpu` (a `launch.gpu` choice)."""
    bandwidth = plan_gpu(gpu).bandwidth_tbps * 1e12 * BW_EFF  # "auto": an H100
    return params * GPU_BYTES_PER_PARAM / bandwidth + modules * MODULE_S


def cpu_init_seconds(params: int) -> float:
    """Seconds a rank spends drawing `params` parameters on one CPU thread."""
    return params * CPU_S_PER_BILLION / 1e9


def module_count(n_layers: int) -> int:
    """Modules holding parameters in a Llama-style decoder of `n_layers` blocks."""
    return MODULES_PER_BLOCK * n_layers + 3


def init_time(plan, params: int, cfg=None) -> InitTime:
    """A rank's initialisation time for `params` parameters trained as `plan` says; `cfg` (a model config or shape with
    `n_layers`, where planning knows it) counts the modules."""
    read = "; weights files, where the hf: folder has them, are read instead (disk time not counted)" \
        if plan.train.model.startswith("hf:") else ""
    billions = f"{params / 1e9:.3g}B parameters"
    if plan.launch.device == "cpu":
        return InitTime(cpu_init_seconds(params), "on the CPU", f"{billions} drawn on one thread, every rank all of them{read}")
    gpu = plan_gpu(plan.launch.gpu)
    modules = module_count(cfg.n_layers) if cfg is not None else 0
    counted = f"{modules} modules" if modules else "the modules' host time not counted (the model is sized when built)"
    return InitTime(gpu_init_seconds(params, modules, plan.launch.gpu), "on the GPU",
                    f"{billions}, {counted}, each drawn whole on one {gpu.name} and sliced; "
                    f"drawn on a CPU: ~{cpu_init_seconds(params):.3g} s{read}")
