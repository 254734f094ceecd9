"""Shared by test_engines.py and test_loop.py: a one-process gloo group, and plans planned
from a small spec into a folder (plan.json + the engine configs the engines read)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.commands.plan import plan_one
from launcher.targets.files import write
from launcher.train.parallel.distributed import DistEnv, exit_now
from tests.support import free_port, write_toml_spec

CPU = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")

BASE = {
    "version": 1,
    "name": "t",
    "launch.device": "cpu",
    "distributed.procs_per_node": 1,
    "train.seq_len": 16,
    "train.steps": 4,
    "train.lr": 1e-3,
}


def _run_then_leave(rank: int, fn, *args) -> None:
    """A spawned rank: `fn(rank, *args)`, then leave as the entrypoint does after a gloo run
    (`launcher.train.parallel.distributed.exit_now`: gloo's threads abort a finalizing interpreter after the
    work passed). A failure still raises, so spawn reports its traceback."""
    fn(rank, *args)
    exit_now(0)


def spawn_ranks(fn, world_size: int, *args) -> None:
    """`fn(rank, world_size, port, *args)` on `world_size` real processes joined by a free port."""
    torch.multiprocessing.spawn(_run_then_leave, args=(fn, world_size, free_port(), *args), nprocs=world_size, join=True)


@contextmanager
def torchrun_env(rank: int = 0, world_size: int = 1, port: int | None = None):
    """The environment torchrun gives `rank` of `world_size` (a free port), restored afterwards."""
    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port or free_port()), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def gloo_world(rank: int = 0, world_size: int = 1, port: int | None = None):
    """Join a gloo process group as `rank` of `world_size` (what torchrun's environment gives)."""
    with torchrun_env(rank, world_size, port):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        try:
            yield
        finally:
            dist.destroy_process_group()
            _forget_deepspeed_groups()


def _forget_deepspeed_groups() -> None:
    """DeepSpeed keeps the process groups of the first world it saw in module globals (deepspeed/utils/groups.py):
    a later test's world in the same process would meet them stale ("Group ... is not registered"). A real run is
    one world per process; a test process joins several."""
    import sys

    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:
        return
    for name, value in list(vars(groups).items()):
        if name.startswith("_") and name.isupper() and (value is None or isinstance(value, (dict, list)) or hasattr(value, "rank")):
            setattr(groups, name, type(value)() if isinstance(value, (dict, list)) else None)


@contextmanager
def world_of_one():
    """A gloo process group of this process alone (what torchrun with one process gives)."""
    with gloo_world():
        yield CPU


def make_plan(tmp_path: Path, **keys):
    """Plan a spec made of BASE plus `keys` (dotted, with "__" for "." in keyword form) into
    tmp_path/gen/t/; return (plan, plan_dir)."""
    values = {**BASE, **{k.replace("__", "."): v for k, v in keys.items()}}
    spec = write_toml_spec(tmp_path / "spec.toml", values)
    planned = plan_one(str(spec), str(tmp_path / "gen"))
    write(planned.folder, planned.files)
    return planned.plan, planned.folder


def tiny_model(seed: int = 0):
    """builtin:llama-debug cut to 2 layers (fast on CPU)."""
    from launcher.train.models import build_model

    torch.manual_seed(seed)
    return build_model("builtin:llama-debug?layers=2", ".")


def token_batches(n: int, *, batch: int = 2, seq_len: int = 16, vocab: int = 2048, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq_len + 1), generator=g) for _ in range(n)]


def train_in_process(plan_json: str, *, stream=None):
    """What `fp8launch run` does for one process, in this one: a world of one (the environment torchrun gives),
    build_run, train, close the logger, leave the process group. Returns the Trainer."""
    from launcher.train.main import build_run
    from launcher.train.parallel import distributed

    with torchrun_env():
        try:
            trainer, logger = build_run(plan_json, stream=stream)
            try:
                trainer.run()
            finally:
                logger.close()
            return trainer
        finally:
            distributed.destroy()
            _forget_deepspeed_groups()
