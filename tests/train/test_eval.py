"""[eval]: held-out loss records, on the steps eval.every names, on batches no rank trains on, without
changing what the run trains (the same losses as the run without it) or what the FP8 monitor measures."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

from launcher.errors import InputError
from launcher.planning.plan import EvalConfig
from launcher.train.data import SyntheticStream
from launcher.train.evaluate import HELD_OUT_STREAM, eval_record, eval_stream
from launcher.train.loss import cross_entropy

from ._engine_setup import make_plan, train_in_process

BASE = {"distributed.procs_per_node": 1, "train.model": "builtin:llama-debug?layers=1", "train.steps": 4,
        "train.micro_batch_size": 2, "train.checkpoint_at_end": False}


def _run(tmp_path, name, **keys):
    """Plan and train in this process; the records of metrics.jsonl, the trainer."""
    out = tmp_path / name
    _, plan_dir = make_plan(tmp_path / f"plan-{name}", **{**BASE, "train.output_dir": str(out), **keys})
    trainer = train_in_process(f"{plan_dir}/plan.json", stream=io.StringIO())
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], trainer


def test_eval_config_is_due_every_n_steps_and_after_the_last():
    assert [s for s in range(1, 8) if EvalConfig(data="synthetic", every=3, steps=1).due(s, 7)] == [3, 6, 7]
    assert [s for s in range(1, 8) if EvalConfig(data="synthetic", every=0, steps=1).due(s, 7)] == [7]
    assert not any(EvalConfig(data="", every=1, steps=1).due(s, 7) for s in range(1, 8))


def test_perplexity_is_exp_of_the_loss_and_null_where_it_overflows():
    assert eval_record(3, 2.0, tokens=10, seconds=0.5)["eval_perplexity"] == pytest.approx(math.exp(2.0))
    assert eval_record(3, 900.0, tokens=10, seconds=0.5)["eval_perplexity"] is None
    assert eval_record(3, float("nan"), tokens=10, seconds=0.5)["eval_perplexity"] is None


def test_synthetic_eval_batches_are_held_out_from_every_training_rank(tmp_path):
    plan, _ = make_plan(tmp_path, **{**BASE, "eval.data": "synthetic"})
    held_out = eval_stream(plan, vocab_size=2048, dp_rank=0, dp_size=1, spec_dir=".")
    assert held_out.rank == HELD_OUT_STREAM
    eval_rows = {tuple(row.tolist()) for _ in range(4) for row in next(held_out)}
    for rank in range(4):
        train = SyntheticStream(seq_len=16, micro_batch_size=2, vocab_size=2048, rank=rank, seed=plan.train.seed)
        assert not eval_rows & {tuple(row.tolist()) for _ in range(50) for row in next(train)}
    # ... but drawn from the pattern the model learns: a token's successor in the pattern is the usual next token
    again = eval_stream(plan, vocab_size=2048, dp_rank=0, dp_size=1, spec_dir=".")
    assert {tuple(row.tolist()) for _ in range(4) for row in next(again)} == eval_rows  # the same batches every time


def test_eval_records_hold_the_loss_of_the_model_on_the_held_out_batches(tmp_path):
    records, trainer = _run(tmp_path, "eval", **{"eval.data": "synthetic", "eval.every": 2, "eval.steps": 3})
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["eval_tokens"] == 3 * 2 * 16 for r in evals)
    assert evals[1]["eval_perplexity"] == pytest.approx(math.exp(evals[1]["eval_loss"]))
    end = records[-1]
    assert end["event"] == "end" and end["eval_loss"] == evals[1]["eval_loss"] and end["eval_step"] == 4
    # the final model on the same held-out batches, recomputed here: the record is that loss
    engine = trainer.state.engine
    stream = eval_stream(trainer.plan, vocab_size=engine.module.vocab_size, dp_rank=0, dp_size=1, spec_dir=".")
    with torch.no_grad():
        losses = [cross_entropy(engine.forward(b[:, :-1]), b[:, 1:]).item() for b in (next(stream) for _ in range(3))]
    assert evals[1]["eval_loss"] == pytest.approx(sum(losses) / 3, rel=1e-6)
    assert evals[0]["eval_loss"] != evals[1]["eval_loss"]  # the model changed between the two evaluations


def test_evaluating_changes_nothing_the_run_trains(tmp_path):
    """Same spec with and without [eval] (every step): bit-identical training losses."""
    plain, _ = _run(tmp_path, "plain")
    evaluated, _ = _run(tmp_path, "evaluated", **{"eval.data": "synthetic", "eval.every": 1, "eval.steps": 2})
    losses = lambda records: [r["loss"] for r in records if r["event"] == "step"]  # noqa: E731
    assert losses(plain) == losses(evaluated) and len(losses(plain)) == 4
    assert sum(r["event"] == "eval" for r in evaluated) == 4


def test_fp8_monitor_samples_only_training_steps_while_evaluating(tmp_path):
    """The monitor's hooks are paused during an evaluation: fp8_stats.jsonl is what it is without [eval]."""
    fp8 = {"precision.mode": "fp8", "precision.torchao.skip_small": False, "monitor.fp8_stats_every": 1,
           "precision.keep_first_last": False, "train.steps": 2}
    _run(tmp_path, "mon", **fp8)
    _run(tmp_path, "mon-eval", **fp8, **{"eval.data": "synthetic", "eval.every": 1, "eval.steps": 1})
    stats = lambda name: [json.loads(line) for line in (tmp_path / name / "fp8_stats.jsonl").read_text().splitlines()]  # noqa: E731
    assert stats("mon") and stats("mon") == stats("mon-eval")


def test_eval_data_that_cannot_be_read_stops_before_step_one_naming_eval_data(tmp_path):
    with pytest.raises(InputError) as e:
        _run(tmp_path, "bad", **{"eval.data": f"tokens:{tmp_path / 'missing.npy'}"})
    assert e.value.exit_code == 2 and "eval.data" in str(e.value)
    assert not (tmp_path / "bad" / "metrics.jsonl").exists() or "step" not in (tmp_path / "bad" / "metrics.jsonl").read_text()


def test_the_eval_stream_is_built_once_and_put_back_to_its_start_at_each_evaluation(tmp_path):
    """A corpus is read (and an hf-dataset: tokenized) once per run, not once per evaluation."""
    import numpy as np

    from launcher.train import data as data_module

    np.save(tmp_path / "held.npy", np.arange(4000) % 2000)
    built = []
    real = data_module.build_data
    data_module.build_data = lambda *a, **k: built.append(k.get("key", "train.data")) or real(*a, **k)
    try:
        records, _ = _run(tmp_path, "tok", **{"eval.data": f"tokens:{tmp_path / 'held.npy'}", "eval.every": 1, "eval.steps": 2})
    finally:
        data_module.build_data = real
    assert built == ["train.data", "eval.data"]
    evals = [r for r in records if r["event"] == "eval"]
    assert len(evals) == 4 and all(r["eval_tokens"] == 2 * 2 * 16 for r in evals)
