"""The distributed engines behind one small interface: DDP, FSDP2 and DeepSpeed.

    engine = wrap(model, plan, precision, plan_dir, env=env, layout=layout, blocks=blocks, cut=cut)
    loss = engine.train_step(next_batch, loss_fn)  # accum_steps micro-batches' forward and backward: this rank's mean loss
    total = all_reduce_sum(loss) / engine.loss_ranks
    norm = engine.clip_grad_norm(max_norm)         # None where the engine clips inside step()
    engine.step()                                  # optimizer, precision hook, lr schedule
    engine.zero_grad()

train_step's default runs each micro-batch in `micro_batch(last)` and `sequence_parts`, through `forward` and
`backward(loss, last)` (the engine divides by accum_steps; DeepSpeed: itself); the pipeline's engine (engines/pipeline.py,
`cut`: this rank's stages) runs them through its schedule. Evaluation calls `eval_loss` on `eval_batches` batches.

Each engine builds the optimizer and the lr schedule itself, because each needs them at a
different moment: DDP on the plain parameters, FSDP2 on the sharded ones, DeepSpeed inside
deepspeed.initialize. Call `wrap` after `apply_precision` and after `compile_ac.prepare_blocks`.
"""

from __future__ import annotations

import typing

from torch import nn

from launcher.errors import LauncherError

from .base import Engine, read_config

if typing.TYPE_CHECKING:
    from launcher.planning.layout import Layout
    from launcher.planning.plan import Plan
    from launcher.train.materialize import Pending
    from launcher.train.parallel.distributed import DistEnv
    from launcher.train.parallel.pipeline import StageCut
    from launcher.train.precision import Precision

__all__ = ["Engine", "wrap", "read_config"]


def wrap(model: nn.Module, plan: Plan, precision: Precision, plan_dir: str, *, env: DistEnv, layout: Layout,
         blocks: list[nn.Module] | None = None, pending: Pending | None = None, cut: StageCut | None = None) -> Engine:
    """Wrap `model` (already converted by the precision backend, blocks already checkpointed
    or compiled) in the plan's engine. `layout`: the job's parallel layout (the plan's for this world, built once:
    Run.layout, launcher/train/build.py), handed to every step that needs a degree or a mesh. `blocks` are FSDP2's
    units (default: the transformer blocks).
    `pending`: the model is on the meta device; the engine gives it storage and its initial
    weights (launcher/train/materialize.py) where each rank keeps only its part. `cut`: the model is this rank's pipeline
    stages (launcher/train/parallel/pipeline.py cut_stage; FSDP2 only, rule PP-STRATEGY)."""
    strategy = plan.distributed.strategy
    if strategy == "ddp":
        from .ddp import wrap_ddp

        return wrap_ddp(model, plan, precision, env=env, layout=layout, pending=pending)
    if strategy == "fsdp2":
        from .fsdp2 import wrap_fsdp2

        return wrap_fsdp2(model, plan, precision, read_config(plan_dir, "fsdp2.json"), env=env, layout=layout, blocks=blocks,
                          pending=pending, cut=cut)
    if strategy == "deepspeed":
        from .deepspeed_engine import wrap_deepspeed

        return wrap_deepspeed(model, plan, precision, read_config(plan_dir, "deepspeed.json"), env=env, layout=layout,
                              pending=pending)
    raise LauncherError(f"unknown distributed.strategy {strategy!r} in plan.json; fix: use ddp, fsdp2 or deepspeed")
