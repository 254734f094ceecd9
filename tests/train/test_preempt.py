"""Preemption in the loop: SIGTERM only sets a flag; the flag rides on the step's all-reduce, so
every rank stops after the same step, even a rank that never got the signal; the stop writes a
checkpoint (once, also when the schedule already wrote one of that step) and raises Preempted
(exit 75); a run restored from that checkpoint continues to the same losses as an uninterrupted one.
The end-to-end version, with real signals through `fp8launch run` and torchrun: tests/e2e/test_resume.py."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest
import torch

from launcher.errors import EXIT_PREEMPTED
from launcher.train.checkpoint import CheckpointManager, preempt
from launcher.train.data import build_data
from launcher.train.engines import wrap
from launcher.train.loop import Trainer, TrainState
from launcher.train.metrics import MetricsLogger, Throughput
from launcher.train.precision import apply_precision

from ._engine_setup import CPU, make_plan, spawn_ranks, tiny_model, world_of_one


@pytest.fixture(autouse=True)
def no_request():
    preempt.reset()
    yield
    preempt.reset()


@pytest.fixture(scope="module")
def world():
    with world_of_one() as env:
        yield env


def _trainer(plan, plan_dir, *, env=CPU, callbacks=(), restore: bool = False):
    """Trainer + manager as the entrypoint builds them (same seed, synthetic data, checkpoints in tmp_path/out)."""
    model = tiny_model(seed=0)
    engine = wrap(model, plan, apply_precision(model, plan, env.device), plan_dir, env=env, layout=plan.distributed.layout(env.world_size))
    torch.manual_seed(1 + env.rank)
    data = build_data("synthetic", seq_len=plan.train.seq_len, micro_batch_size=plan.train.micro_batch_size,
                      vocab_size=model.vocab_size, rank=env.rank, world_size=env.world_size, seed=0, spec_dir=".")
    state = TrainState(engine=engine, data=data)
    ckpt = CheckpointManager.for_plan(plan, rank=env.rank, world_size=env.world_size)
    loaded = ckpt.restore_train_state(state, "auto") if restore else None
    logger = MetricsLogger(output_dir=plan.train.output_dir, enabled=env.rank == 0, total_steps=plan.train.steps,
                           start_step=state.step, stream=io.StringIO(), progress=False)
    throughput = Throughput(tokens_per_step=plan.tokens_per_step, world_size=env.world_size, flops_per_token=1e6, peak_tflops=None)
    trainer = Trainer(state, plan, device=env.device, logger=logger, throughput=throughput,
                      callbacks=[ckpt.callback, *callbacks], checkpoints=ckpt, resumed_from=loaded.path if loaded else None)
    return trainer, logger, ckpt


def _plan(tmp_path, **keys):
    return make_plan(tmp_path, distributed__strategy="ddp", train__steps=6, train__output_dir=str(tmp_path / "out"), **keys)


def _records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def _request_at(step: int):
    return lambda state: preempt.request() if state.step == step else None


def test_sigterm_sets_the_flag_and_does_not_kill():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert preempt.install() and preempt.requested() is None
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one (SLURM and torchrun may both send one) changes nothing
        assert preempt.requested() == "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_stop_finishes_the_step_in_progress_checkpoints_it_and_resumes_exactly(world, tmp_path):
    plan, plan_dir = _plan(tmp_path)
    reference, logger, _ = _trainer(*_plan(tmp_path / "ref"))
    expected = reference.run()
    logger.close()
    expected_losses = reference.state.losses

    # The signal comes while step 3 runs (here: requested right after step 2): step 3 completes, then the stop.
    trainer, logger, ckpt = _trainer(plan, plan_dir, callbacks=[_request_at(2)])
    with pytest.raises(preempt.Preempted) as e:
        trainer.run()
    logger.close()
    assert e.value.exit_code == EXIT_PREEMPTED == 75
    assert str(e.value) == (f"preempted: SIGTERM after step 3 of 6; every rank stopped after it and checkpoint {ckpt.dir}/step-3 "
                            'is complete; run the same command again to continue from it (train.resume = "auto")')
    assert [s for s, _ in ckpt.complete()] == [3]
    records = _records(tmp_path)
    assert [r["event"] for r in records] == ["step"] * 3  # no end record: the run did not end
    assert [r["loss"] for r in records] == expected_losses[:3]

    preempt.reset()
    resumed, logger, _ = _trainer(plan, plan_dir, restore=True)
    assert resumed.state.step == 3 and resumed.resumed_from == f"{ckpt.dir}/step-3"
    summary = resumed.run()
    logger.close()
    assert resumed.state.losses == expected_losses[3:]  # bit for bit
    assert summary["final_loss"] == expected["final_loss"] and summary["tokens_seen"] == expected["tokens_seen"]


def test_a_signal_during_start_up_stops_before_the_first_step(world, tmp_path):
    trainer, logger, ckpt = _trainer(*_plan(tmp_path))
    preempt.request()
    with pytest.raises(preempt.Preempted,
                       match=r"^preempted: SIGTERM before the first step of this run \(at step 0 of 6\); nothing new to save;"):
        trainer.run()
    logger.close()
    assert trainer.state.step == 0 and ckpt.complete() == []


def test_a_stop_at_a_scheduled_checkpoint_saves_once(world, tmp_path, monkeypatch):
    plan, plan_dir = _plan(tmp_path, train__checkpoint_every=2)
    trainer, logger, ckpt = _trainer(plan, plan_dir, callbacks=[_request_at(1)])
    saves = []
    save = ckpt.save
    monkeypatch.setattr(ckpt, "save", lambda step, **kw: saves.append(step) or save(step, **kw))
    with pytest.raises(preempt.Preempted, match="after step 2 of 6"):
        trainer.run()
    logger.close()
    assert saves == [2] and [s for s, _ in ckpt.complete()] == [2]


def test_a_stop_at_the_last_step_is_a_normal_end(world, tmp_path):
    plan, plan_dir = _plan(tmp_path, train__checkpoint_at_end=False)
    trainer, logger, ckpt = _trainer(plan, plan_dir, callbacks=[_request_at(5)])
    summary = trainer.run()  # the stop came with the last step: the run is done, nothing to resume
    logger.close()
    assert summary["final_step"] == 6 and ckpt.complete() == []  # checkpoint_at_end = false: none written
    assert _records(tmp_path)[-1]["event"] == "end"


# -- two ranks, one signal ------------------------------------------------------------------------

def _two_rank_worker(rank: int, world_size: int, port: int, folder: str) -> None:
    from pathlib import Path

    from launcher.train.parallel.distributed import DistEnv

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        plan, plan_dir = make_plan(Path(folder) / f"plan-{rank}", distributed__strategy="fsdp2", distributed__procs_per_node=2,
                                   train__steps=6, train__output_dir=os.path.join(folder, "out"))
        env = DistEnv(rank=rank, local_rank=rank, world_size=world_size, device=torch.device("cpu"), backend="gloo")
        only_rank_1 = (lambda state: preempt.request() if rank == 1 and state.step == 2 else None)  # noqa: E731
        trainer, logger, ckpt = _trainer(plan, plan_dir, env=env, callbacks=[only_rank_1])
        try:
            trainer.run()
            outcome = "finished"
        except preempt.Preempted as e:
            outcome = str(e)
        logger.close()
        with open(os.path.join(folder, f"rank-{rank}.json"), "w") as f:
            json.dump({"outcome": outcome, "step": trainer.state.step, "requested": preempt.requested(),
                       "complete": [s for s, _ in ckpt.complete()]}, f)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    """FSDP2 on two real ranks; only rank 1 gets the request (as when one node is preempted). ~6 s."""
    spawn_ranks(_two_rank_worker, 2, str(tmp_path))
    r0, r1 = (json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1))
    assert (r0["requested"], r1["requested"]) == (None, "SIGTERM")
    assert r0["step"] == r1["step"] == 3 and r0["outcome"] == r1["outcome"]
    assert r0["outcome"].startswith("preempted: SIGTERM after step 3 of 6; every rank stopped after it")
    assert r0["complete"] == r1["complete"] == [3]
