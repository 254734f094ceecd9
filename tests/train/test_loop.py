"""The training loop in one process (gloo world of one): accumulation, fp32 loss, the lr
schedule, non-finite losses, TrainState round trips and the metrics records."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from launcher.train.checkpoint import CheckpointManager
from launcher.train.engines import wrap
from launcher.train.loop import (
    EXIT_DIVERGED,
    MAX_CONSECUTIVE_SKIPS,
    Trainer,
    TrainingDiverged,
    TrainState,
    likely_causes,
)
from launcher.train.loss import cross_entropy, loss_function
from launcher.train.metrics import STEP_FIELDS, MetricsLogger, Throughput
from launcher.train.optim import FINAL_LR_FRACTION, lr_factor
from launcher.train.precision import apply_precision

from ._engine_setup import CPU, make_plan, tiny_model, token_batches, world_of_one


@pytest.fixture(scope="module")
def world():
    with world_of_one() as env:
        yield env


def _trainer(tmp_path, plan, plan_dir, data, *, model=None, log_every_stream=None, callbacks=(), checkpoints=None):
    model = model or tiny_model()
    precision = apply_precision(model, plan, CPU.device)
    engine = wrap(model, plan, precision, plan_dir, env=CPU, layout=plan.distributed.layout(CPU.world_size))
    state = TrainState(engine=engine, data=iter(data))
    logger = MetricsLogger(output_dir=str(tmp_path / "out"), enabled=True, total_steps=plan.train.steps,
                           stream=log_every_stream or io.StringIO(), progress=False)
    throughput = Throughput(tokens_per_step=plan.tokens_per_step, world_size=1, flops_per_token=1e6, peak_tflops=None)
    return Trainer(state, plan, device=CPU.device, logger=logger, throughput=throughput, callbacks=callbacks,
                   checkpoints=checkpoints), logger


def _records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    assert lr_factor(0, warmup_steps=4, steps=20) == pytest.approx(1 / 5)
    assert lr_factor(3, warmup_steps=4, steps=20) == pytest.approx(4 / 5)
    assert lr_factor(4, warmup_steps=4, steps=20) == pytest.approx(1.0)
    assert lr_factor(12, warmup_steps=4, steps=20) == pytest.approx(FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) / 2)
    assert lr_factor(20, warmup_steps=4, steps=20) == pytest.approx(FINAL_LR_FRACTION)
    assert lr_factor(0, warmup_steps=0, steps=1) == pytest.approx(1.0)


def test_cross_entropy_is_computed_in_fp32():
    logits = torch.randn(2, 5, 11).to(torch.bfloat16)
    targets = torch.randint(0, 11, (2, 5))
    loss = cross_entropy(logits, targets)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(nn.functional.cross_entropy(logits.float().view(-1, 11), targets.view(-1)).item(), rel=1e-6)


def test_the_loss_compiles_with_the_blocks_and_computes_what_the_eager_one_does(tmp_path):
    eager_plan, _ = make_plan(tmp_path / "e")
    assert loss_function(eager_plan) is cross_entropy
    plan, _ = make_plan(tmp_path / "c", compile__enabled=True)
    compiled = loss_function(plan)
    assert compiled is not cross_entropy and compiled._torchdynamo_orig_callable is cross_entropy
    torch.manual_seed(0)
    logits = torch.randn(2, 64, 512, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 512, (2, 64))
    want = cross_entropy(logits, targets)
    want.backward()
    grad, logits.grad = logits.grad, None
    got = compiled(logits, targets)
    got.backward()
    assert got.dtype == torch.float32 and got.item() == pytest.approx(want.item(), rel=1e-6)
    torch.testing.assert_close(logits.grad, grad, rtol=1e-2, atol=1e-5)  # bf16 gradients, fused differently


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_accumulating_two_micro_batches_equals_one_batch_of_two(world, tmp_path, strategy):
    """Same data, same start: micro 1 x accum 2 and micro 2 x accum 1 give the same update (fp32;
    SGD, whose update is linear in the gradient, unlike Adam's first step)."""
    batches = token_batches(2, batch=1)
    both = [torch.cat(batches)]
    results = []
    for i, (micro, accum, data) in enumerate([(1, 2, batches), (2, 1, both)]):
        plan, plan_dir = make_plan(tmp_path / str(i), precision__mode="fp32", distributed__strategy=strategy,
                                   train__micro_batch_size=micro, train__grad_accum_steps=accum, train__steps=1,
                                   train__optimizer="sgd", train__lr=1.0)
        trainer, logger = _trainer(tmp_path / str(i), plan, plan_dir, data)
        result = trainer.train_step()
        logger.close()
        params = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in trainer.state.engine.model.state_dict().items()}
        results.append((result, params))
    (r1, p1), (r2, p2) = results
    assert r1.loss == pytest.approx(r2.loss, rel=1e-5)
    assert r1.grad_norm == pytest.approx(r2.grad_norm, rel=1e-4)
    for k in p1:
        torch.testing.assert_close(p1[k], p2[k], rtol=1e-5, atol=1e-6)


