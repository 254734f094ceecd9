"""Pipeline parallelism end to end: real `fp8launch run` jobs (torchrun, gloo, CPU) of the builtin debug Llama (4 blocks)
with distributed.pipeline_parallel = 2, FSDP2 over each stage's ranks, against one process on the same global batch.

- bf16, pp 2 on 2 processes (Schedule1F1B, 4 micro-batches of one sequence): the first steps' losses equal the one-process
  run's (a wrong cut, a lost block, micro-batches that split the wrong dimension or a loss averaged over the wrong ranks
  would not), and so do the gradient norm summed over the stages and the held-out loss of [eval] (the schedule's
  forward-only pass).
- bf16 pp 2 x tp 2 on 4 processes: the same first steps as one process; in torchao FP8 (float8 TP all-gathers) the same
  first step.
- An MoE model (builtin:moe-debug) under pp 2: the one-process losses, expert load balancing included.
- torchao MXFP8 (emulated) under Interleaved1F1B (2 stages a rank: 4 stages of one block, rank 0 holding stages 0 and 2),
  with full activation checkpointing: pp 2's first steps equal the one-process run's to rounding (its block scales do
  not depend on how the batch is split into micro-batches).
- bf16 under ZBVZeroBubble (rank 0 holds stages 0 and 3, the embedding and the output layer; FSDP2 keeping the weights
  gathered, rule PP-ZBV-RESHARD): the one-process run's first steps, the weight gradients computed apart.
- torchao FP8 tensorwise: pp 2, and pp 2 x dp 2 on 4 processes (GPipe, an uneven split 1 + 3 blocks), train like their
  twins on the same batches without a pipeline (one process; FSDP2 over 2): the first step's gradient norm, and the mean
  loss over the 20 steps within PP_GAP of the twin's. (Not closer: each pipeline micro-batch casts to FP8 with scales of
  its own.)
- effects: each stage's blocks, the schedule and its micro-batches, read from the live PipelineStage and schedule.
- Resume: a pp 2 run resumed from its step-10 checkpoint logs bit-identical losses and ends with bit-identical weights
  and optimizer state; the same checkpoint (each stage wrote its own parameters under their whole-model names) resumes
  in one process without pipeline parallelism; `fp8launch export` makes one Hugging Face folder of it.

~2 min on the 2-core development machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import FP8, output_of, records, run, run_named
from .test_resume import assert_same_dcp_checkpoint, exported, losses, metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pipeline_runs")]
"""Every test reads the module's `runs`: one worker (pytest -n, --dist loadgroup) builds them once."""

MODEL = "builtin:llama-debug?layers=4"
COMMON = dict(train__model=MODEL, train__seq_len=32, train__micro_batch_size=4, train__lr=3e-3, train__warmup_steps=2,
              distributed__strategy="fsdp2", train__log_every=1)
ONE = dict(distributed__procs_per_node=1)
PP2 = dict(distributed__procs_per_node=2, distributed__pipeline_parallel=2, distributed__pipeline__microbatches=4)
PP2_TP2 = dict(distributed__procs_per_node=4, distributed__pipeline_parallel=2, distributed__tensor_parallel=2)
DP2 = dict(distributed__procs_per_node=2, train__micro_batch_size=2)
PP2_DP2 = dict(distributed__procs_per_node=4, distributed__pipeline_parallel=2, distributed__pipeline__schedule="GPipe",
               train__micro_batch_size=2, distributed__pipeline__layers_per_stage=[1, 3])
