"""What planning (torch-free) says of a pipeline's layout against what torch.distributed.pipelining (torch 2.13) does:
which stages each pipeline rank holds (generate_rank_to_stage_mapping), and how many forward activations a rank holds
at its schedule's peak, counted in torch's own order of actions (the schedules' pipeline_order, built by torch's
_schedule_visualizer.get_schedule_ops with stand-in stages): the memory estimate's `in_flight`. If a torch release
changes either, these fail and name the layout."""

from __future__ import annotations

import pytest

from launcher.planning.memory import estimate, in_flight, schedule_in_flight, stage_estimate
from launcher.planning.models import builtin_config, param_count
from test_rules import plan_of


def _plan(schedule: str, pp: int, microbatches: int, stages_per_rank: int = 0, layers: int = 24):
    return plan_of({"precision": {"mode": "bf16"},
                    "distributed": {"strategy": "fsdp2", "procs_per_node": pp, "pipeline_parallel": pp,
                                    "pipeline": {"schedule": schedule, "microbatches": microbatches,
                                                 "stages_per_rank": stages_per_rank}},
                    "train": {"model": f"builtin:llama-debug?layers={layers}", "micro_batch_size": microbatches}})


LAYOUTS = [(s, pp, v) for s, v in (("1F1B", 1), ("GPipe", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 3),
                                   ("ZBVZeroBubble", 2)) for pp in (2, 3, 4)]


@pytest.mark.parametrize("schedule,pp,v", LAYOUTS)
def test_each_pipeline_rank_holds_the_stages_torch_gives_it(schedule, pp, v):
    from torch.distributed.pipelining._utils import generate_rank_to_stage_mapping

    plan = _plan(schedule, pp, 2 * pp, v if v > 1 else 0)
    style = "v" if schedule == "ZBVZeroBubble" else "loop"
    assert plan.distributed.pipeline_stages == pp * v
    torch_says = generate_rank_to_stage_mapping(pp, pp * v, style)
    assert {r: list(plan.distributed.layout().rank_stages(r)) for r in range(pp)} == torch_says


def _torch_peaks(schedule: str, pp: int, n: int, v: int) -> list[int]:
    """Each rank's most forwards not yet freed by their backward (a full backward, or the weight half of a split one)."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    from torch.distributed.pipelining.schedules import _ComputationType as C

    peaks = []
    for actions in get_schedule_ops(schedule, pp, n, v):
        live = peak = 0
        for a in filter(None, actions):
            live += {C.FORWARD: 1, C.FULL_BACKWARD: -1, C.BACKWARD_WEIGHT: -1}.get(a.computation_type, 0)
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


@pytest.mark.parametrize("schedule,pp,v", LAYOUTS)
def test_in_flight_is_the_peak_of_torchs_own_schedule(schedule, pp, v):
    """Every micro-batch count from pp to 3 x pp that the schedule takes (Interleaved1F1B refuses some: rule
    PP-MICROBATCHES)."""
    checked = 0
    for n in range(pp, 3 * pp + 1):
        if schedule == "Interleaved1F1B" and n % max(1, n // pp):
            continue
        plan = _plan(schedule, pp, n, v if v > 1 else 0)
        assert [schedule_in_flight(plan, r) for r in range(pp)] == _torch_peaks(schedule, pp, n, v), (schedule, pp, v, n)
        if schedule != "ZBVZeroBubble":  # what torch 2.13's ZBV keeps beyond its order: tests/test_activation_memory.py
            assert [in_flight(plan, r) for r in range(pp)] == _torch_peaks(schedule, pp, n, v)
        checked += 1
    assert checked >= pp


def test_an_interleaved_rank_holds_its_stages_blocks_and_more_micro_batches_of_smaller_stages():
    """pp 4 x 2 stages a rank of llama3-8b's 32 blocks: 8 stages of 4 blocks; rank 0 holds stages 0 and 4 (blocks 0-3 and
    16-19, the embedding), rank 3 stages 3 and 7 (the output layer). Its activations: 4-block stages, warm-up + 1
    micro-batch-stages in flight; a 1F1B rank 0 of 8 blocks holds 4 micro-batches."""
    base = {"precision": {"mode": "bf16"}, "launch": {"device": "cuda", "gpu": "h100"},
            "train": {"model": "builtin:llama3-8b", "seq_len": 8192, "micro_batch_size": 8}}
    pipe = {"strategy": "fsdp2", "procs_per_node": 8, "pipeline_parallel": 4, "pipeline": {"microbatches": 8}}
    looped = plan_of({**base, "distributed": {**pipe, "pipeline": {"microbatches": 8, "schedule": "Interleaved1F1B"}}})
    plain = plan_of({**base, "distributed": pipe})
    cfg = builtin_config("builtin:llama3-8b")
    ranks = [stage_estimate(looped, cfg, r) for r in range(4)]
    assert sum(e.params for e in ranks) == param_count(cfg)
    assert ranks[0].stage.startswith("pipeline rank 0, stages 0, 4 of 8: blocks 0-3, 16-19, the embedding")
    assert ranks[3].stage.endswith("blocks 12-15, 28-31, the output layer")
    assert [in_flight(looped, r) for r in range(4)] == [11, 9, 7, 5]  # (2 - 1) x 8 micro-batches a round + 2 x (3 - r) + 1
    one = stage_estimate(plain, cfg, 0).activations.bytes / in_flight(plain, 0)  # one micro-batch through 8 blocks
    assert ranks[0].activations.bytes == pytest.approx(one / 2 * 11, rel=1e-9)  # through 4 blocks, 11 at once
    assert "11 micro-batches x stage" in ranks[0].activations.how
    assert estimate(looped, param_count(cfg)).peak_bytes == max(e.peak_bytes for e in ranks)


def test_the_plan_says_how_many_stages_a_rank_holds():
    from launcher.commands.plan_text import pipeline_words

    assert pipeline_words(_plan("Interleaved1F1B", 2, 4)).startswith(", pipeline parallel 2 (Interleaved1F1B, 2 stages a rank, 4 "
                                                                       "micro-batches; mesh pp 2 x dp 1)")
    assert pipeline_words(_plan("1F1B", 2, 4)).startswith(", pipeline parallel 2 (1F1B, 4 micro-batches;")
