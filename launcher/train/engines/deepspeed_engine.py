"""DeepSpeed ZeRO through `deepspeed.initialize(model=, optimizer=, lr_scheduler=, config=)`
with the generated deepspeed.json as the config dict.

DeepSpeed does its own gradient accumulation (it scales the loss by 1/accum in backward and
steps the optimizer and the lr schedule only at the accumulation boundary), its own clipping
(`gradient_clipping`) and its own casting (`bf16`/`fp16`): this engine hands those to it.
On CPU it runs with DS_ACCELERATOR=cpu over the gloo process group already joined.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import typing

import torch
from torch import nn

from launcher.errors import BackendMissing
from launcher.planning.install import INSTALL
from launcher.planning.rules import Facts, rule_error
from launcher.train.models import logits_of
from launcher.train.optim import build_optimizer, build_scheduler, param_groups

from .base import Engine

if typing.TYPE_CHECKING:
    from launcher.planning.layout import Layout
    from launcher.planning.plan import Plan
    from launcher.train.materialize import Pending
    from launcher.train.parallel.distributed import DistEnv
    from launcher.train.precision import Precision


class DeepSpeedEngine(Engine):
    name = "deepspeed"
    clips_in_step = True

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast():  # a no-op for DeepSpeed's own bf16/fp16; FP8 modules cast themselves
            return logits_of(self.model(inputs))

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.model.backward(loss)
        if not last:
            self.model.step()  # only advances DeepSpeed's micro-step count: no optimizer step before the boundary

    def clip_grad_norm(self, max_norm: float) -> None:
        return None  # deepspeed.json's gradient_clipping; DeepSpeed clips inside step()

    def step(self) -> None:
        self.model.step()
        self.precision.after_optimizer_step(self.module)
        from .base import balance_experts

        balance_experts(self.module)

    def zero_grad(self) -> None:
        pass  # DeepSpeed zeroes gradients itself after its optimizer step

    def skip_step(self) -> None:
        raise NotImplementedError("DeepSpeed applies accumulated gradients inside its step; wrap_deepspeed refuses on_nan = skip")

    def lr(self) -> float:
        return float(self.model.get_lr()[0])

    def train_state(self) -> dict:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "deepspeed_engine": self.model}


def import_deepspeed(device: torch.device, precision: Precision | None = None):
    """deepspeed, or the backend's own wrapper of it (`Precision.deepspeed`: MS-AMP's msamp.deepspeed), with the
    accelerator chosen before the import."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.type == "cuda" else "cpu")
    own = precision.deepspeed() if precision is not None else None
    if own is None:
        try:
            with without_mlflow():
                import deepspeed as own
        except ImportError as e:
            raise BackendMissing("deepspeed", INSTALL["deepspeed"]) from e
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return own


@contextlib.contextmanager
def without_mlflow():
    """`import deepspeed` imports mlflow where it is installed (deepspeed/autotuning/autotuner.py, for the
    `deepspeed --autotuning` launcher, which a training process never runs), and mlflow-skinny brings pandas and
    fastapi: 2.3 s of every DeepSpeed rank's start on the 2-core CPU machine (0.4 s without it). Hidden while
    deepspeed imports, unless something here already imported it; a run that logs to MLflow imports it after."""
    if "mlflow" in sys.modules:
        yield
        return
    sys.modules["mlflow"] = None  # `import mlflow` raises ImportError: DeepSpeed's autotuner goes without
    try:
        yield
    finally:
        if sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]


def without_shm_comm() -> None:
    """Keep DeepSpeed's CPU backend from JIT-building and loading its shared-memory op (deepspeed/comm/torch.py,
    `build_shm_op`): only `inference_all_reduce` calls it, never training, and it costs a g++ build on a new machine
    (~35 CPU-s) and ~0.5 s of every rank's start after. `deepspeed.ops.__compatible_ops__` is the table
    `build_shm_op` reads, probed once per process and kept (DeepSpeed 0.19.8's deepspeed/ops/__init__.py)."""
    import deepspeed.ops  # the real one, also under MS-AMP's wrapper

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def param_dtype(config: dict) -> torch.dtype:
    """The dtype DeepSpeed keeps a model's parameters in under `config` (its optimizer keeps fp32 masters)."""
    if config.get("bf16", {}).get("enabled"):
        return torch.bfloat16
    if config.get("fp16", {}).get("enabled"):
        return torch.float16
    return torch.float32