BF16 = dict(precision__mode="bf16")
MOE = dict(train__model="builtin:moe-debug", train__steps=4)  # 2 MoE blocks of 8 experts (top 2 + a shared one)
MXFP8 = dict(FP8, precision__torchao__recipe="mxfp8")
EVAL = dict(eval__data="synthetic", eval__steps=2)  # once, after the last step: the schedule's forward-only pass
INTERLEAVED = dict(distributed__pipeline__schedule="Interleaved1F1B")  # 2 stages a rank (its default)
ZBV = dict(distributed__pipeline__schedule="ZBVZeroBubble", distributed__fsdp2__reshard_after_forward=False)
STEPS = 20
# The bounds, from `benchmarks/test_bounds.py pp` and `pp-resume` (seeds 0-2 x {AMX, AVX2} kernels; the table in
# benchmarks/results/test_bounds.md).
FIRST_STEPS_REL = 1e-3
"""|loss - the one-process run's| / its loss at each of the first 3 bf16 steps. Measured: max 0.026%."""
FIRST_STEPS_NORM_REL = 0.02
"""The same for the gradient norms (bf16: the micro-batches' gradients accumulate in bf16; FP8 at step 1: the same
weights and batch, each micro-batch with FP8 scales of its own). Measured: bf16 max 0.58%, FP8 step 1 max 0.64% (pp 2 x
tp 2: 0.32%; its step-1 loss: 0.02%, against FIRST_STEPS_REL). Without
the sum over the stages the norm is one stage's (~30% off); without the schedule's scaling by micro-batches, 4x."""
PP_TP_STEPS_REL = 2e-3
"""|loss - the one-process run's| / its at each of the first 3 bf16 steps of pp 2 x tp 2. Measured: max 0.072%."""
MOE_STEPS_REL = 2e-3
"""|loss - the one-process run's| / its at each of the 4 bf16 steps of moe-debug under pp 2. Measured: max 0.036%."""
MX_STEPS_REL = 2e-3
"""|loss - the one-process MXFP8 run's| / its at each of the first 3 steps. Measured: max 0.088% (tensorwise's, whose
scales depend on the micro-batch: up to 0.57%)."""
EVAL_REL = 2e-3
"""|held-out loss after step 3 - the one-process run's| / its, bf16 (2 batches of 4 x 32 tokens). Measured: max 0.094%
(the weights after 3 steps differ by the gradients' bf16 accumulation over micro-batches)."""
PP_GAP = {"pp2-fp8": 0.035, "pp2dp2-fp8": 0.012}
"""|mean loss over the 20 steps - the twin's| / the twin's, 2x the largest measured: pp 2 against one process max 1.7%
(its micro-batches of one sequence against one batch of 4 per FP8 scale), pp 2 x dp 2 against dp 2 max 0.6%."""
RESHARD = 0.005
"""|loss at step 11, and mean loss of steps 11-20, of the pp 2 checkpoint resumed in one process - the pp 2 run's| / its
(the same weights and batches; only the FP8 scales' micro-batches differ). Measured: max 0.063% and 0.11%."""
"""Bound on |mean loss over the 20 steps - the one-process FP8 run's| / its. Measured: see benchmarks/results/test_bounds.md."""


def _run(folder: Path, name: str, *extra: str, **keys) -> Path:
    return run_named(folder, name, *extra, **{**COMMON, "train__steps": STEPS, **keys})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pp")
    _run(folder, "one-bf16", **ONE, **BF16, **EVAL, train__steps=3)
    _run(folder, "pp2-bf16", **PP2, **BF16, **EVAL, train__steps=3)
    _run(folder, "pp2tp2-bf16", **PP2_TP2, **BF16, train__steps=3)
    _run(folder, "pp2tp2-fp8", **PP2_TP2, **FP8, train__steps=3)
    _run(folder, "one-moe-bf16", **ONE, **BF16, **MOE)
    _run(folder, "pp2-moe-bf16", **PP2, **BF16, **MOE)
    _run(folder, "one-mxfp8", **ONE, **MXFP8, train__steps=3)
    _run(folder, "pp2-mxfp8", **PP2, **INTERLEAVED, **MXFP8, **EVAL, activation_checkpointing__mode="full", train__steps=3)
    _run(folder, "pp2-zbv-bf16", **PP2, **ZBV, **BF16, train__steps=3, train__checkpoint_every=2)
    _run(folder, "one-fp8", **ONE, **FP8)
    _run(folder, "pp2-fp8", **PP2, **FP8, train__checkpoint_every=10)
    _run(folder, "dp2-fp8", **DP2, **FP8)
    _run(folder, "pp2dp2-fp8", **PP2_DP2, **FP8)
    return folder


