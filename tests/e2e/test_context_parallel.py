"""Context parallel end to end (distributed.context_parallel; launcher/train/parallel/context.py): real `fp8launch run`
processes (torchrun, gloo, this CPU), builtin:llama-debug?layers=4 with FSDP2 over dp_shard x cp, each sequence of 32
tokens split over 2 ranks (torch's context_parallel, head-tail load balancing, ring attention over the CPU kernel),
against one process on the same batches.

- bf16, cp 2 on 2 processes: the first steps' losses and gradient norms equal the one-process run's to bf16 rounding,
  and so does the held-out loss of [eval] after them; the start record says each attention took its rank's positions.
- torchao FP8 tensorwise: the mean loss over 20 steps within CP_GAP of the one-process FP8 run's (each rank's FP8 scales
  are its own tokens', as a data-parallel rank's are).
- resume from step 10 is bit for bit; the cp 2 checkpoint resumed in one process (cp 1) trains on as the cp 2 run does.
- builtin:moe-debug (2 MoE blocks) under cp 2 trains as one process does.

~1.5 min on the 2-core development machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import FP8, output_of, records, run, run_named
from .test_resume import assert_same_dcp_checkpoint, losses, metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("context_runs")]
"""Every test reads the module's `runs`: one worker (pytest -n, --dist loadgroup) builds them once."""

COMMON = dict(train__model="builtin:llama-debug?layers=4", train__seq_len=32, train__micro_batch_size=2, train__lr=3e-3,
              train__warmup_steps=2, distributed__strategy="fsdp2", train__log_every=1)
ONE = dict(distributed__procs_per_node=1)
CP2 = dict(distributed__procs_per_node=2, distributed__context_parallel=2)
BF16 = dict(precision__mode="bf16")
TAO = {k.replace(".", "__"): v for k, v in FP8.items()}
MOE = dict(train__model="builtin:moe-debug", train__steps=4)
EVAL = dict(eval__data="synthetic", eval__steps=2)  # once, after the last step
STEPS = 20
# Bounds from the runs below at seeds 0-2 on the AMX development machine, 2026-11-27 (benchmarks/context_parallel_bounds.py,
# benchmarks/results/context_parallel_bounds.json); each is several times the largest measured.
FIRST_STEP_REL = 1e-3
"""|loss - the one-process run's| / its at bf16 step 1 (the same weights and batch; the issue's bar). Measured: max
2.0e-5. The ring merges the ranks' partial attention in fp32 where one SDPA rounds its own way."""
FIRST_NORM_REL = 0.01
"""The same for step 1's gradient norm. Measured: max 0.07%."""
LATER_STEPS_REL = 0.005
"""|loss - the one-process run's| / its at bf16 steps 2 and 3 (lr 3e-3 on gradient norms of 10-23 amplifies step 1's
rounding). Measured: max 0.106% (seed 1, step 3)."""
CP_GAP = 0.02
"""|mean FP8 loss over the 20 steps - the one-process FP8 run's| / its. Measured: 0.42%, 0.56%, 0.51%. (The last step
alone spread to 8.7% at seed 2: each rank's FP8 scales are its own tokens'.)"""
RESHARD = 0.005
"""|loss at step 11, and mean loss of steps 11-20, of the cp 2 checkpoint resumed in one process - the cp 2 run's| / its.
Measured (seed 0): 0.0054% and 0.0013% (the same weights and batches; FP8 scales over each rank's
tokens against over all of them)."""
EVAL_REL = 0.005
"""|held-out loss after step 3 - the one-process run's| / its, bf16 ([eval], 2 batches of 2 x 32 tokens: each rank's half
of every sequence through the ring). Measured: 0.037%, 0.040%, 0.098% (the weights after 3 steps differ as the losses of
steps 2-3 do)."""
MOE_STEPS_REL = 2e-3
"""|loss - the one-process run's| / its at each of the 4 bf16 steps of moe-debug under cp 2. Measured (seed 0): max 0.0085%."""


def _run(folder: Path, name: str, *extra: str, **keys) -> Path:
    return run_named(folder, name, *extra, **{**COMMON, "train__steps": STEPS, **keys})


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cp")
    _run(folder, "one-bf16", **ONE, **BF16, **EVAL, train__steps=3)
    _run(folder, "cp2-bf16", **CP2, **BF16, **EVAL, train__steps=3)
    _run(folder, "one-fp8", **ONE, **TAO)
    _run(folder, "cp2-fp8", **CP2, **TAO, train__checkpoint_every=10)
    _run(folder, "one-moe-bf16", **ONE, **BF16, **MOE)
    _run(folder, "cp2-moe-bf16", **CP2, **BF16, **MOE)
    return folder


