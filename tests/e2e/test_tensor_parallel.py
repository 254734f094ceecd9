"""Tensor parallelism end to end: real `fp8launch run` jobs (torchrun, gloo, CPU) of the builtin
debug Llama with distributed.tensor_parallel.

- TP only (2 processes, mesh dp 1 x tp 2) and 2D (FSDP2 2 x TP 2, 4 processes, with FSDP2's float8
  all-gather) in torchao FP8 (tensorwise: the float8 TP styles) and in bf16: the FP8 layers and the float8 TP layers are
  reported, the loss falls, and the mean losses over the 20 steps are within FP8_GAP of the bf16 twin's.
- TP computes what one process computes: the bf16 TP-only run's losses track a 1-process run on
  the same batches step by step (a wrong sharding, head count or data split would not).
- Throughput is not double-counted: the ranks of a TP group read the same batches, so
  tokens_per_step counts data-parallel ranks only and TFLOP/s per device divides by all ranks.
- Resume under TP is bit-exact (TP only and 2D, FP8), and a 2D checkpoint loads into another
  layout (FSDP2 2 x TP 1, and TP 2 alone): DCP reshards the DTensors.

~3 min on the 2-core development machine (4-process runs ~15-25 s each).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from launcher.train.checkpoint import read_marker

from .helpers import FP8, records, run_named
from .test_resume import assert_same_dcp_checkpoint, losses, metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tensor_parallel_runs")]
"""Every test reads the module's `runs`: one worker (pytest -n, --dist loadgroup) builds them once."""

MODEL = "builtin:llama-debug?layers=2"
FP8_LAYERS_2 = 13  # llama-debug with 2 layers: 7 Linear per layer, minus layers.0.attention.wq and the output head (keep_first_last)
COMMON = dict(train__model=MODEL, train__seq_len=32, train__micro_batch_size=4, train__lr=3e-3, train__warmup_steps=2,
              distributed__strategy="fsdp2")
TP2 = dict(distributed__procs_per_node=2, distributed__tensor_parallel=2)
TWO_D = dict(distributed__procs_per_node=4, distributed__tensor_parallel=2)
BF16 = dict(precision__mode="bf16")
FP8_2D = dict(FP8, precision__torchao__fsdp_float8_all_gather=True)  # 2D: FSDP2 float8 all-gathers over dp, float8 TP over tp
STEPS = 20
FP8_GAP = 0.03
"""Bound on |mean loss of the FP8 run - its bf16 twin's| / the twin's, over the 20 steps: the largest + 3 sd. Measured
over seeds 0-2 x {AMX, AVX2} kernels (benchmarks/results/test_bounds.md): TP 2 mean 0.58%, sd 0.65%, max 0.98%; 2D mean
0.22%, max 0.58%. The mean of the last 3 steps, which this test compared before (within 5%), spread to 2.7%."""
LEARNS = 0.85
"""Bound on the mean loss of the last 3 steps / the first step's. The same runs: TP 2 0.64-0.71, 2D 0.44-0.51."""


