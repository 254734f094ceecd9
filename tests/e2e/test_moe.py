"""Expert parallelism end to end: real `fp8launch run` jobs (torchrun, gloo, 2 processes on this CPU)
of builtin:moe-debug (8 experts, 2 MoE layers) with distributed.expert_parallel = 2 and FSDP2.

- MXFP8 (torchao's emulated MXFP8 grouped GEMMs on CPU) under EP trains, its start record says
  effects.expert_parallel = 2 and lists the expert groups, and its mean loss over the 12 steps is within MEAN_GAP of
  its bf16 twin's.
- EP checkpoints resume bit-identically: losses after the resume point and the final DCP checkpoint
  (the experts' DTensors with their placements, optimizer state included) equal the uninterrupted run's.

~40 s on the 2-core development machine (4 runs of ~6-10 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import output_of, records, run, write_spec
from .test_resume import assert_same_dcp_checkpoint, losses, metrics, starts

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("moe_runs")]
"""Every test reads the module's `runs`: one worker (pytest -n, --dist loadgroup) builds them once."""

STEPS, CHECKPOINT = 12, 6
COMMON = dict(train__model="builtin:moe-debug", train__seq_len=32, train__micro_batch_size=2, train__lr=3e-3,
              train__warmup_steps=2, train__steps=STEPS, distributed__strategy="fsdp2", distributed__procs_per_node=2,
              distributed__expert_parallel=2)
MXFP8 = dict(precision__mode="fp8", precision__backend="torchao", precision__torchao__recipe="mxfp8")
BF16 = dict(precision__mode="bf16")
MEAN_GAP = 0.01
"""Bound on |mean loss of the MXFP8 run - its bf16 twin's| / the twin's, over the 12 steps. Measured over seeds 0-2 x
{AMX, AVX2} kernels (benchmarks/results/test_bounds.md): mean 0.05%, max 0.13%, sd 0.07% (the last step's loss, which
this test compared before within 5%: up to 1.3%); 2x the largest is 0.26%, the largest + 3 sd 0.34%: rounded up to 1%.
A run that does not learn stays near its first loss, 11-14% above the mean."""
LEARNS = 0.9
"""Bound on the mean loss of the last 3 steps / the first step's. The same runs: 0.787-0.828."""


def _run(folder: Path, name: str, *extra: str, **keys) -> Path:
    spec = write_spec(folder, name, **{**COMMON, "train__output_dir": f"runs/{name}", **keys})
    r, seconds = run(folder, "run", str(spec), *extra)
    assert r.returncode == 0, output_of(r)
    print(f"{name}: {seconds:.1f} s")
    return folder / "runs" / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("moe")
    _run(folder, "ep2-mxfp8", **MXFP8, train__checkpoint_every=CHECKPOINT)
    _run(folder, "ep2-bf16", **BF16)
    return folder


def test_mxfp8_with_expert_parallel_2_trains_like_bf16(runs):
    mx, bf16 = records(runs / "runs" / "ep2-mxfp8"), records(runs / "runs" / "ep2-bf16")
    for recs in (mx, bf16):
        assert recs.start["world_size"] == 2 and recs.start["strategy"] == "fsdp2"
        assert recs.start["effects"]["expert_parallel"] == 2
        ep = recs.start["expert_parallel"]
        assert (ep["expert_parallel"], ep["experts"], ep["local_experts"]) == (2, 8, 4)
        assert ep["expert_groups"] == ["layers.0.moe.experts", "layers.1.moe.experts"]
        assert [r["step"] for r in recs.steps] == list(range(1, STEPS + 1))
        assert recs.tail_loss() < LEARNS * recs.losses[0]  # it learns
    for group in mx.start["expert_parallel"]["expert_groups"]:  # the grouped experts as built: MXFP8
        assert mx.start["layers"].get(group, "").startswith("fp8 mxfp8"), mx.start["layers"]
    mean = [sum(recs.losses) / STEPS for recs in (mx, bf16)]
    print(f"mean loss mxfp8 {mean[0]:.4f} vs bf16 {mean[1]:.4f}; tail-3 {mx.tail_loss():.4f} vs {bf16.tail_loss():.4f}")
    assert abs(mean[0] - mean[1]) <= MEAN_GAP * mean[1], (mx.losses, bf16.losses)