def test_bf16_pipeline_computes_what_one_process_computes(runs):
    one, pp = records(runs / "runs" / "one-bf16"), records(runs / "runs" / "pp2-bf16")
    assert pp.start["world_size"] == 2 and pp.start["tokens_per_step"] == one.start["tokens_per_step"] == 4 * 32
    for a, b in zip(one.steps, pp.steps, strict=True):
        assert abs(b["loss"] - a["loss"]) / a["loss"] < FIRST_STEPS_REL, (a["loss"], b["loss"])
        assert abs(b["grad_norm"] - a["grad_norm"]) / a["grad_norm"] < FIRST_STEPS_NORM_REL, (a["grad_norm"], b["grad_norm"])
    (a,), (b,) = ([r for r in metrics(runs / "runs" / name) if r["event"] == "eval"] for name in ("one-bf16", "pp2-bf16"))
    assert a["eval_tokens"] == b["eval_tokens"] == 2 * 4 * 32 and abs(b["eval_loss"] - a["eval_loss"]) / a["eval_loss"] < EVAL_REL
    effects = pp.start["effects"]["pipeline"]  # rank 0's stage
    assert effects == {"stages": 2, "stage": 0, "schedule": "Schedule1F1B", "microbatches": 4, "blocks": [0, 1], "stages_per_rank": 1,
                       "rank_stages": [0]}
    assert "pipeline stage 0 of 2 (blocks 0-1; Schedule1F1B, 4 micro-batches)" in (runs / "pp2-bf16.stdout").read_text()


@pytest.mark.parametrize("name,world,twin", [("pp2-fp8", 2, "one-fp8"), ("pp2dp2-fp8", 4, "dp2-fp8")])
def test_fp8_pipelines_train_like_their_twin_without_a_pipeline(runs, name, world, twin):
    """Each against the run on the same batches without pipeline parallelism: one process, and FSDP2 over 2."""
    one, pp = records(runs / "runs" / twin), records(runs / "runs" / name)
    assert pp.start["world_size"] == world and pp.start["tokens_per_step"] == one.start["tokens_per_step"]
    assert pp.start["fp8_layers"] == one.start["fp8_layers"] > 0  # the whole model's layers, chosen before the cut
    first, theirs = pp.steps[0], one.steps[0]  # the same weights and batch
    assert abs(first["grad_norm"] - theirs["grad_norm"]) / theirs["grad_norm"] < FIRST_STEPS_NORM_REL, (first, theirs)
    mean = lambda recs: sum(recs.losses) / len(recs.losses)  # noqa: E731
    assert abs(mean(pp) - mean(one)) / mean(one) < PP_GAP[name], (mean(pp), mean(one))
    assert pp.tail_loss() < 0.85 * pp.losses[0]  # it learns


def test_pipeline_x_tensor_parallel_computes_what_one_process_computes(runs):
    """pp 2 x tp 2 on 4 processes (mesh pp x dp_shard x tp): each stage's blocks split over its 2 TP ranks, the activations
    sent between the stages are the sequence shards of sequence parallelism."""
    one, pp = records(runs / "runs" / "one-bf16"), records(runs / "runs" / "pp2tp2-bf16")
    assert pp.start["world_size"] == 4 and pp.start["tokens_per_step"] == one.start["tokens_per_step"]
    assert pp.start["effects"]["tensor_parallel"] == 2 and pp.start["effects"]["pipeline"]["blocks"] == [0, 1]
    for a, b in zip(one.steps, pp.steps, strict=True):
        assert abs(b["loss"] - a["loss"]) / a["loss"] < PP_TP_STEPS_REL, (a["loss"], b["loss"])


def test_fp8_pipeline_x_tensor_parallel_starts_as_one_process_with_float8_tp_all_gathers(runs):
    """torchao tensorwise FP8 under pp 2 x tp 2: the float8 TP styles on each stage; step 1 (the same weights and batch)
    gives the one-process FP8 run's loss and gradient norm."""
    one, pp = records(runs / "runs" / "one-fp8"), records(runs / "runs" / "pp2tp2-fp8")
    assert pp.start["tensor_parallel"]["float8_tp_layers"] == 13  # rank 0's stage: blocks 0-1, 14 Linears but layers.0.attention.wq (kept)
    a, b = one.steps[0], pp.steps[0]
    assert abs(b["loss"] - a["loss"]) / a["loss"] < FIRST_STEPS_REL, (a, b)
    assert abs(b["grad_norm"] - a["grad_norm"]) / a["grad_norm"] < FIRST_STEPS_NORM_REL, (a, b)


