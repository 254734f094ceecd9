"""torch.distributed for the entrypoint: which device this process uses, the process group
(nccl on CUDA, gloo on CPU), and the few collectives the loop needs.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; without them (a
plain `python -m launcher.train`) this is a world of one on 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import typing
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from launcher.errors import EnvironmentProblem

if typing.TYPE_CHECKING:
    from launcher.planning.layout import Layout

ERROR_KEY = "fp8launch/error_reported"
"""Store key the first rank to report an error sets, so the message is printed once."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DistEnv:
    """Where this process sits in the job and what it computes on."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    """nccl | gloo: the backend of the device's collectives"""
    process_group: str = ""
    """What the default process group was created with: "nccl", "gloo" or "cpu:gloo,cuda:nccl"."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_ranks() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) outside torchrun."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def resolve_device(setting: str, local_rank: int = 0) -> torch.device:
    """launch.device -> this process's device. auto: CUDA when a GPU is visible, else CPU.
    `cuda` without a GPU is an environment problem (exit 3), never a silent CPU run."""
    if setting == "cpu":
        return torch.device("cpu")
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if setting == "cuda" and not has_gpu:
        raise EnvironmentProblem(
            'launch.device = "cuda" but torch sees no CUDA GPU here '
            f"(torch {torch.__version__}, CUDA {'build' if torch.version.cuda else 'not in this build'}); "
            'fix: run on a machine with a GPU and a CUDA build of torch, or set launch.device = "cpu" (or "auto")'
        )
    if setting not in ("auto", "cuda"):
        raise EnvironmentProblem(f"launch.device = {setting!r} is not one of auto, cuda, cpu; "
                                 "fix: regenerate plan.json with `fp8launch plan`")
    if not has_gpu:
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise EnvironmentProblem(
            f"local rank {local_rank} has no GPU: this node shows {count}; "
            "fix: set distributed.procs_per_node to at most the number of GPUs per node"
        )
    return torch.device("cuda", local_rank)


def process_group_backend(device_type: str, cpu_tensors: bool) -> str:
    """The backend string for init_process_group: gloo on CPU, nccl on CUDA, and
    "cpu:gloo,cuda:nccl" on CUDA when collectives also run on CPU tensors (FSDP2's cpu_offload
    keeps the sharded parameters and gradients on the CPU: the gradient-norm reduction and the
    float8 scale all-reduce run there, and NCCL cannot reduce CPU tensors)."""
    if device_type != "cuda":
        return "gloo"
    return "cpu:gloo,cuda:nccl" if cpu_tensors else "nccl"


def holds_cpu_tensors(plan) -> bool:
    """Whether a GPU run of `plan` keeps tensors that collectives touch on the CPU."""
    d = plan.distributed
    return bool((d.strategy == "fsdp2" and d.fsdp2.cpu_offload)
                or (d.strategy == "deepspeed" and (d.deepspeed.offload_optimizer != "none" or d.deepspeed.offload_param != "none")))


def init(device_setting: str, timeout_s: float = 600.0, *, cpu_tensors: bool = False) -> DistEnv:
    """Resolve the device, then join the process group (gloo on CPU, nccl on CUDA, both where
    `cpu_tensors`: see process_group_backend)."""
    rank, local_rank, world_size = env_ranks()
    device = resolve_device(device_setting, local_rank)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        backend = "gloo"
    group = process_group_backend(device.type, cpu_tensors)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=group, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device, backend=backend, process_group=group)


def destroy() -> None:
    """Leave the process group (safe to call when none was joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_now(code: int) -> typing.NoReturn:
    """Leave the process with `code` without finalizing the interpreter, as every process that used a
    gloo group must: gloo's worker threads outlive destroy_process_group (ProcessGroupGloo has no
    shutdown), and one that releases the tensors of the last collective (a checkpoint's closing
    broadcast, say) while the interpreter finalizes takes the GIL and aborts the process ("terminate
    called without an active exception", SIGABRT), turning finished work into a failure. The caller
    has closed what it wrote; logging and stdio are flushed here."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # its file on a full disk (the error is reported already), or closed
            pass
    os._exit(code)


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum `values` over every rank (in place; a no-op in a world of one)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def first_to_report(wait_s: float = 2.0) -> bool:
    """Whether this rank should print a run-time error: rank 0 always claims it; another
    rank prints only if rank 0 has not claimed it within `wait_s` (the error was its own).

    Before the process group exists there is no store: local rank 0 of each node prints.
    """
    rank, local_rank, _ = env_ranks()
    if not dist.is_initialized():
        return local_rank == 0
    try:
        store = dist.distributed_c10d._get_default_store()
        if rank == 0:
            store.set(ERROR_KEY, "0")
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if store.check([ERROR_KEY]):
                return False
            time.sleep(0.05)
        store.set(ERROR_KEY, str(rank))
        return True
    except Exception:  # the store may be gone when other ranks died: print rather than lose the message
        return True


def device_mesh(env: DistEnv, layout: Layout):
    """The job's DeviceMesh, as the job's layout says (launcher/planning/layout.py: the layout fsdp2.json
    shows): pp x dp_shard x cp x tp, each of pp, cp and tp only where above 1, with the layout's flattened dims
    (dp_shard_tp for a one-collective gradient norm, dp_shard_cp for FSDP2 under context parallel, as torchtitan).
    Ranks are row-major, so a TP group's ranks are adjacent: inside one node when tp divides procs_per_node (rule
    TP-DIVIDES-PROCS), where the TP collectives are fastest; then a CP group's, which exchange keys and values every
    attention; and a stage's ranks are adjacent, so the pipeline's point-to-point sends are what crosses nodes."""
    from torch.distributed.device_mesh import init_device_mesh

    if not layout.divides:
        raise _undivided(layout)
    mesh = init_device_mesh(env.device.type, layout.mesh_shape, mesh_dim_names=layout.mesh_names)
    for dims, name in layout.flattened:
        mesh[dims]._flatten(name)
    return mesh


def _undivided(layout: Layout) -> EnvironmentProblem:
    """The run-time twin of rules TP-DIVIDES-PROCS / PP-DIVIDES-WORLD / CP-DIVIDES-WORLD: this world is not the plan's."""
    if layout.pp == 1 and layout.cp == 1:
        return EnvironmentProblem(f"distributed.tensor_parallel = {layout.tp} does not divide the world size {layout.world_size}; "
                                  "fix: set distributed.tensor_parallel to a divisor of distributed.procs_per_node")
    degrees = " x ".join(f"{k} = {v}" for k, v in (("pipeline_parallel", layout.pp), ("context_parallel", layout.cp),
                                                   ("tensor_parallel", layout.tp)) if v > 1)
    return EnvironmentProblem(f"distributed.{degrees} does not divide the world size {layout.world_size}; "
                              "fix: set them to divisors of distributed.nodes x procs_per_node",
                              rule="PP-DIVIDES-WORLD" if layout.pp > 1 else "CP-DIVIDES-WORLD")


def check_world(planned: int, env: DistEnv) -> None:
    """The job torchrun started must be the one the plan describes (its batch sizes and configs assume it)."""
    if planned != env.world_size:
        raise EnvironmentProblem(
            f"the plan is for world size {planned} (distributed.nodes x procs_per_node) but {env.world_size} processes were started; "
            "fix: start it with the plan's torchrun.sh (or `fp8launch run`), or plan for this many processes"
        )


def all_reduce_max(values: torch.Tensor) -> torch.Tensor:
    """Element-wise max of `values` over every rank (in place; a no-op in a world of one)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values