def test_expert_parallel_checkpoint_resumes_bit_identically(runs, tmp_path):
    ref = runs / "runs" / "ep2-mxfp8"
    spec = runs / "ep2-mxfp8.toml"
    r, seconds = run(runs, "run", str(spec), "--set", "train.output_dir=runs/ep2-mxfp8-resumed",
                     "--set", f"train.resume=runs/ep2-mxfp8/checkpoints/step-{CHECKPOINT}")
    assert r.returncode == 0, output_of(r)
    print(f"resumed at step {CHECKPOINT} in {seconds:.1f} s")
    out = runs / "runs" / "ep2-mxfp8-resumed"
    records_ = metrics(out)
    (start,) = starts(records_)
    assert start["start_step"] == CHECKPOINT and start["effects"]["expert_parallel"] == 2
    expected, got = losses(metrics(ref)), losses(records_)
    assert sorted(got) == list(range(CHECKPOINT + 1, STEPS + 1))
    assert got == {s: expected[s] for s in got}, (got, expected)  # float equality: bit for bit
    n = assert_same_dcp_checkpoint(ref / "checkpoints" / f"step-{STEPS}", out / "checkpoints" / f"step-{STEPS}", tmp_path)
    assert n > 0


def test_an_expert_parallel_checkpoint_reshards_into_a_run_without_it(runs, tmp_path):
    """The EP = 2 checkpoint (experts Shard(0) over "ep") loaded by a run with expert_parallel = 1 (experts sharded by
    FSDP2 over both ranks): DCP reshards every expert exactly, so the first step after it trains from the same weights
    and optimizer state: its loss equals the EP run's to fp32 reduction-order tolerance."""
    spec = runs / "ep2-mxfp8.toml"
    r, _ = run(runs, "run", str(spec), "--set", "train.output_dir=runs/ep1-from-ep2", "--set", "distributed.expert_parallel=1",
               "--set", f"train.resume=runs/ep2-mxfp8/checkpoints/step-{CHECKPOINT}", "--set", f"train.steps={CHECKPOINT + 1}")
    assert r.returncode == 0, output_of(r)
    recs = metrics(runs / "runs" / "ep1-from-ep2")
    (start,) = starts(recs)
    assert start["start_step"] == CHECKPOINT and start["effects"]["expert_parallel"] == 1
    expected = losses(metrics(runs / "runs" / "ep2-mxfp8"))[CHECKPOINT + 1]
    assert losses(recs)[CHECKPOINT + 1] == pytest.approx(expected, rel=1e-5)


def test_compiled_mxfp8_experts_under_expert_parallel_follow_the_eager_losses(runs):
    """compile.enabled with MXFP8 grouped experts and expert_parallel = 2: the blocks compile in parts (the token
    exchange eager, the grouped GEMMs with a dynamic row count), train, and follow the eager run's losses. Before,
    dynamo met a DTensor in torch._grouped_mm (EP 2) and Inductor's C++ loop split asserted (EP 1)."""
    steps = 4
    out = _run(runs, "ep2-mxfp8-compiled", **MXFP8, compile__enabled=True, train__steps=steps)
    recs = records(out)
    assert recs.start["effects"]["compiled_blocks"] == 2 and recs.start["effects"]["expert_parallel"] == 2
    eager = records(runs / "runs" / "ep2-mxfp8").losses[:steps]
    # the schedule differs after warm-up (train.steps 4 vs 12): step 1-2 are the same lr; compiled kernels round differently
    assert recs.losses[:2] == pytest.approx(eager[:2], rel=2e-3), (recs.losses, eager)
