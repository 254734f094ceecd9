"""The initial weights the training entrypoint gives a model, gathered whole. Run under torchrun:

    torchrun --standalone --nproc-per-node N tests/init_probe.py PLAN_DIR/plan.json OUT.pt

Builds exactly as `python -m launcher.train` does (launcher.train.main.build_run: meta device,
precision, blocks, engine, materialisation), then rank 0 saves {name: full fp32 tensor} (ZeRO-3: gathered)."""

import sys

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from launcher.train.main import build_run
from launcher.train.parallel import distributed

plan_path, out = sys.argv[1], sys.argv[2]
trainer, logger = build_run(plan_path)
logger.close()
module = trainer.state.engine.module
if any(hasattr(q, "ds_id") for q in module.parameters()):  # DeepSpeed ZeRO-3: each rank holds a partition
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        state = {k: v.detach().float().clone() for k, v in module.state_dict().items()}
else:
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if torch.distributed.get_rank() == 0:
    torch.save({k: v.detach().float().clone() for k, v in state.items()}, out)
distributed.barrier()
distributed.destroy()
distributed.exit_now(0)  # as the entrypoint leaves after a gloo run (gloo's threads abort a finalizing interpreter)
