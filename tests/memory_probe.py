"""Bytes of the real model states of one training step on this rank: parameters, gradients and
optimizer states, as the engine holds them (local shards for FSDP2). Run under torchrun:

    torchrun --standalone --nproc-per-node N tests/memory_probe.py PLAN_DIR   # prints one JSON line on rank 0

With pipeline parallelism each rank cuts its stage as the entrypoint does, steps through the schedule, and every rank
prints its line (its stage's states differ).
"""

import json
import os
import sys

import torch
from torch.distributed.tensor import DTensor

from launcher.planning.plan import load_plan
from launcher.train.compile_ac import prepare_blocks
from launcher.train.engines import wrap
from launcher.train.loss import cross_entropy
from launcher.train.models import build_model
from launcher.train.parallel import distributed
from launcher.train.precision import apply_precision


def local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if isinstance(t, DTensor) else t
    t = getattr(t, "_tensor", t)  # torchao's float8 all-gather wrapper holds the plain tensor
    return t.numel() * t.element_size()


plan_dir = sys.argv[1]
plan = load_plan(os.path.join(plan_dir, "plan.json"))
env = distributed.init("cpu")
torch.manual_seed(0)
model = build_model(plan.train.model, ".")
precision = apply_precision(model, plan, env.device)
layout, cut = plan.distributed.layout(env.world_size), None
if layout.pp > 1:  # this rank's stages, cut as launcher/train/build.py cuts them
    from launcher.train.models import transformer_blocks
    from launcher.train.parallel.pipeline import cut_stage, split_for

    cut = cut_stage(model, layout.stages_of(env.rank), split_for(layout, len(transformer_blocks(model))))
blocks = prepare_blocks(model, plan)
engine = wrap(model, plan, precision, plan_dir, env=env, layout=layout, blocks=blocks, cut=cut)
torch.manual_seed(0)  # every rank the same batch: a pipeline's stages read the same one
tokens = torch.randint(0, model.vocab_size, (plan.train.micro_batch_size, plan.train.seq_len + 1))
assert engine.accum_steps == 1, "the probe's plans take one micro-batch a step"
engine.train_step(lambda: tokens, cross_entropy)  # under context parallel this rank's part of the sequences
engine.clip_grad_norm(plan.train.max_grad_norm)
engine.step()
params = list(engine.model.parameters())
state_tensors = [v for s in engine.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
record = {
    "params": sum(local_bytes(p) for p in params),
    "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
    "optimizer_states": sum(local_bytes(v) for v in state_tensors),
    "param_count": sum(p.numel() for p in model.parameters()) if plan.distributed.strategy != "fsdp2"
    else sum((p.full_tensor() if isinstance(p, DTensor) else p).numel() for p in model.parameters()),
    "rank": env.rank,
}
if env.rank == 0 or layout.pp > 1:
    print(json.dumps(record), flush=True)
distributed.destroy()
distributed.exit_now(0)  # as the entrypoint leaves after a gloo run (gloo's threads abort a finalizing interpreter)
