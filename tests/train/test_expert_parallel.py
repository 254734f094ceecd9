"""Expert parallelism (launcher/train/parallel/expert_parallel.py): the token exchange and the gradients.

- The routing indices group received rows expert-major and pad each expert's group (pure function), and
  the vectorised `_routing` gives exactly what the per-row Python walk it replaced gave (kept here as the
  reference; benchmarks/ep_routing.py times the two).
- dispatch then combine returns every row to its place, exactly (1 rank in-process; 2 ranks spawned).
- 2 ranks with expert_parallel = 2 and FSDP2 (experts over "efsdp", dense over all ranks, the gradient
  divide factor) compute the loss and every gradient one process computes on the same global batch.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from launcher.planning.layout import Layout
from launcher.train.parallel.distributed import DistEnv
from launcher.train.parallel.expert_parallel import (
    _routing,
    apply_expert_parallel,
    combine_tokens,
    dispatch_tokens,
    ep_mesh,
    expert_parallel_degree,
    shard_experts,
)

from ._engine_setup import gloo_world, spawn_ranks

E, DIM, HIDDEN, TOP_K = 4, 8, 16, 2


class GroupedExperts(nn.Module):
    """torchtitan's interface (a test double: the builtin MoE lives in launcher/train/models/moe.py)."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(E, HIDDEN, DIM) * 0.3)
        self.w2 = nn.Parameter(torch.randn(E, DIM, HIDDEN) * 0.3)
        self.w3 = nn.Parameter(torch.randn(E, HIDDEN, DIM) * 0.3)

    def forward(self, x, num_tokens_per_expert):
        from torch.distributed.tensor import DTensor

        w1, w2, w3 = (w.to_local() if isinstance(w, DTensor) else w for w in (self.w1, self.w2, self.w3))
        out, start = [], 0
        for e, n in enumerate(num_tokens_per_expert.tolist()):
            h = x[start:start + n]
            out.append((torch.nn.functional.silu(h @ w1[e].T) * (h @ w3[e].T)) @ w2[e].T)
            start += n
        return torch.cat(out)


class TinyMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(DIM, E, bias=False)
        self.experts = GroupedExperts()
        self.out = nn.Linear(DIM, 3, bias=False)

    def forward(self, x):
        scores = self.router(x).softmax(-1)
        top, ids = scores.topk(TOP_K, dim=-1)
        order = ids.view(-1).argsort(stable=True)
        counts = torch.bincount(ids.view(-1), minlength=E)
        rows = x[order // TOP_K]
        y = self.experts(rows, counts) * top.view(-1)[order].unsqueeze(1)
        moe = torch.zeros_like(x).index_add(0, order // TOP_K, y)
        return self.out(x + moe)


def test_routing_groups_rows_expert_major_and_pads_each_group():
    # 2 ranks x 2 local experts: rank 0 sent 1 row for expert 0, 2 for expert 1; rank 1 sent 3 and 0
    counts = torch.tensor([[1, 2], [3, 0]])
    padded, gather, place = _routing(counts, ep=2, align=4)
    assert padded.tolist() == [4, 4]
    pad = 6  # the zero row's index: after the 6 received rows
    # received rows: r0e0=[0], r0e1=[1,2], r1e0=[3,4,5]
    assert gather.tolist() == [0, 3, 4, 5, 1, 2, pad, pad]
    assert place.tolist() == [0, 4, 5, 1, 2, 3]
    assert all(gather[place[i]] == i for i in range(6))  # place inverts gather on the real rows
    assert _routing(torch.tensor([[0, 5]]), ep=1, align=4)[0].tolist() == [4, 8]  # an empty expert still gets `align` rows


def routing_reference(counts: torch.Tensor, ep: int, align: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_routing` as it was before it was vectorised (issue 28): one Python iteration per received row."""
    e = counts.shape[1]
    flat = counts.reshape(-1).tolist()
    starts, at = [], 0
    for n in flat:
        starts.append(at)
        at += n
    total = at
    gather, place = [], [0] * total
    padded = []
    for j in range(e):  # expert-major: expert j's rows from rank 0, rank 1, ..., then zero rows
        size = 0
        for r in range(ep):
            s, n = starts[r * e + j], flat[r * e + j]
            for k in range(n):
                place[s + k] = len(gather)
                gather.append(s + k)
            size += n
        pad = (-size) % align if size or align == 1 else align  # an empty group still gets `align` rows (as torchtitan's)
        gather.extend([total] * pad)
        padded.append(size + pad)
    return (torch.tensor(padded, dtype=torch.int64), torch.tensor(gather, dtype=torch.int64),
            torch.tensor(place, dtype=torch.int64))


def _random_counts(gen: torch.Generator, ep: int, e: int) -> torch.Tensor:
    """(ep, e) received counts: all zero, sparse (most entries zero), up to a few hundred rows, or under 5."""
    kind = int(torch.randint(4, (1,), generator=gen))
    if kind == 0:
        return torch.zeros(ep, e, dtype=torch.int64)
    high = (3, 40, 300, 5)[kind]
    counts = torch.randint(high, (ep, e), generator=gen)
    if kind == 1:
        counts *= torch.rand(ep, e, generator=gen) < 0.3
    return counts


@pytest.mark.parametrize("align", [1, 16, 32])
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_routing_equals_the_python_walk_it_replaced(ep, align):
    gen = torch.Generator().manual_seed(1000 * ep + align)
    seen_empty_group = seen_empty_matrix = False
    for case in range(120):
        e = 1 + case % 8
        counts = _random_counts(gen, ep, e)
        if case % 5 == 0:  # whole experts without a row from any rank
            counts[:, torch.rand(e, generator=gen) < 0.4] = 0
        want = routing_reference(counts, ep, align)
        got = _routing(counts, ep, align)
        for name, w, g in zip(("padded", "gather", "place"), want, got):
            assert g.dtype == torch.int64 and g.device == w.device, (name, g.dtype, g.device)
            assert torch.equal(g, w), f"{name} differs for counts {counts.tolist()}, align {align}: {g.tolist()} != {w.tolist()}"
        seen_empty_group |= bool((counts.sum(0) == 0).any()) and not bool((counts == 0).all())
        seen_empty_matrix |= bool((counts == 0).all())
    assert seen_empty_group and seen_empty_matrix  # the cases the padding rule is about were drawn


def test_routing_accepts_int32_counts_and_an_all_empty_matrix():
    counts = torch.tensor([[3, 0, 5], [0, 0, 2]], dtype=torch.int32)
    for align in (1, 4):
        for w, g in zip(routing_reference(counts, 2, align), _routing(counts, 2, align)):
            assert g.dtype == torch.int64 and torch.equal(g, w)
    padded, gather, place = _routing(torch.zeros(2, 3, dtype=torch.int64), 2, 32)
    assert padded.tolist() == [32, 32, 32] and gather.tolist() == [0] * 96 and place.shape == (0,)
    padded, gather, place = _routing(torch.zeros(2, 3, dtype=torch.int64), 2, 1)
    assert padded.tolist() == [0, 0, 0] and gather.shape == (0,) and place.shape == (0,)


def test_dispatch_then_combine_returns_every_row_in_one_process():
    with gloo_world(0, 1):
        mesh = ep_mesh(DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo"),
                       Layout.of_degrees(1))[0]["ep"]
        x = torch.randn(7, DIM)
        counts = torch.tensor([3, 0, 4, 0])
        rows, local, routing = dispatch_tokens(x, counts, mesh, align=4)
        assert local.tolist() == [4, 4, 4, 4] and rows.shape == (16, DIM)
        assert torch.equal(rows[:3], x[:3]) and torch.equal(rows[8:12], x[3:]) and not rows[3].any()
        assert torch.equal(combine_tokens(rows, routing, mesh), x)


def _round_trip(rank: int, world: int, port: int) -> None:
    with gloo_world(rank, world, port):
        mesh = ep_mesh(DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"), backend="gloo"),
                       Layout.of_degrees(world, ep=2))[0]["ep"]
        counts = torch.tensor([[2, 1, 0, 3], [0, 4, 1, 1]])[rank]  # rank 0: 6 rows, rank 1: 6 rows
        x = torch.arange(int(counts.sum()) * DIM, dtype=torch.float32).view(-1, DIM) + 1000 * rank
        rows, local, routing = dispatch_tokens(x, counts, mesh, align=4)
        # rank 0 holds experts 0, 1: expert 0 gets rank 0's 2 rows then rank 1's 0; expert 1: 1 row then 4
        want = {0: ([2, 1], [0, 4]), 1: ([0, 3], [1, 1])}[rank]
        assert local.tolist() == [4, 8] if rank == 0 else local.tolist() == [4, 4]
        assert routing.input_splits == [int(counts[:2].sum()), int(counts[2:].sum())]
        assert sum(routing.output_splits) == sum(want[0]) + sum(want[1])
        assert torch.equal(combine_tokens(rows * 1, routing, mesh), x)  # exact: every row back in its place


@pytest.mark.slow
def test_dispatch_then_combine_returns_every_row_on_two_ranks():
    spawn_ranks(_round_trip, 2)


def _global_batch() -> torch.Tensor:
    return torch.randn(2, 12, DIM, generator=torch.Generator().manual_seed(1))


def _reference() -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = TinyMoE()
    batch = _global_batch()
    loss = torch.stack([model(batch[r]).square().mean() for r in range(2)]).mean()  # the mean over the global batch
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _ep_gradients(rank: int, world: int, port: int, ref_loss: float, ref_grads: dict) -> None:
    from torch.distributed.fsdp import fully_shard

    with gloo_world(rank, world, port):
        env = DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"), backend="gloo")
        torch.manual_seed(0)
        model = TinyMoE()
        mesh, dense = ep_mesh(env, Layout.of_degrees(world, ep=2))
        experts = apply_expert_parallel(model, mesh["ep"])
        assert [n for n, _ in experts] == ["experts"] and model.experts.w1.to_local().shape[0] == E // 2
        shard_experts(experts, mesh["efsdp"], world)
        fully_shard(model, mesh=dense)
        assert expert_parallel_degree(model) == 2
        loss = model(_global_batch()[rank]).square().mean()
        loss.backward()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        assert abs(mean.item() / world - ref_loss) < 1e-6 * abs(ref_loss), (mean.item() / world, ref_loss)
        for name, p in model.named_parameters():
            got = p.grad.full_tensor()
            torch.testing.assert_close(got, ref_grads[name], rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")


@pytest.mark.slow
def test_two_rank_expert_parallel_gradients_equal_one_process_on_the_same_global_batch():
    loss, grads = _reference()
    spawn_ranks(_ep_gradients, 2, loss, grads)
