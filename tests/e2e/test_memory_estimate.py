"""The plan's model-state estimate against the bytes of the real parameter, gradient and
optimizer-state tensors after a real training step: within 5%."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launcher.planning.memory import estimate, model_params
from tests.train._engine_setup import make_plan

pytestmark = pytest.mark.slow
PROBE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "memory_probe.py")


def probe(plan_dir, procs: int) -> dict[int, dict]:
    """tests/memory_probe.py under torchrun on `procs` processes: {rank: its record} (rank 0's, or every rank's under pp)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs), PROBE, plan_dir],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return {rec["rank"]: rec for rec in (json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))}


@pytest.mark.parametrize("procs, keys", [
    (1, {"distributed.strategy": "ddp", "precision.mode": "bf16"}),
    (2, {"distributed.strategy": "fsdp2", "precision.mode": "bf16"}),
    (2, {"distributed.strategy": "fsdp2", "precision.mode": "fp8", "precision.torchao.skip_small": False,
         "precision.torchao.fsdp_float8_all_gather": True}),
    (2, {"distributed.strategy": "ddp", "precision.mode": "fp8", "precision.torchao.skip_small": False, "train.optimizer": "sgd"}),
    # context parallel: FSDP2 shards over dp_shard x cp, the CP group's 2 ranks included (1 x 2 here)
    (2, {"distributed.strategy": "fsdp2", "precision.mode": "bf16", "distributed.context_parallel": 2, "train.seq_len": 32}),
], ids=["ddp-bf16", "fsdp2-bf16", "fsdp2-fp8-allgather", "ddp-fp8-sgd", "fsdp2-cp2"])
def test_estimate_matches_the_real_tensors_within_5_percent(tmp_path, procs, keys):
    plan, plan_dir = make_plan(tmp_path, **{"distributed.procs_per_node": procs, "train.model": "builtin:llama-debug", **keys})
    real = probe(plan_dir, procs)[0]
    params = model_params(plan.train.model)
    assert real["param_count"] == params
    est = {row.name: row.bytes_per_gpu(params) for row in estimate(plan, params).rows}
    assert set(est) == {"params", "grads", "optimizer_states"}
    for name, expected in est.items():
        assert real[name] == pytest.approx(expected, rel=0.05), (name, real[name], expected)


@pytest.mark.parametrize("keys", [{"precision.mode": "bf16"}, {"precision.mode": "fp8", "precision.torchao.skip_small": False}],
                         ids=["bf16", "fp8"])
def test_each_pipeline_stage_holds_the_states_its_estimate_says(tmp_path, keys):
    """pp 2 on 2 processes, builtin:llama-debug's 4 blocks: stage 0 holds blocks 0-1 and the embedding, stage 1 blocks 2-3,
    the final norm and the output layer; each rank's real parameter, gradient and optimizer-state tensors after a step
    through the schedule against its stage's estimate (launcher/planning/memory.py stage_estimate): within 5%."""
    from launcher.planning.memory import model_config, stage_estimate

    plan, plan_dir = make_plan(tmp_path, **{"distributed.procs_per_node": 2, "distributed.strategy": "fsdp2",
                                            "distributed.pipeline_parallel": 2, "distributed.pipeline.microbatches": 2,
                                            "train.micro_batch_size": 2, "train.model": "builtin:llama-debug", **keys})
    real = probe(plan_dir, 2)
    assert sorted(real) == [0, 1]
    cfg = model_config(plan.train.model)
    stages = [stage_estimate(plan, cfg, s) for s in (0, 1)]
    assert sum(e.params for e in stages) == model_params(plan.train.model)  # the stages hold the whole model once
    for rank, stage in enumerate(stages):
        assert real[rank]["param_count"] == stage.params, (rank, real[rank]["param_count"], stage.params)
        for row in stage.rows:
            assert real[rank][row.name] == pytest.approx(row.bytes_per_gpu(stage.params), rel=0.05), (rank, row.name)
