"""The DeepSpeed engine: its rendered config, ZeRO stages with offload (CPU, NVMe), fp16 on CPU, compile under ZeRO-3,
and a non-finite step it cannot skip."""

from __future__ import annotations

from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import is_deepspeed, strategy


def _ds_both(f: Facts) -> bool:
    import json

    text = f.rendered.get("deepspeed.json")
    if not text:
        return False
    cfg = json.loads(text)
    return bool(cfg.get("fp16", {}).get("enabled")) and bool(cfg.get("bf16", {}).get("enabled"))


def _nvme(f: Facts) -> list[str]:
    ds = f.plan.distributed.deepspeed
    return [k for k in ("offload_optimizer", "offload_param") if getattr(ds, k) == "nvme"]


RULES: tuple[Rule, ...] = (
    Rule(id="FP16-BF16-BOTH", severity="error", stage="plan",
         when="the rendered deepspeed.json enables both fp16 and bf16",
         why="DeepSpeed asserts that fp16 and bf16 are not both enabled (a hand-edited template can do it).",
         fix="enable one of them in templates/deepspeed.json.j2, or set precision.high_precision to one dtype",
         condition=_ds_both),
    Rule(id="DS-OFFLOAD-PARAM-STAGE", severity="error", stage="plan",
         when="deepspeed offload_param != none with zero_stage != 3",
         why="DeepSpeed offloads parameters only under ZeRO stage 3.",
         fix='set distributed.deepspeed.zero_stage = 3, or distributed.deepspeed.offload_param = "none"',
         condition=lambda f: strategy(f) == "deepspeed" and f.plan.distributed.deepspeed.offload_param != "none"
             and f.plan.distributed.deepspeed.zero_stage != 3),
    Rule(id="DS-ON-NAN-SKIP", severity="error", stage="plan",
         when='train.on_nan = "skip" with strategy deepspeed',
         why="DeepSpeed applies the accumulated gradients inside its own step(), so a non-finite step cannot be skipped from outside.",
         fix='set train.on_nan = "stop", or distributed.strategy = "fsdp2"',
         condition=lambda f: strategy(f) == "deepspeed" and f.plan.train.on_nan == "skip"),
    Rule(id="DS-NVME-PATH", severity="error", stage="plan",
         when='distributed.deepspeed offload_optimizer or offload_param = "nvme" and distributed.deepspeed.nvme_path is empty',
         why="DeepSpeed swaps NVMe-offloaded tensors into files under nvme_path; without one, deepspeed.zero.Init asserts and the "
             "stage-3 optimizer joins None into a path.",
         fix='set distributed.deepspeed.nvme_path = "/local_nvme/deepspeed" (a folder on a fast local drive, present on every node)',
         condition=lambda f: is_deepspeed(f) and bool(_nvme(f)) and not f.plan.distributed.deepspeed.nvme_path.strip(),
         detail=lambda f: " and ".join(f"distributed.deepspeed.{k}" for k in _nvme(f)) + ' = "nvme" needs a folder to swap to, '
             "and distributed.deepspeed.nvme_path is empty."),
    Rule(id="DS-NVME-STAGE", severity="error", stage="plan",
         when='distributed.deepspeed.offload_optimizer = "nvme" with zero_stage 1 or 2',
         why="only ZeRO stage 3 (ZeRO-Infinity) swaps optimizer states to NVMe; DeepSpeed's stage 1/2 optimizer treats any offload "
             "device as CPU memory, so \"nvme\" would silently offload to host memory instead.",
         fix='set distributed.deepspeed.zero_stage = 3, or distributed.deepspeed.offload_optimizer = "cpu"',
         condition=lambda f: is_deepspeed(f) and f.plan.distributed.deepspeed.offload_optimizer == "nvme"
             and f.plan.distributed.deepspeed.zero_stage in (1, 2)),
    Rule(id="DS-OFFLOAD-STAGE0", severity="error", stage="plan",
         when="distributed.deepspeed.offload_optimizer != none with zero_stage 0",
         why="ZeRO stage 0 has no partitioned optimizer to offload: DeepSpeed keeps the optimizer states with the parameters and the "
             "offload setting does nothing.",
         fix='set distributed.deepspeed.zero_stage = 1 (or 2, 3), or distributed.deepspeed.offload_optimizer = "none"',
         condition=lambda f: is_deepspeed(f) and f.plan.distributed.deepspeed.offload_optimizer != "none"
             and f.plan.distributed.deepspeed.zero_stage == 0),
    Rule(id="DS-NVME-AIO", severity="error", stage="run",
         when='NVMe offload on a machine without libaio',
         why="DeepSpeed's NVMe offload reads and writes through its async_io op, which links libaio; without it the op cannot be built "
             "and deepspeed.initialize fails.",
         fix="install libaio (Debian/Ubuntu: apt-get install libaio-dev; RHEL: yum install libaio-devel), or "
             'set distributed.deepspeed.offload_optimizer / offload_param = "cpu"',
         condition=lambda f: is_deepspeed(f) and bool(_nvme(f)) and f.libaio is False),
    Rule(id="DS-FP16-CPU", severity="error", stage="plan",
         when='strategy deepspeed with fp16 (precision.mode, or high_precision in fp8) on launch.device = "cpu"',
         why="DeepSpeed's CPU accelerator supports bf16 and fp32 only: deepspeed.initialize raises \"Type fp16 is not supported "
             "on your device\" before the first step.",
         fix='set precision.mode = "bf16" (or precision.high_precision = "bf16"), or launch.device = "cuda"',
         condition=lambda f: is_deepspeed(f) and f.plan.precision.compute_dtype == "fp16" and f.plan.launch.device == "cpu"),
    Rule(id="DS-ZERO3-COMPILE", severity="error", stage="plan",
         when="DeepSpeed ZeRO-3 with compile.enabled and compile.fullgraph, or with activation checkpointing",
         why="ZeRO-3 gathers each block's parameters in module hooks that run inside the compiled block: some are "
             "torch.compiler.disable'd (a graph break, an error under fullgraph), and dynamo fails tracing them through the "
             "activation-checkpoint wrapper (\"UnspecializedNNModuleVariable(CheckpointWrapper) is already tracked for mutation\", "
             "torch 2.13, DeepSpeed 0.19). ZeRO-3 with compiled blocks and neither of them trains.",
         fix='set compile.fullgraph = false and activation_checkpointing.mode = "none", or compile.enabled = false, or '
             "distributed.deepspeed.zero_stage = 2 (or distributed.strategy = \"fsdp2\")",
         condition=lambda f: is_deepspeed(f) and f.plan.distributed.deepspeed.zero_stage == 3 and f.plan.compile.enabled
             and (f.plan.compile.fullgraph or f.plan.activation_checkpointing.mode != "none"),
         detail=lambda f: "DeepSpeed ZeRO-3 gathers each block's parameters in hooks that run inside the compiled block, and "
             + ("some are torch.compiler.disable'd: a graph break, which compile.fullgraph makes an error at the first forward."
                if f.plan.compile.fullgraph else
                "dynamo fails tracing them through the activation-checkpoint wrapper (\"UnspecializedNNModuleVariable(CheckpointWrapper) "
                "is already tracked for mutation\", torch 2.13, DeepSpeed 0.19).")),
)