def test_a_run_logs_every_record_with_the_contract_fields(world, tmp_path):
    plan, plan_dir = make_plan(tmp_path, distributed__strategy="ddp", train__steps=5, train__log_every=2, train__warmup_steps=1)
    stream = io.StringIO()
    seen = []
    trainer, logger = _trainer(tmp_path, plan, plan_dir, token_batches(5), log_every_stream=stream,
                               callbacks=[lambda s: seen.append(s.step)])
    summary = trainer.run()
    logger.close()
    records = _records(tmp_path)
    assert [r["event"] for r in records] == ["step", "step", "step", "end"]
    steps = records[:3]
    assert [r["step"] for r in steps] == [2, 4, 5]  # every log_every steps, and the last one
    for r in steps:
        assert list(r)[1:1 + len(STEP_FIELDS)] == list(STEP_FIELDS)
        assert r["mfu"] is None  # no known peak on a CPU
        assert r["tokens_per_s"] == pytest.approx(plan.tokens_per_step / r["step_time_s"])
        assert r["tflops_per_device"] == pytest.approx(1e6 * r["tokens_per_s"] / 1e12)
        assert r["peak_mem_gib"] > 0.05 and r["world_size"] == 1 and r["grad_norm"] > 0
    # The lr each record shows is the one its step used: warm-up 1 -> step 1 at lr/2, step 2 at the peak.
    assert steps[0]["lr"] == pytest.approx(plan.train.lr * lr_factor(1, warmup_steps=1, steps=5))
    assert seen == [1, 2, 3, 4, 5]
    assert summary == {k: v for k, v in records[-1].items() if k != "event"}
    assert summary["steps_run"] == 5 and summary["final_step"] == 5 and summary["tokens_seen"] == 5 * plan.tokens_per_step
    assert "step 4/5 | loss " in stream.getvalue() and stream.getvalue().splitlines()[-1].startswith("done: 5 steps")


class _NaNAt(nn.Module):
    """Wraps a model; its output is NaN on the calls listed."""

    def __init__(self, model, bad_calls):
        super().__init__()
        self.model, self.vocab_size, self.bad, self.calls = model, model.vocab_size, set(bad_calls), 0

    def forward(self, tokens):
        self.calls += 1
        out = self.model(tokens)
        return out * float("nan") if self.calls in self.bad else out


def test_a_non_finite_loss_stops_naming_the_step(world, tmp_path):
    plan, plan_dir = make_plan(tmp_path, distributed__strategy="ddp", train__steps=4)
    trainer, logger = _trainer(tmp_path, plan, plan_dir, token_batches(4), model=_NaNAt(tiny_model(), {3}))
    with pytest.raises(TrainingDiverged, match=r"step 3: non-finite loss nan") as e:
        trainer.run()
    logger.close()
    assert e.value.exit_code == EXIT_DIVERGED and 'train.on_nan = "skip"' in str(e.value)
    assert "; last complete checkpoint: none yet; likely causes (the learning rate (lower train.lr" in str(e.value)
    assert "\n" not in str(e.value)
    assert [r["step"] for r in _records(tmp_path)] == [1, 2]


