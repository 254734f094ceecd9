"""launcher/train/compat.py: where torch lacks a newer API (torch 2.11 has no all_gather_single / reduce_scatter_single),
the floor's equivalent gives the same numbers. Two real gloo ranks train with FP8 gradient reduction under DDP (the
hook's FP8 all-gather) and FSDP2 (the custom bf16 reduce-scatter), once with torch's names as installed and once
with the newer names removed from the torch.distributed that compat.py sees (torch's own FSDP2 still calls them
on torch 2.13): the weights after the steps are bit for bit the same."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher.train import compat
from launcher.train.parallel.grad_reduce import CommMeter, HookState, ddp_hook, reduce_scatter_class

from ._engine_setup import gloo_world, spawn_ranks

NEWER = ("all_gather_single", "reduce_scatter_single")


class _Without:
    """torch.distributed as a torch without `names` shows it."""

    def __init__(self, module, names):
        self._module, self._names = module, names

    def __getattr__(self, name):
        if name in self._names:
            raise AttributeError(name)
        return getattr(self._module, name)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.ReLU(), nn.Linear(96, 40))


def _train(wrap, rank: int) -> list[torch.Tensor]:
    model = wrap(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(10 + rank)  # each rank its own data: the reduction matters
    for _ in range(2):
        loss = model(torch.randn(8, 48, generator=g)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for p in model.parameters()]


def _ddp(model):
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(HookState("fp8", None, CommMeter()), ddp_hook)
    return ddp


def _fsdp2(model):
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    model.set_custom_reduce_scatter(reduce_scatter_class()("bf16", CommMeter()))
    model.set_force_sum_reduction_for_comms(True)
    return model


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    with gloo_world(rank, world_size, port):
        result = {"had": [hasattr(dist, n) for n in NEWER]}
        for name, wrap in (("ddp", _ddp), ("fsdp2", _fsdp2)):
            result[name] = _train(wrap, rank)
        compat.dist = _Without(dist, NEWER)
        try:
            result["removed"] = [hasattr(compat.dist, n) for n in NEWER]
            for name, wrap in (("ddp", _ddp), ("fsdp2", _fsdp2)):
                result[f"{name}_floor"] = _train(wrap, rank)
        finally:
            compat.dist = dist
        torch.save(result, f"{out}/rank{rank}.pt")


def test_fp8_grad_reduction_trains_the_same_without_torchs_newer_collectives(tmp_path):
    spawn_ranks(_worker, 2, str(tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["removed"] == [False, False]
    for engine in ("ddp", "fsdp2"):
        start = list(_model().parameters())
        for r in (r0, r1):
            assert all(torch.equal(a, b) for a, b in zip(r[engine], r[f"{engine}_floor"], strict=True)), engine
            assert not torch.equal(r[engine][0], start[0].detach())  # it trained
        assert all(torch.equal(a, b) for a, b in zip(r0[engine], r1[engine], strict=True))  # replicas agree


def test_the_fallbacks_name_the_floors_collectives(monkeypatch):
    """Without the newer names the calls go to all_gather_into_tensor / reduce_scatter_tensor, arguments unchanged."""
    calls = []
    floor = _Without(dist, NEWER)
    monkeypatch.setattr(compat, "dist", floor)
    monkeypatch.setattr(dist, "all_gather_into_tensor", lambda o, i, group=None: calls.append(("ag", o, i, group)))
    monkeypatch.setattr(dist, "reduce_scatter_tensor", lambda o, i, op=None, group=None: calls.append(("rs", o, i, op, group)))
    compat.all_gather_single("out", "in", group="g")
    compat.reduce_scatter_single("out", "in", dist.ReduceOp.AVG, group="g")
    assert calls == [("ag", "out", "in", "g"), ("rs", "out", "in", dist.ReduceOp.AVG, "g")]


class _Stage:
    def __init__(self, hook: str):
        self.calls = []
        setattr(self, hook, lambda *a, **k: self.calls.append(("inner", a, k)) or "meta")


@pytest.mark.parametrize("hook", ["_post_metadata_inference_cleanup", "_shape_inference"])
def test_after_shape_inference_runs_after_the_hook_this_torch_has(hook):
    stage = _Stage(hook)
    compat.after_shape_inference(stage, lambda: stage.calls.append("after"))
    assert getattr(stage, hook)(1, k=2) == "meta"
    assert stage.calls == [("inner", (1,), {"k": 2}), "after"]


def test_a_real_pipeline_stage_calls_back_once_after_inferring_its_shapes():
    """torch's own PipelineStage (one rank, one stage): the callback runs once, after the shape-inference pass, and the
    module's forwards are that pass plus one a micro-batch."""
    from torch.distributed import pipelining

    with gloo_world():
        forwards = []

        class Counted(nn.Linear):
            def forward(self, x):
                forwards.append(len(seen))
                return super().forward(x)

        seen = []
        stage = pipelining.PipelineStage(Counted(8, 8), 0, 1, torch.device("cpu"), group=dist.group.WORLD)
        compat.after_shape_inference(stage, lambda: seen.append(len(forwards)))
        schedule = pipelining.ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda y, t: (y - t).square().mean())
        schedule.step(torch.randn(4, 8), target=torch.zeros(4, 8))
    assert seen == [1] and forwards == [0, 1, 1]