def _run(folder: Path, name: str, *extra: str, **keys) -> Path:
    return run_named(folder, name, *extra, **{**COMMON, "train__steps": STEPS, **keys})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The reference runs, 20 steps each, checkpoints at 10 and 20 (FP8 ones)."""
    folder = tmp_path_factory.mktemp("tp")
    ckpt = dict(train__checkpoint_every=10)
    _run(folder, "tp2-fp8", **TP2, **FP8, **ckpt)
    _run(folder, "tp2-bf16", **TP2, **BF16)
    _run(folder, "one-bf16", distributed__procs_per_node=1, **BF16)
    _run(folder, "2d-fp8", **TWO_D, **FP8_2D, **ckpt)
    _run(folder, "2d-bf16", **TWO_D, **BF16)
    return folder


def _stdout(folder: Path, name: str) -> str:
    return (folder / f"{name}.stdout").read_text()


@pytest.mark.parametrize("layout,world,dp", [("tp2", 2, 1), ("2d", 4, 2)])
def test_fp8_under_tp_reports_its_layers_and_trains_like_bf16(runs, layout, world, dp):
    fp8, bf16 = records(runs / "runs" / f"{layout}-fp8"), records(runs / "runs" / f"{layout}-bf16")
    for recs in (fp8, bf16):
        assert recs.start["world_size"] == world and recs.start["strategy"] == "fsdp2"
        assert recs.start["tensor_parallel"]["tensor_parallel"] == 2 and recs.start["tensor_parallel"]["data_parallel"] == dp
        assert [r["step"] for r in recs.steps] == list(range(1, STEPS + 1))
        assert recs.tail_loss() < LEARNS * recs.losses[0]  # it learns
    assert (fp8.start["fp8_layers"], fp8.start["total_linear"]) == (FP8_LAYERS_2, 15)
    assert bf16.start["fp8_layers"] == 0
    # every FP8 Linear uses torchao's float8 TP styles; embedding, output and the bf16 layers.0.attention.wq the plain ones
    assert (fp8.start["tensor_parallel"]["float8_tp_layers"], fp8.start["tensor_parallel"]["plain_tp_layers"]) == (FP8_LAYERS_2, 3)
    assert (bf16.start["tensor_parallel"]["float8_tp_layers"], bf16.start["tensor_parallel"]["plain_tp_layers"]) == (0, 16)
    out = _stdout(runs, f"{layout}-fp8")
    assert f"{FP8_LAYERS_2} of 15 Linear layers in FP8" in out
    assert f"tensor parallel: mesh dp {dp} x tp 2; {FP8_LAYERS_2} Linear layers with float8 TP all-gathers" in out
    mean = [sum(recs.losses) / STEPS for recs in (fp8, bf16)]
    assert abs(mean[0] - mean[1]) / mean[1] < FP8_GAP, (fp8.losses, bf16.losses)


def test_tp_computes_what_one_process_computes_on_the_same_batches(runs):
    """TP 2 x DP 1 reads data-parallel rank 0's batches, as the 1-process run does: the same losses up to bf16 rounding,
    whose differences grow step by step (measured over seeds 0-2 x {AMX, AVX2}: at most 0.005% at step 1, 0.16% over
    steps 1-10, 2.25% over steps 11-20, 0.35% in the mean over the 20 steps)."""
    tp, one = records(runs / "runs" / "tp2-bf16"), records(runs / "runs" / "one-bf16")
    assert tp.start["tokens_per_step"] == one.start["tokens_per_step"] == 4 * 32
    assert tp.losses[0] == pytest.approx(one.losses[0], rel=2e-3)  # the same initial weights and batch
    for a, b in zip(tp.losses[:10], one.losses[:10]):
        assert a == pytest.approx(b, rel=0.005)
    assert sum(tp.losses) == pytest.approx(sum(one.losses), rel=0.01)
    assert tp.tail_loss() < LEARNS * tp.losses[0]


@pytest.mark.parametrize("name,world,dp", [("tp2-fp8", 2, 1), ("2d-fp8", 4, 2)])
def test_throughput_counts_data_parallel_ranks_once(runs, name, world, dp):
    recs = records(runs / "runs" / name)
    assert recs.start["tokens_per_step"] == 4 * dp * 32  # micro_batch x data-parallel ranks x seq_len, not x world size
    assert recs.end["tokens_seen"] == STEPS * 4 * dp * 32
    flops = recs.start["flops_per_token"]
    for r in recs.steps:
        assert r["tokens_per_s"] == pytest.approx(4 * dp * 32 / r["step_time_s"], rel=1e-9)
        assert r["tflops_per_device"] == pytest.approx(flops * r["tokens_per_s"] / world / 1e12, rel=1e-9)


@pytest.mark.parametrize("name,layout", [("tp2-fp8", {**TP2, **FP8}), ("2d-fp8", {**TWO_D, **FP8_2D})])
def test_resume_under_tp_is_bit_exact(runs, tmp_path, name, layout):
    """Losses 11-20 equal the uninterrupted run's as floats, and the step-20 weights and optimizer state bit for bit."""
    ref = runs / "runs" / name
    assert read_marker(str(ref / "checkpoints" / "step-10"))["tensor_parallel"] == 2
    out = _run(runs, f"{name}-resumed", **layout, train__checkpoint_every=10, train__resume=f"runs/{name}/checkpoints/step-10")
    assert f"resumed from runs/{name}/checkpoints/step-10 at step 10" in _stdout(runs, f"{name}-resumed")
    expected, got = losses(metrics(ref)), losses(metrics(out))
    assert sorted(got) == list(range(11, STEPS + 1))
    assert got == {s: expected[s] for s in got}
    assert assert_same_dcp_checkpoint(ref / "checkpoints" / "step-20", out / "checkpoints" / "step-20", tmp_path) == 21


def test_a_2d_checkpoint_loads_into_fsdp2_without_tp(runs):
    """FSDP2 2 x TP 2 -> FSDP2 2: the data-parallel ranks read the same batches in both layouts, so the
    resumed losses follow the 2D run's (up to the reduction order); wrongly placed shards would not."""
    ref = losses(metrics(runs / "runs" / "2d-fp8"))
    out = _run(runs, "2d-to-dp2", distributed__procs_per_node=2, distributed__tensor_parallel=1, **FP8_2D,
               train__resume="runs/2d-fp8/checkpoints/step-10")
    got = losses(metrics(out))
    assert sorted(got) == list(range(11, STEPS + 1))
    for step, loss in got.items():  # measured over seeds 0-2 (AMX): at most 0.35% apart
        assert loss == pytest.approx(ref[step], rel=0.02), (step, got, ref)
    assert ref[11] < 0.85 * ref[1]  # far from the initial loss: the trained weights were loaded
    stdout = _stdout(runs, "2d-to-dp2")
    assert "resumed from runs/2d-fp8/checkpoints/step-10 at step 10" in stdout
    assert "tensor parallel: mesh" not in stdout


def test_a_2d_checkpoint_loads_into_tp_alone(runs):
    """FSDP2 2 x TP 2 (4 processes) -> TP 2 (2 processes): DCP reshards; half the batch per step now (dp 1)."""
    ref = losses(metrics(runs / "runs" / "2d-fp8"))
    out = _run(runs, "2d-to-tp2", **TP2, **FP8_2D, train__resume="runs/2d-fp8/checkpoints/step-10")
    got = losses(metrics(out))
    assert sorted(got) == list(range(11, STEPS + 1))
    assert all(math.isfinite(v) for v in got.values())
    # The batch is data-parallel rank 0's half of the 2D run's, so the loss is close, not equal: one
    # half-batch's loss differs from the two halves' mean by a few %: measured over seeds 0-2 (AMX) -4.0%, -1.0%, +6.0%
    # (5.4% seen on an AVX2 machine), 0.015-0.134 of the way back to ref[1], got[11] / ref[1] 0.60-0.73.
    # What shows the 2D shards were loaded and placed right is that it is near the trained loss and far
    # from the initial one (a fresh or misplaced model is back near ref[1], 45-63% above ref[11]).
    assert got[11] == pytest.approx(ref[11], rel=0.12), (got, ref)
    assert got[11] < 0.85 * ref[1] and abs(got[11] - ref[11]) < 0.3 * (ref[1] - ref[11]), (got, ref)
    assert "tensor parallel: mesh dp 1 x tp 2" in _stdout(runs, "2d-to-tp2")