def zero3_partition(deepspeed, config: dict):
    """A materialize.Partition for ZeRO-3: each module's parameters, as soon as they hold their initial
    weights, become ZeRO-3 parameters in the config's dtype, partitioned over the ranks (what building
    under `deepspeed.zero.Init` does, with weights that do not depend on the world size), so a rank never
    holds more than one module's full tensors. deepspeed.initialize then finds a ZeRO-3 model ready."""
    dtype = param_dtype(config)
    converted: list[nn.Parameter] = []

    def partition(module: nn.Module, params: list[nn.Parameter]) -> None:
        for q in params:
            if q.is_floating_point() and q.dtype != dtype:
                q.data = q.data.to(dtype)
        if not converted:  # the first: deepspeed.zero.Init with the run's config (offload_param, process group)
            deepspeed.zero.Init(module=module, config_dict_or_path=config)
        else:  # the others join it, as DeepSpeed's own _convert_to_zero_parameters does
            converted[0].convert_to_zero_parameters(param_list=params)
        converted.extend(params[:1])

    return partition


def zero3_compiled_blocks(model: nn.Module) -> int:
    """Let ZeRO-3 run torch.compile'd blocks: its forward prologue sets `module._parameters._in_forward`
    on every module, after `ensure_zero_ordered_dict` swapped each `_parameters` for a ZeROOrderedDict
    with setattr (deepspeed/runtime/zero/parameter_offload.py). An OptimizedModule (torch.compile's
    wrapper) forwards that setattr to the module it wraps, so its own `_parameters` stays a plain dict
    and the prologue fails ("'dict' object has no attribute '_in_forward'"). The wrapper owns no
    parameters: its own dict is replaced in place. Returns how many wrappers were fixed."""
    from deepspeed.runtime.zero.parameter_offload import ZeROOrderedDict
    from torch._dynamo.eval_frame import OptimizedModule

    n = 0
    for m in model.modules():
        own = m.__dict__.get("_parameters")
        if isinstance(m, OptimizedModule) and isinstance(own, dict) and not isinstance(own, ZeROOrderedDict):
            m.__dict__["_parameters"] = ZeROOrderedDict(m, own)
            n += 1
    return n


def wrap_deepspeed(model: nn.Module, plan: Plan, precision: Precision, config: dict, *, env: DistEnv, layout: Layout,
                   pending: Pending | None = None) -> DeepSpeedEngine:
    """`pending` (a meta-built model) gets its storage and weights on the device before
    deepspeed.initialize: under ZeRO-3 one module at a time, each partitioned as soon as it is
    initialised (`zero3_partition`); under ZeRO-0/1/2, which keep whole parameters on every rank
    anyway, whole. A model that initialises itself as a whole (a py: model's init_weights()) is
    materialised whole under ZeRO-3 too, and partitioned by deepspeed.initialize."""
    if env.device.type == "cpu" and config.get("fp16", {}).get("enabled"):
        raise rule_error("DS-FP16-CPU", Facts(plan=plan))  # planning refuses launch.device = "cpu"; "auto" finds it here
    deepspeed = import_deepspeed(env.device, precision)
    if env.device.type == "cpu":
        without_shm_comm()
    deepspeed.init_distributed(dist_backend=env.backend)
    if pending is not None:
        zero3 = plan.distributed.deepspeed.zero_stage == 3 and not pending.whole_model_init
        pending(model, env.device, partition=zero3_partition(deepspeed, config) if zero3 else None)
    if plan.distributed.deepspeed.zero_stage == 3:
        zero3_compiled_blocks(model)
    # MS-AMP O3 builds its FP8 ZeRO optimizer from deepspeed.json's "optimizer" section.
    optimizer = None if "optimizer" in config else build_optimizer(model.parameters(), plan.train)
    engine, ds_optimizer, _, scheduler = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model.parameters(), plan.train) if optimizer is None else None,
        optimizer=optimizer,
        lr_scheduler=lambda opt: build_scheduler(opt, plan.train),
        config=config,
    )
    if precision.deepspeed() is not None:  # its own DeepSpeed engine converted inside deepspeed.initialize: count what it did
        from ..precision.checks import raise_run_errors

        precision.recount(engine.module)
        raise_run_errors(plan, env.device, fp8_layers=precision.report.fp8_layers)
    from launcher.train.parallel.grad_reduce import install

    return DeepSpeedEngine(model=engine, module=engine.module, optimizer=ds_optimizer, scheduler=scheduler,
                           precision=precision, accum_steps=plan.train.grad_accum_steps,
                           grad_reduction=install(engine, plan, "deepspeed", world_size=env.world_size),
                           layout=layout)