def test_an_moe_model_in_stages_computes_what_one_process_computes(runs, tmp_path):
    """builtin:moe-debug under pp 2: one MoE block a stage. Its load balancing sums each stage's token counts over the
    ranks of that stage, and not the tokens of the micro-batch the stage runs once more at the first step to infer its
    shapes: the expert biases after 4 steps are the one-process run's. (Counting that micro-batch moved them by up to
    1.6e-3, more than a balancing step of 1e-3, while the losses of 4 steps hardly showed it: within 0.015%.)"""
    one, pp = records(runs / "runs" / "one-moe-bf16"), records(runs / "runs" / "pp2-moe-bf16")
    assert pp.start["effects"]["pipeline"]["blocks"] == [0]
    for a, b in zip(one.losses, pp.losses, strict=True):
        assert abs(b - a) / a < MOE_STEPS_REL, (a, b)
    biases = [{k: v for k, v in exported(runs / "runs" / name / "checkpoints" / "step-4" / "model", tmp_path).items()
               if k.endswith("expert_bias")} for name in ("one-moe-bf16", "pp2-moe-bf16")]
    assert sorted(biases[0]) == sorted(biases[1]) == ["layers.0.moe.expert_bias", "layers.1.moe.expert_bias"]
    for k in biases[0]:
        assert biases[0][k].abs().max() > 0 and (biases[0][k] - biases[1][k]).abs().max() < 0.5e-3, (k, biases)


def test_mxfp8_pipeline_computes_what_one_process_computes(runs):
    """torchao MXFP8 scales blocks of 32 along each GEMM's inner dimension: over the tokens of one sequence (seq 32) in the
    weight gradient, so a pipeline micro-batch of one sequence casts as the whole batch does, unlike tensorwise."""
    one, pp = records(runs / "runs" / "one-mxfp8"), records(runs / "runs" / "pp2-mxfp8")
    assert "fp8 mxfp8" in pp.start["layers"].values() and pp.start["recipe"] == "mxfp8"
    for a, b in zip(one.losses, pp.losses, strict=True):
        assert abs(b - a) / a < MX_STEPS_REL, (a, b)
    assert pp.start["effects"]["pipeline"] == {"stages": 4, "stage": 0, "schedule": "ScheduleInterleaved1F1B", "microbatches": 4,
                                               "blocks": [0, 2], "stages_per_rank": 2, "rank_stages": [0, 2]}
    assert "pipeline stages 0, 2 of 4 (blocks 0-0, 2-2; ScheduleInterleaved1F1B" in (runs / "pp2-mxfp8.stdout").read_text()
    assert pp.start["effects"]["checkpointed_blocks"] == 2  # each stage runs its block as checkpointing wrapped it
    (held_out,) = [r for r in metrics(runs / "runs" / "pp2-mxfp8") if r["event"] == "eval"]  # the interleaved forward-only pass
    assert held_out["eval_tokens"] == 2 * 4 * 32 and held_out["eval_loss"] < one.losses[0]


def test_zero_bubble_v_computes_what_one_process_computes(runs):
    """ZBVZeroBubble: each micro-batch's input gradients, then (later, filling the bubble) its weight gradients; rank 0
    holds the first and the last stage. The same losses and gradient norms as one process at the first bf16 steps."""
    one, pp = records(runs / "runs" / "one-bf16"), records(runs / "runs" / "pp2-zbv-bf16")
    for a, b in zip(one.steps, pp.steps, strict=True):
        assert abs(b["loss"] - a["loss"]) / a["loss"] < FIRST_STEPS_REL, (a["loss"], b["loss"])
        assert abs(b["grad_norm"] - a["grad_norm"]) / a["grad_norm"] < FIRST_STEPS_NORM_REL, (a["grad_norm"], b["grad_norm"])
    effects = pp.start["effects"]["pipeline"]
    assert effects["schedule"] == "ScheduleZBVZeroBubble" and effects["rank_stages"] == [0, 3] and effects["blocks"] == [0, 3]


