"""DistributedDataParallel: every rank holds the whole model; gradients are all-reduced in
backward, except inside `no_sync()` (the non-final micro-batches of an accumulated step)."""

from __future__ import annotations

import contextlib
import typing
from typing import ContextManager

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from launcher.train.optim import build_optimizer, build_scheduler

from .base import Engine

if typing.TYPE_CHECKING:
    from launcher.planning.layout import Layout
    from launcher.planning.plan import Plan
    from launcher.train.materialize import Pending
    from launcher.train.parallel.distributed import DistEnv
    from launcher.train.precision import Precision


class DDPEngine(Engine):
    name = "ddp"

    def micro_batch(self, last: bool) -> ContextManager:
        # DDP decides in forward whether backward all-reduces, so forward goes inside no_sync too.
        return contextlib.nullcontext() if last else self.model.no_sync()


def wrap_ddp(model: nn.Module, plan: Plan, precision: Precision, *, env: DistEnv, layout: Layout,
             pending: Pending | None = None) -> DDPEngine:
    """Build the optimizer on the plain parameters, let the precision backend wrap it (MS-AMP),
    then wrap the model in DDP (the backend's own DDP class where it has one). A meta-built model
    (`pending`) gets its storage straight on the device and its weights there: no CPU copy."""
    if pending is not None:
        pending(model, env.device)
    else:
        model.to(env.device)
    optimizer = build_optimizer(model.parameters(), plan.train, plan.precision)
    model, optimizer = precision.wrap_optimizer(model, optimizer)
    scheduler = build_scheduler(optimizer, plan.train)
    ddp_class = precision.ddp_class or DistributedDataParallel
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    wrapped = ddp_class(model, device_ids=device_ids)
    from launcher.train.parallel.grad_reduce import install

    reduction = install(wrapped, plan, "ddp", world_size=env.world_size)  # a communication hook unless grad_reduce = "auto"
    return DDPEngine(model=wrapped, module=model, optimizer=optimizer, scheduler=scheduler, precision=precision,
                     accum_steps=plan.train.grad_accum_steps, grad_reduction=reduction, layout=layout)
