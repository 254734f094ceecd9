"""The initial weights every rank of a world gives its shards, each rank simulated in this process one after another on
torch's fake process group (its collectives do nothing; building, sharding and materialising do not communicate), put
back together into whole tensors: the world-size check of launcher/train/materialize.py without starting processes,
on the CPU (tests/train/test_materialize.py) and on one GPU (tests/gpu/test_materialize_gpu.py)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from launcher.train import materialize as mat
from launcher.train.fqn import clean_fqn
from launcher.train.models import build_for_run, transformer_blocks

MODEL = "builtin:llama-debug?layers=1&vocab=96"
"""A Llama with every kind of module (embedding, norms, attention, feed-forward, head): dim 256 and a vocabulary of 96,
so that 3 ranks shard unevenly (86, 86, 84 rows of 256) and FSDP2 pads."""


def whole(model: str = MODEL, device: str = "cpu", *, draw_on=None, seed: int = 0, partition=None) -> dict[str, torch.Tensor]:
    """The model materialised whole in this process (DDP's and DeepSpeed ZeRO-0/1/2's path; with `partition`, ZeRO-3's
    module by module), its parameters on the CPU."""
    module, init = build_for_run(model, ".")
    mat.materialize(module, device, init, seed=seed, partition=partition, draw_on=draw_on)
    return {clean_fqn(n): p.detach().to("cpu").clone() for n, p in module.named_parameters()}


@contextlib.contextmanager
def sharded(rank: int, world: int, model: str = MODEL, device: str = "cpu", *, tp: int = 1) -> Iterator[tuple[nn.Module, object]]:
    """(model, its initializer) as rank `rank` of `world` holds it before materialising, on torch's fake process group
    (left when the block ends): built on meta, tensor-parallel over `tp` adjacent ranks (torchtitan's plan,
    launcher/train/parallel/tensor_parallel.py), FSDP2 over the others (each block, then the root)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from launcher.train.parallel.tensor_parallel import parallelize
    from tests.train._precision import make_plan

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        # Names of this rank's own: DeviceMesh equality ignores the rank, and DTensor's sharding caches key on the mesh,
        # so a mesh equal to an earlier simulated rank's would bring back that rank's shards.
        names = (f"dp-{world}-{rank}", f"tp-{world}-{rank}")
        mesh = init_device_mesh(torch.device(device).type, (world // tp, tp), mesh_dim_names=names)
        module, init = build_for_run(model, ".")
        if tp > 1:
            plan = make_plan(distributed={"strategy": "fsdp2", "procs_per_node": world, "tensor_parallel": tp})
            parallelize(module, plan, mesh[names[1]])
        for block in transformer_blocks(module):
            fully_shard(block, mesh=mesh[names[0]])
        fully_shard(module, mesh=mesh[names[0]])
        yield module, init
    finally:
        dist.destroy_process_group()


def one_rank(rank: int, world: int, model: str = MODEL, device: str = "cpu", *, tp: int = 1, draw_on=None,
             seed: int = 0) -> list[tuple[str, tuple[slice, ...] | None, torch.Tensor]]:
    """(name, the slice of the full tensor this rank holds, its values on the CPU) of each parameter, as rank `rank` of
    `world` materialises it (see `sharded`) with its storage on `device`, drawn on `draw_on`."""
    with sharded(rank, world, model, device, tp=tp) as (module, init):
        mat.materialize(module, device, init, seed=seed, draw_on=draw_on)
        return [(clean_fqn(n), mat.local_slice(p), p.to_local().detach().to("cpu").clone()) for n, p in module.named_parameters()]


def gathered(world: int, model: str = MODEL, device: str = "cpu", *, tp: int = 1, draw_on=None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every rank's shards of `world` (see `one_rank`) put together: {name: full tensor}. A position no rank holds stays
    NaN; two ranks holding one position (tensor-parallel replicas, the norms) must hold the same value."""
    shapes = {clean_fqn(n): tuple(p.shape) for n, p in build_for_run(model, ".")[0].named_parameters()}
    full = {n: torch.full(s, float("nan")) for n, s in shapes.items()}
    for rank in range(world):
        for name, where, local in one_rank(rank, world, model, device, tp=tp, draw_on=draw_on, seed=seed):
            target = full[name] if where is None else full[name][where]
            held = ~torch.isnan(target)
            assert torch.equal(target[held], local[held]), f"rank {rank} disagrees with another rank on {name}"
            target.copy_(local)
    return full