def test_two_stages_a_rank_resume_bit_identically(runs, tmp_path):
    """The ZBV run resumed from its step-2 checkpoint (each rank's two stages loaded through its model, the views'
    modules): step 3's loss and the step-3 checkpoint, weights and optimizer state, bit for bit."""
    ref, out = runs / "runs" / "pp2-zbv-bf16", runs / "runs" / "pp2-zbv-resumed"
    r, _ = run(runs, "run", str(runs / "pp2-zbv-bf16.toml"), "--set", "train.output_dir=runs/pp2-zbv-resumed",
               "--set", "train.resume=runs/pp2-zbv-bf16/checkpoints/step-2")
    assert r.returncode == 0, output_of(r)
    expected, got = losses(metrics(ref)), losses(metrics(out))
    assert got == {3: expected[3]}
    assert assert_same_dcp_checkpoint(ref / "checkpoints" / "step-3", out / "checkpoints" / "step-3", tmp_path) == 39


def test_two_stages_a_rank_checkpoint_the_whole_model_under_its_names(runs, tmp_path):
    """Each rank's model (both its stages, the views' modules) writes its parameters under the whole model's names: the
    step-3 checkpoints of the ZBV and the Interleaved1F1B runs hold what the one-process runs' hold, name for name and
    shape for shape. (Their values are not compared: Adam's first steps move the weights whose gradients are near zero by
    +-lr on rounding; the losses and gradient norms above compare what they compute.)"""
    zbv, one = (exported(runs / "runs" / name / "checkpoints" / "step-3" / "model", tmp_path) for name in ("pp2-zbv-bf16", "one-bf16"))
    looped = exported(runs / "runs" / "pp2-mxfp8" / "checkpoints" / "step-3" / "model", tmp_path)
    assert len(one) == 39 and {k: v.shape for k, v in zbv.items()} == {k: v.shape for k, v in one.items()}
    assert {k: v.shape for k, v in looped.items()} == {k: v.shape for k, v in one.items()}


def test_an_uneven_split_and_gpipe_take_effect(runs):
    effects = records(runs / "runs" / "pp2dp2-fp8").start["effects"]["pipeline"]
    assert effects == {"stages": 2, "stage": 0, "schedule": "ScheduleGPipe", "microbatches": 2, "blocks": [0], "stages_per_rank": 1,
                       "rank_stages": [0]}


def test_pipeline_resume_is_bit_identical_and_its_checkpoint_loads_without_a_pipeline(runs, tmp_path):
    ref = runs / "runs" / "pp2-fp8"
    spec = runs / "pp2-fp8.toml"
    out = runs / "runs" / "pp2-fp8-resumed"
    r, _ = run(runs, "run", str(spec), "--set", "train.output_dir=runs/pp2-fp8-resumed",
               "--set", "train.resume=runs/pp2-fp8/checkpoints/step-10")
    assert r.returncode == 0, output_of(r)
    expected, got = losses(metrics(ref)), losses(metrics(out))
    assert sorted(got) == list(range(11, STEPS + 1)) and got == {s: expected[s] for s in got}  # bit for bit
    assert assert_same_dcp_checkpoint(ref / "checkpoints" / "step-20", out / "checkpoints" / "step-20", tmp_path) == 39
    # 4 blocks x 9 tensors + embedding, final norm, head: every name once, each written by the stage that holds it

    one = _run(runs, "pp1-from-pp2", **ONE, **FP8, train__resume="runs/pp2-fp8/checkpoints/step-10")
    got = losses(metrics(one))
    assert sorted(got) == list(range(11, STEPS + 1))
    assert abs(got[11] - expected[11]) / expected[11] < RESHARD, (got[11], expected[11])
    tail = [expected[s] for s in got]
    assert abs(sum(got.values()) - sum(tail)) / sum(tail) < RESHARD


def test_a_pipeline_checkpoint_exports_the_whole_model(runs):
    """`fp8launch export` of the pp 2 run: one Hugging Face folder whose model computes what the checkpoint's weights,
    read by torch's own one-liner, compute (the stages' parameters put together under their names)."""
    from tests.test_export import FP32_TOLERANCE, dcp_weights, hf_logits, our_logits

    r, _ = run(runs, "export", "runs/pp2-fp8", "--dtype", "fp32")
    assert r.returncode == 0, output_of(r)
    assert "wrote runs/pp2-fp8/export/step-20-hf: step 20, LlamaForCausalLM, 39 tensors" in r.stdout
    weights = dcp_weights(runs / "runs" / "pp2-fp8", 20)
    _, theirs = hf_logits(runs / "runs" / "pp2-fp8" / "export" / "step-20-hf")
    assert (theirs - our_logits(weights, MODEL)).abs().max().item() < FP32_TOLERANCE
