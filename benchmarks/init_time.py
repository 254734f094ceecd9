"""Seconds one rank spends giving a meta-built model its storage and initial weights
(launcher/train/materialize.py), in this process: the builtin model built on the meta device, sharded by FSDP2 as
rank 0 of a world of --world ranks (torch's fake process group: no other process, no communication; --world 1: whole
tensors, as DDP holds them), then `materialize` with its storage on --device and its values drawn on --draw.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/init_time.py [--model builtin:...] [--world 2] [--device cpu] [--draw cpu]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/init_time.py --overhead 400 [--world 2] [--device cpu]

Prints one JSON line: parameters, modules initialised, seconds (the best of --repeats), seconds per billion
parameters. The cost grows with the whole model, not the rank's shard: every rank draws each module whole (the price
of weights that do not depend on the world size). --overhead N: instead of the model, N modules of 16 x 16 (Linear
and LayerNorm, by nn's reset_parameters), whose draws cost next to nothing: the seconds per module materialize spends
around the draw (launcher/planning/init_cost.py MODULE_S).
"""

from __future__ import annotations

import argparse
import json
import time


def build(model: str, world: int, device: str, overhead: int = 0):
    """(model on meta sharded by FSDP2 as rank 0 of `world` (1: whole tensors), its initializer)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from launcher.train.materialize import reset_parameters_initializer
    from launcher.train.models import build_for_run, transformer_blocks

    if overhead:
        module, init = nn.Module(), reset_parameters_initializer
        with torch.device("meta"):  # the blocks under `layers`, where transformer_blocks finds them
            module.layers = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16, bias=False), nn.LayerNorm(16)) for _ in range(overhead // 2)])
    else:
        module, init = build_for_run(model, ".")
    if world == 1:  # whole tensors (DDP's path): drawn in place
        return module, init
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    mesh = init_device_mesh(device.split(":")[0], (world,))
    for block in transformer_blocks(module):
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module, init


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:llama3-8b?layers=1&vocab=32000")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the weights live")
    ap.add_argument("--draw", default=None, help="where the values are drawn (default: materialize's own choice)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--overhead", type=int, default=0, help="N tiny modules instead of the model")
    args = ap.parse_args()
    import torch

    from launcher.train import materialize as mat

    best = None
    for _ in range(args.repeats):
        model, init = build(args.model, args.world, args.device, args.overhead)
        kwargs = {} if args.draw is None else {"draw_on": args.draw}
        sync = torch.cuda.synchronize if args.device.startswith("cuda") or str(args.draw).startswith("cuda") else (lambda: None)
        sync()
        t0 = time.perf_counter()
        mat.materialize(model, args.device, init, seed=0, **kwargs)
        sync()
        seconds = time.perf_counter() - t0
        best = seconds if best is None else min(best, seconds)
    params = sum(p.numel() for p in model.parameters())
    modules = sum(1 for m in model.modules() if any(True for _ in m.parameters(recurse=False)))
    what = f"{args.overhead} modules of 16 x 16" if args.overhead else args.model
    print(json.dumps({"model": what, "world": args.world, "device": args.device, "draw": args.draw or "default",
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "params": params, "modules": modules,
                      "seconds": round(best, 3), "s_per_billion": round(best / params * 1e9, 2),
                      "ms_per_module": round(best / modules * 1e3, 3)}))


if __name__ == "__main__":
    main()