def test_the_divergence_message_names_the_last_complete_checkpoint(world, tmp_path):
    plan, plan_dir = make_plan(tmp_path, distributed__strategy="ddp", train__steps=6, train__checkpoint_every=2,
                               train__output_dir=str(tmp_path / "out"))
    ckpt = CheckpointManager.for_plan(plan, rank=0, world_size=1)
    trainer, logger = _trainer(tmp_path, plan, plan_dir, token_batches(6), model=_NaNAt(tiny_model(), {5}),
                               callbacks=[ckpt.callback], checkpoints=ckpt)
    with pytest.raises(TrainingDiverged) as e:
        trainer.run()
    logger.close()
    assert str(e.value).startswith(
        f'error: step 5: non-finite loss nan, gradient norm nan; every rank stopped before the update (train.on_nan = "stop"); '
        f"last complete checkpoint: {ckpt.dir}/step-4; likely causes (")
    assert 'fix: make the change and resume from that checkpoint (train.resume = "auto", or its path)' in str(e.value)


@pytest.mark.parametrize(("mode", "backend", "recipe", "expected"), [
    ("fp8", "torchao", "tensorwise",
     ['overflow in FP8 e4m3 with tensorwise scaling', 'precision.torchao.recipe = "rowwise"', "lower train.lr"]),
    ("fp8", "torchao", "rowwise", ["rowwise-scaled GEMM", "precision.keep", "lower train.lr"]),
    ("fp8", "te", "delayed", ["amax history of earlier steps", 'precision.te.recipe = "current"']),
    ("fp8", "te", "mxfp8", ["Transformer Engine's mxfp8 scaling"]),
    ("fp8", "msamp", "O2", ["loss scaling", 'precision.msamp.opt_level = "O1"']),
    ("fp16", "torchao", "fp16", ["fp16 overflow", 'precision.mode = "bf16"']),
    ("bf16", "torchao", "bf16", ["the learning rate (lower train.lr or raise train.warmup_steps)"]),
])
def test_likely_causes_fit_the_precision(mode, backend, recipe, expected):
    plan = SimpleNamespace(precision=SimpleNamespace(mode=mode, backend=backend))
    report = SimpleNamespace(backend=backend if mode == "fp8" else "amp", recipe=recipe)
    text = likely_causes(plan, report)
    assert all(e in text for e in expected), text
    assert "stale" not in text  # a resumed delayed-scaling run continues with its checkpoint's amax histories (issue 29)


def test_skip_leaves_the_weights_alone_and_is_bounded(world, tmp_path):
    plan, plan_dir = make_plan(tmp_path, distributed__strategy="ddp", train__steps=4, train__on_nan="skip")
    trainer, logger = _trainer(tmp_path, plan, plan_dir, token_batches(20), model=_NaNAt(tiny_model(), {2}))
    trainer.step_and_log()
    before = {k: v.clone() for k, v in trainer.state.engine.module.state_dict().items()}
    lr_before = trainer.state.engine.lr()
    result = trainer.step_and_log()
    assert result.skipped and math.isnan(result.loss) and trainer.state.skipped_steps == 1
    for k, v in trainer.state.engine.module.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    assert trainer.state.engine.lr() < lr_before  # the schedule moves on with the step count
    assert not trainer.train_step().skipped
    trainer.state.engine.module.bad = set(range(4, 4 + MAX_CONSECUTIVE_SKIPS))
    with pytest.raises(TrainingDiverged, match=f"for {MAX_CONSECUTIVE_SKIPS} steps in a row"):
        for _ in range(MAX_CONSECUTIVE_SKIPS):
            trainer.train_step()
    logger.close()
    first, skipped = _records(tmp_path)
    assert first["loss"] > 0 and skipped["step"] == 2 and skipped["loss"] is None  # NaN is written as null: valid JSON
    assert (first["skipped_steps"], skipped["skipped_steps"]) == (0, 1)


def test_skipped_steps_are_counted_in_the_step_and_end_records(world, tmp_path):
    plan, plan_dir = make_plan(tmp_path, distributed__strategy="ddp", train__steps=5, train__on_nan="skip")
    trainer, logger = _trainer(tmp_path, plan, plan_dir, token_batches(5), model=_NaNAt(tiny_model(), {2, 4}))
    summary = trainer.run()
    logger.close()
    records = _records(tmp_path)
    assert [r["skipped_steps"] for r in records[:-1]] == [0, 1, 1, 2, 2]
    assert [r["loss"] is None for r in records[:-1]] == [False, True, False, True, False]
    assert records[-1]["event"] == "end" and records[-1]["skipped_steps"] == summary["skipped_steps"] == 2


