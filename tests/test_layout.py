"""launcher/planning/layout.py against the arithmetic it replaced, written out here as each module computed it before
(planning/plan.py's data_parallel, mesh and rank_stages, rules/predicates.py's tokens_per_rank, train/parallel/
distributed.py's data_rank, train/parallel/pipeline.py's stage_of, train/loop.py's and evaluate.py's loss ranks): the
same numbers for every spec in specs/ and tests/cases/valid, and for a spread of degrees, so that moving the arithmetic
into one place changed no plan and no run."""

from __future__ import annotations

import glob
import itertools
import os

import pytest

from conftest import CASES
from launcher.planning.layout import Layout
from launcher.planning.plan import resolve
from launcher.planning.read import read_spec, validate
from launcher.planning.rules import Facts
from launcher.planning.rules.predicates import tokens_per_rank
from test_rules import plan_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = sorted(glob.glob(os.path.join(ROOT, "specs", "*.toml")) + glob.glob(os.path.join(CASES, "valid", "*", "spec.*")))


def _old_mesh(d, world):
    dp = max(1, world // (d.tensor_parallel * d.context_parallel * d.pipeline_parallel))
    return tuple((name, n) for name, n in (("pp", d.pipeline_parallel), ("dp_shard", dp), ("cp", d.context_parallel),
                                           ("tp", d.tensor_parallel)) if name == "dp_shard" or n > 1)


def _old_rank_stages(d, pp_rank):
    pp, local = d.pipeline_parallel, d.pipeline.local_stages
    if d.pipeline.schedule == "ZBVZeroBubble":
        return (pp_rank, 2 * pp - 1 - pp_rank)
    return tuple(range(pp_rank, pp * local, pp))


def _old_data_rank(rank, world, tp, pp, cp):
    per_stage = world // pp
    return (rank % per_stage) // (tp * cp), per_stage // (tp * cp)


def _old_tokens_per_rank(plan):
    t, d = plan.train, plan.distributed
    sequences = t.micro_batch_size * t.grad_accum_steps // plan.pipeline_microbatches if d.pipeline_parallel > 1 \
        else t.micro_batch_size
    return sequences * t.seq_len // (max(1, d.tensor_parallel) * max(1, d.context_parallel))


def _same_as_before(plan) -> None:
    d, world = plan.distributed, plan.world_size
    layout = d.layout()
    assert (layout.world_size, layout.tp, layout.cp, layout.pp, layout.ep) == \
        (world, d.tensor_parallel, d.context_parallel, d.pipeline_parallel, d.expert_parallel)
    assert layout.dp == max(1, world // (d.tensor_parallel * d.context_parallel * d.pipeline_parallel)) == d.data_parallel
    assert layout.mesh == _old_mesh(d, world)
    assert d.layout(2 * world).mesh == _old_mesh(d, 2 * world)
    assert layout.loss_ranks == world // d.pipeline_parallel
    assert layout.pipeline_stages == d.pipeline_parallel * d.pipeline.local_stages == d.pipeline_stages
    for pp_rank in range(d.pipeline_parallel):
        assert layout.rank_stages(pp_rank) == _old_rank_stages(d, pp_rank)
    for rank in range(world):
        assert layout.pipeline_rank(rank) == rank // (world // d.pipeline_parallel)
        assert layout.data_rank(rank) == _old_data_rank(rank, world, d.tensor_parallel, d.pipeline_parallel, d.context_parallel)
    assert tokens_per_rank(Facts(plan=plan)) == _old_tokens_per_rank(plan)


@pytest.mark.parametrize("path", SPECS, ids=[os.path.relpath(p, ROOT) for p in SPECS])
def test_every_spec_has_the_layout_it_had(path):
    source = read_spec(path)
    validate(source)
    _same_as_before(resolve(source))


DEGREES = [(w, tp, cp, pp) for w, tp, cp, pp in itertools.product((1, 2, 4, 8, 12), (1, 2), (1, 2), (1, 2, 4))
           if w % (tp * cp * pp) == 0 and not (cp > 1 and pp > 1)]


@pytest.mark.parametrize("world,tp,cp,pp", DEGREES)
def test_a_spread_of_degrees_has_the_layout_it_had(world, tp, cp, pp):
    pipeline = {"schedule": "1F1B", "microbatches": 2 * pp} if pp > 1 else {}
    _same_as_before(plan_of({"precision": {"mode": "bf16"},
                             "distributed": {"strategy": "fsdp2", "procs_per_node": world, "tensor_parallel": tp,
                                             "context_parallel": cp, "pipeline_parallel": pp, "pipeline": pipeline},
                             "train": {"model": "builtin:llama-debug?layers=8", "micro_batch_size": 2 * pp,
                                       "seq_len": 64}}))


@pytest.mark.parametrize("schedule,pp,v", [("Interleaved1F1B", 2, 2), ("Interleaved1F1B", 3, 3), ("ZBVZeroBubble", 4, 2)])
def test_multi_stage_schedules_map_stages_as_before(schedule, pp, v):
    plan = plan_of({"precision": {"mode": "bf16"},
                    "distributed": {"strategy": "fsdp2", "procs_per_node": 2 * pp, "pipeline_parallel": pp,
                                    "pipeline": {"schedule": schedule, "microbatches": 2 * pp, "stages_per_rank": v}},
                    "train": {"model": "builtin:llama-debug?layers=24", "micro_batch_size": 2 * pp}})
    _same_as_before(plan)
    layout = plan.distributed.layout()
    assert [layout.stages_of(r) for r in range(2 * pp)] == [layout.rank_stages(r // 2) for r in range(2 * pp)]


def test_the_mesh_of_each_degree_and_what_fsdp2_shards_over():
    layout = Layout.of_degrees(16, tp=2, pp=2)
    assert layout.mesh == (("pp", 2), ("dp_shard", 4), ("tp", 2)) and layout.mesh_shape == (2, 4, 2)
    assert layout.flattened == ((("dp_shard", "tp"), "dp_shard_tp"),) and layout.shard_dim == "dp_shard"
    assert layout.stage_dim == "dp_shard_tp" and layout.fsdp_ranks == 8 and layout.loss_ranks == 8
    cp = Layout.of_degrees(8, cp=2)
    assert cp.mesh_names == ("dp_shard", "cp") and cp.shard_dim == "dp_shard_cp" and cp.fsdp_ranks == 8
    assert Layout.of_degrees(8).shard_dim is None and Layout.of_degrees(8, ep=4).expert_shards == 2
    assert Layout.of_degrees(6, tp=4).divides is False and Layout.of_degrees(6, tp=4).dp == 1
    assert Layout.of_degrees(4, tp=0, pp=0).split == 1  # an unchecked degree below 1 reads as off