def test_bf16_context_parallel_computes_what_one_process_computes(runs):
    one, cp = records(runs / "runs" / "one-bf16"), records(runs / "runs" / "cp2-bf16")
    assert cp.start["world_size"] == 2 and cp.start["tokens_per_step"] == one.start["tokens_per_step"] == 2 * 32
    a, b = one.steps[0], cp.steps[0]
    assert abs(b["loss"] - a["loss"]) / a["loss"] < FIRST_STEP_REL, (a, b)
    assert abs(b["grad_norm"] - a["grad_norm"]) / a["grad_norm"] < FIRST_NORM_REL, (a, b)
    for a, b in zip(one.steps[1:], cp.steps[1:], strict=True):
        assert abs(b["loss"] - a["loss"]) / a["loss"] < LATER_STEPS_REL, (a["loss"], b["loss"])
    assert cp.start["effects"]["context"] == {"ranks": 2, "positioned_attentions": 4}
    assert "context parallel 2" in (runs / "cp2-bf16.stdout").read_text()
    # [eval] after step 3: each rank's part of every held-out sequence through the ring, the mean over all ranks
    (a,), (b,) = ([r for r in metrics(runs / "runs" / name) if r["event"] == "eval"] for name in ("one-bf16", "cp2-bf16"))
    assert a["eval_tokens"] == b["eval_tokens"] == 2 * 2 * 32
    assert abs(b["eval_loss"] - a["eval_loss"]) / a["eval_loss"] < EVAL_REL, (a["eval_loss"], b["eval_loss"])


def test_fp8_context_parallel_trains_like_one_process(runs):
    one, cp = records(runs / "runs" / "one-fp8"), records(runs / "runs" / "cp2-fp8")
    assert cp.start["fp8_layers"] == one.start["fp8_layers"] > 0
    mean = lambda recs: sum(recs.losses) / len(recs.losses)  # noqa: E731
    assert abs(mean(cp) - mean(one)) / mean(one) < CP_GAP, (mean(cp), mean(one))
    assert cp.tail_loss() < 0.85 * cp.losses[0]  # it learns


def test_context_parallel_resume_is_bit_identical_and_its_checkpoint_loads_in_one_process(runs, tmp_path):
    ref = runs / "runs" / "cp2-fp8"
    out = runs / "runs" / "cp2-fp8-resumed"
    r, _ = run(runs, "run", str(runs / "cp2-fp8.toml"), "--set", "train.output_dir=runs/cp2-fp8-resumed",
               "--set", "train.resume=runs/cp2-fp8/checkpoints/step-10")
    assert r.returncode == 0, output_of(r)
    expected, got = losses(metrics(ref)), losses(metrics(out))
    assert sorted(got) == list(range(11, STEPS + 1)) and got == {s: expected[s] for s in got}  # bit for bit
    assert assert_same_dcp_checkpoint(ref / "checkpoints" / "step-20", out / "checkpoints" / "step-20", tmp_path) == 39

    one = _run(runs, "cp1-from-cp2", **ONE, **TAO, train__resume="runs/cp2-fp8/checkpoints/step-10")
    got = losses(metrics(one))
    assert sorted(got) == list(range(11, STEPS + 1))
    assert abs(got[11] - expected[11]) / expected[11] < RESHARD, (got[11], expected[11])
    tail = [expected[s] for s in got]
    assert abs(sum(got.values()) - sum(tail)) / sum(tail) < RESHARD


def test_an_moe_model_under_context_parallel_computes_what_one_process_computes(runs):
    one, cp = records(runs / "runs" / "one-moe-bf16"), records(runs / "runs" / "cp2-moe-bf16")
    assert cp.start["effects"]["context"] == {"ranks": 2, "positioned_attentions": 2}
    for a, b in zip(one.losses, cp.losses, strict=True):
        assert abs(b - a) / a < MOE_STEPS_REL, (a, b)


def test_a_context_parallel_checkpoint_exports_the_whole_model(runs):
    """`fp8launch export` of the cp 2 run: one Hugging Face folder whose model computes what the checkpoint's weights,
    read by torch's own one-liner, compute."""
    from tests.test_export import FP32_TOLERANCE, dcp_weights, hf_logits, our_logits

    r, _ = run(runs, "export", "runs/cp2-fp8", "--dtype", "fp32")
    assert r.returncode == 0, output_of(r)
    assert "wrote runs/cp2-fp8/export/step-20-hf: step 20, LlamaForCausalLM, 39 tensors" in r.stdout
    weights = dcp_weights(runs / "runs" / "cp2-fp8", 20)
    _, theirs = hf_logits(runs / "runs" / "cp2-fp8" / "export" / "step-20-hf")
    assert (theirs - our_logits(weights, COMMON["train__model"])).abs().max().item() < FP32_TOLERANCE