def test_train_state_round_trip_restores_counters_data_position_and_rng(world, tmp_path):
    from launcher.train.data import build_data

    plan, plan_dir = make_plan(tmp_path, distributed__strategy="ddp")
    model = tiny_model()
    engine = wrap(model, plan, apply_precision(model, plan, CPU.device), plan_dir, env=CPU, layout=plan.distributed.layout(CPU.world_size))

    def stream():
        return build_data("synthetic", seq_len=16, micro_batch_size=2, vocab_size=2048, rank=0, world_size=1, seed=0, spec_dir=".")

    state = TrainState(engine=engine, data=stream(), step=7, tokens_seen=700, skipped_steps=1)
    next(state.data), next(state.data)
    saved = state.state_dict()
    expected_batch, expected_rand = next(state.data), torch.rand(3)
    restored = TrainState(engine=engine, data=stream())
    restored.load_state_dict(saved)
    assert (restored.step, restored.tokens_seen, restored.skipped_steps) == (7, 700, 1)
    assert torch.equal(next(restored.data), expected_batch) and torch.equal(torch.rand(3), expected_rand)
    assert set(engine.train_state()) == {"model", "optimizer", "scheduler"}


def test_metrics_logger_on_other_ranks_writes_nothing(tmp_path):
    logger = MetricsLogger(output_dir=str(tmp_path / "out"), enabled=False, total_steps=3)
    logger.start({"x": 1}, "line")
    logger.close()
    assert not (tmp_path / "out").exists()


PEAK_PROBE = """
import json, torch
from launcher.train.metrics import peak_memory_gib
def rss_gib():  # the resident set now, from /proc
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**30
rss = rss_gib()
t = torch.ones(2**27)  # 512 MiB, every page written
del t  # freed: the resident set falls back, its peak stays
print(json.dumps({"rss_before": rss, "rss_after": rss_gib(), "peak": peak_memory_gib(torch.device("cpu"))}))
"""


def test_peak_memory_on_cpu_is_the_process_peak_rss():
    """In a fresh process, the peak after writing and freeing a 512 MiB tensor is the resident set before it plus
    0.5 GiB: 0.5012-0.5014 GiB more over 5 runs (the rest is the allocator's and torch's pages); the resident set
    after the free is back near where it was, so a current-RSS reading fails here, as does a unit other than GiB.
    Started by a parent holding 1 GiB more, as torchrun starts a rank: getrusage's ru_maxrss, which exec carries over
    from the parent, reads that parent's peak (1.06 GiB under xdist before the ballast)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ballast = torch.ones(2**28)  # 1 GiB resident in the parent, as a large launcher would be
    r = subprocess.run([sys.executable, "-c", PEAK_PROBE], cwd=root, capture_output=True, text=True, timeout=120)
    del ballast
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["rss_before"] + 0.49 < m["peak"] < m["rss_before"] + 0.52
    assert m["rss_after"] < m["rss_before"] + 0.05


def test_throughput_mfu_only_with_a_known_peak():
    t = Throughput(tokens_per_step=1000, world_size=4, flops_per_token=6e9, peak_tflops=1000.0)
    assert t.tokens_per_s(0.5) == 2000
    assert t.tflops_per_device(0.5) == pytest.approx(6e9 * 2000 / 4 / 1e12)
    assert t.mfu(0.5) == pytest.approx(t.tflops_per_device(0.5) / 1000)
    assert Throughput(tokens_per_step=1, world_size=1, flops_per_token=1, peak_tflops=None).mfu(1.0) is None


def test_skip_with_an_fp16_loss_scaler_lowers_the_scale_and_goes_on(world, tmp_path):
    plan, plan_dir = make_plan(tmp_path, distributed__strategy="ddp", precision__mode="fp16", train__on_nan="skip")
    trainer, logger = _trainer(tmp_path, plan, plan_dir, token_batches(4), model=_NaNAt(tiny_model(), {2}))
    scaler = trainer.state.engine.precision.grad_scaler
    assert scaler is not None
    trainer.train_step()
    scale = scaler.get_scale()
    assert trainer.train_step().skipped
    assert scaler.get_scale() < scale  # the skipped step counted as an overflow
    assert not trainer.train_step().skipped  # and the scaler is ready for the next step
    logger.close()
