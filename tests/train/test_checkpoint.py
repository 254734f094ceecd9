"""Checkpoints: atomic saves that a crash cannot half-publish, pruning only after a newer one is
complete, train.resume's modes and errors, RNG round trips, bit-identical continuation after a
load (DDP bf16 in-process; FSDP2 + torchao float8 all-gather and DeepSpeed ZeRO-2 on two real
ranks), and the fp8launch-free exports (DCP's format_utils, DeepSpeed's zero_to_fp32.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import launcher.train.checkpoint as ckpt_mod
from launcher.errors import LauncherError
from launcher.train.checkpoint import MARKER, CheckpointManager, clean_fqn, read_marker
from launcher.train.data import SyntheticStream
from launcher.train.models.llama import Llama, LlamaConfig
from launcher.train.optim import build_scheduler
from launcher.train.rng import rng_state, set_rng_state

from ._engine_setup import gloo_world, spawn_ranks

CFG = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=16)
TRAIN = SimpleNamespace(lr=3e-3, weight_decay=0.1, warmup_steps=2, steps=8, min_lr_ratio=0.1)
"""What build_scheduler reads from plan.train."""


@pytest.fixture
def world():
    with gloo_world():
        yield


def llama(seed: int) -> Llama:
    torch.manual_seed(seed)
    return Llama(CFG)


def stream(rank: int = 0) -> SyntheticStream:
    return SyntheticStream(seq_len=16, micro_batch_size=2, vocab_size=CFG.vocab_size, rank=rank, seed=7)


def train(model, optimizer, scheduler, data, steps: int, *, autocast=None, after_step=None) -> list[float]:
    """The loop's step in miniature: bf16 autocast forward, fp32 cross entropy, clip, step, schedule."""
    losses = []
    for _ in range(steps):
        tokens = next(data)
        with autocast() if autocast else torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if after_step:
            after_step(model)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def manager(tmp_path, keep: int = 2, strategy: str = "ddp") -> CheckpointManager:
    return CheckpointManager(str(tmp_path / "run"), keep=keep, strategy=strategy)


def save_small(m: CheckpointManager, step: int, **kw) -> str:
    model = nn.Linear(4, 4)
    return m.save(step, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), **kw)


def steps_on_disk(m: CheckpointManager) -> list[str]:
    return sorted(os.listdir(m.dir))


# -- atomicity, pruning, finding ------------------------------------------------------------

def test_save_publishes_a_complete_folder_atomically(tmp_path, world):
    m = manager(tmp_path)
    path = save_small(m, 3, data_state={"batches": 6}, extra={"tokens_seen": 96})
    assert path == os.path.join(m.dir, "step-3") and steps_on_disk(m) == ["step-3"]
    assert sorted(os.listdir(path)) == [MARKER, "model", "optim", "rank-00000.pt"]
    marker = read_marker(path)
    assert (marker["step"], marker["world_size"], marker["strategy"], marker["format"]) == (3, 1, "ddp", "dcp")
    assert marker["fp8launch_version"] and marker["save_seconds"] >= 0
    rank_file = torch.load(os.path.join(path, "rank-00000.pt"), weights_only=True)
    assert rank_file["data"] == {"batches": 6} and rank_file["extra"] == {"tokens_seen": 96}
    assert m.latest_complete() == path and m.resolve_resume("auto") == path


def test_a_crash_mid_save_leaves_nothing_that_resume_would_load(tmp_path, world, monkeypatch):
    m = manager(tmp_path)
    good = save_small(m, 5)
    monkeypatch.setattr(ckpt_mod, "_write_json", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))  # killed before the marker
    with pytest.raises(KeyboardInterrupt):
        save_small(m, 10)
    monkeypatch.undo()
    assert os.path.isdir(os.path.join(m.dir, ".tmp-step-10"))  # the half-written save is still there ...
    os.makedirs(os.path.join(m.dir, "step-7", "model"))  # ... and a folder without a marker ...
    os.makedirs(os.path.join(m.dir, "step-8"))
    Path(m.dir, "step-8", MARKER).write_text('{"step": 8')  # ... and one with a truncated marker
    assert m.latest_complete() == good and m.resolve_resume("auto") == good  # ... none of them counts
    save_small(m, 11)
    assert not os.path.exists(os.path.join(m.dir, ".tmp-step-10"))  # the next save sweeps the leftovers
    assert m.latest_complete() == os.path.join(m.dir, "step-11")


def test_pruning_keeps_the_newest_and_deletes_only_after_a_newer_one_is_complete(tmp_path, world, monkeypatch):
    m = manager(tmp_path, keep=2)
    for step in (1, 2, 3):
        save_small(m, step)
    assert steps_on_disk(m) == ["step-2", "step-3"]
    monkeypatch.setattr(ckpt_mod.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(LauncherError, match=r"no space left on device writing .*/\.tmp-step-4 \([\d,]+ bytes free on /.*\); the newest "
                                             r"complete checkpoint is .*/step-3; fix: free space on"):
        save_small(m, 4)
    monkeypatch.undo()
    assert [s for s, _ in m.complete()] == [2, 3]  # the failed save removed nothing
    save_small(m, 4)
    assert steps_on_disk(m) == ["step-3", "step-4"]


def test_a_folder_other_ranks_cannot_see_stops_the_save(tmp_path, world, monkeypatch):
    m = manager(tmp_path)
    monkeypatch.setattr(ckpt_mod, "_fresh_folder", lambda checkpoints, tmp: None)  # as if on another node's disk
    with pytest.raises(LauncherError, match="rank 0 cannot see the checkpoint folder .* must be on a filesystem every node shares"):
        save_small(m, 1)


def test_saving_a_step_again_replaces_it(tmp_path, world):
    m = manager(tmp_path)
    save_small(m, 4, extra={"n": 1})
    save_small(m, 4, extra={"n": 2})
    assert steps_on_disk(m) == ["step-4"]
    assert torch.load(os.path.join(m.dir, "step-4", "rank-00000.pt"), weights_only=True)["extra"] == {"n": 2}


def test_resolve_resume_modes(tmp_path, world):
    m = manager(tmp_path)
    assert m.resolve_resume("auto") is None and m.resolve_resume("never") is None
    save_small(m, 2)
    newest = save_small(m, 4)
    assert m.resolve_resume("auto") == newest
    assert m.resolve_resume(os.path.join(m.dir, "step-2")) == os.path.join(m.dir, "step-2")
    assert m.resolve_resume(str(tmp_path / "run")) == newest  # a run's output_dir: its newest checkpoint
    assert m.resolve_resume(m.dir) == newest  # its checkpoints folder too


def test_resolve_resume_errors_name_the_key_and_the_fix(tmp_path, world):
    m = manager(tmp_path)
    newest = save_small(m, 4)
    with pytest.raises(LauncherError) as e:
        m.resolve_resume("never")
    assert str(e.value) == (
        f'error: train.resume: "never" starts a fresh run, but {m.dir} already holds 1 complete checkpoint(s) of a run '
        f'(newest: step-4) that it would overwrite; fix: set train.resume = "auto" to continue that run, '
        f"or give this run a new train.output_dir, or delete {m.dir}"
    )
    with pytest.raises(LauncherError, match=r"train.resume: nope/step-9 does not exist .*fix: name a checkpoint folder"):
        m.resolve_resume("nope/step-9")
    half = os.path.join(m.dir, ".tmp-step-8")
    os.makedirs(half)
    with pytest.raises(LauncherError, match=rf"is not a complete checkpoint: it has no readable {MARKER}.*e\.g\. {newest}"):
        m.resolve_resume(half)


def test_clean_fqn_drops_wrapper_modules():
    assert clean_fqn("layers.0._orig_mod._checkpoint_wrapped_module.attention.wq.weight") == "layers.0.attention.wq.weight"
    assert clean_fqn("_fsdp_wrapped_module.output.weight") == "output.weight"
    assert clean_fqn("orig_mod.weight") == "orig_mod.weight"


# -- RNG -------------------------------------------------------------------------------------

def _draw():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist(), int(torch.randint(0, 10**9, ()))


def test_rng_round_trip():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # leaves a cached Gaussian in NumPy's state
    state = rng_state()
    first = _draw()
    _draw()
    set_rng_state(state)
    assert _draw() == first


def test_load_restores_this_ranks_rng(tmp_path, world):
    m = manager(tmp_path)
    model = nn.Linear(4, 4)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    path = m.save(1, model=model)
    expected = _draw()
    _draw()
    m.load(path, model=model)
    assert _draw() == expected


# -- exact continuation and export (DDP, one process) ------------------------------------------

def _ddp_run(seed: int):
    model = nn.parallel.DistributedDataParallel(llama(seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN.lr, weight_decay=TRAIN.weight_decay)
    return model, optimizer, build_scheduler(optimizer, TRAIN), stream()


def _weights(model) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v.clone() for k, v in get_model_state_dict(model).items()}


def test_ddp_bf16_resume_is_bit_identical(tmp_path, world):
    m = manager(tmp_path)
    model, opt, sched, data = _ddp_run(seed=0)
    train(model, opt, sched, data, 3)
    path = m.save(3, model=model, optimizer=opt, scheduler=sched, data_state=data.state_dict(), extra={"tokens_seen": 96})
    expected = train(model, opt, sched, data, 3)
    expected_weights, expected_lr = _weights(model), sched.get_last_lr()

    model, opt, sched, data = _ddp_run(seed=1)  # other weights: only the load can make them equal
    loaded = m.load(m.resolve_resume("auto"), model=model, optimizer=opt, scheduler=sched)
    assert (loaded.path, loaded.step, loaded.extra, loaded.warnings) == (path, 3, {"tokens_seen": 96}, ())
    data.load_state_dict(loaded.data_state)
    assert train(model, opt, sched, data, 3) == expected  # bit for bit: float equality
    assert sched.get_last_lr() == expected_lr
    got = _weights(model)
    assert got.keys() == expected_weights.keys() and all(torch.equal(got[k], expected_weights[k]) for k in got)


def test_the_manager_of_a_plan_takes_its_train_keys(tmp_path):
    from support import plan_from

    train = {"output_dir": str(tmp_path / "run"), "steps": 7, "checkpoint_every": 3, "keep_checkpoints": 4}
    m = CheckpointManager.for_plan(plan_from({"train": train}), rank=0, world_size=1)
    assert (m.keep, m.every, m.at_end) == (4, 3, True)
    assert [s for s in range(1, 8) if m.due(s)] == [3, 6, 7]  # every checkpoint_every steps, and the last (checkpoint_at_end)
    m = CheckpointManager.for_plan(plan_from({"train": {**train, "checkpoint_every": 0, "checkpoint_at_end": False}}),
                                   rank=0, world_size=1)
    assert not [s for s in range(1, 8) if m.due(s)]


def test_train_state_helpers_save_on_schedule_and_restore_counters_and_data(tmp_path, world):
    """The loop's side, duck-typed: TrainState(engine, data, step, tokens_seen, skipped_steps)."""
    def state_of(seed):
        model, opt, sched, data = _ddp_run(seed)
        engine = SimpleNamespace(train_state=lambda: {"model": model, "optimizer": opt, "scheduler": sched},
                                 precision=SimpleNamespace(grad_scaler=None), flat_optimizer_state=False)
        return SimpleNamespace(engine=engine, data=data, step=0, tokens_seen=0, skipped_steps=0)

    m = CheckpointManager(str(tmp_path / "run"), keep=2, strategy="ddp", every=2, total_steps=5)
    assert m.restore_train_state(state_of(0), "auto") is None
    state = state_of(0)
    for step in range(1, 6):
        state.step, state.tokens_seen, state.skipped_steps = step, 32 * step, step // 3
        next(state.data)
        m.callback(state)
    assert [s for s, _ in m.complete()] == [4, 5]  # due at 2, 4 and the last step; keep 2
    fresh = state_of(1)
    loaded = m.restore_train_state(fresh, "auto")
    assert (loaded.step, fresh.step, fresh.tokens_seen, fresh.skipped_steps) == (5, 5, 160, 1)
    assert fresh.data.state_dict() == state.data.state_dict()
    got, want = _weights(fresh.engine.train_state()["model"]), _weights(state.engine.train_state()["model"])
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


def _run(*args, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_dcp_export_is_a_plain_state_dict_with_clean_fqns(tmp_path, world):
    """Blocks wrapped as the entrypoint wraps them (activation checkpointing, torch.compile) and
    the model in DDP: the one-line export still gives the user's FQNs, loadable with strict=True."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    inner = llama(seed=0)
    inner.layers[0] = checkpoint_wrapper(inner.layers[0])
    inner.layers[1] = torch.compile(inner.layers[1], backend="eager")
    model = nn.parallel.DistributedDataParallel(inner)
    assert any("_orig_mod" in n for n, _ in model.named_parameters())
    path = manager(tmp_path).save(1, model=model)
    out = tmp_path / "weights.pt"
    _run("-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch", os.path.join(path, "model"), str(out))
    exported = torch.load(out)  # weights_only=True: plain tensors only
    fresh = Llama(CFG)
    fresh.load_state_dict(exported, strict=True)
    reference = llama(seed=0).state_dict()
    assert sorted(exported) == sorted(reference)
    assert all(type(v) is torch.Tensor and torch.equal(v, reference[k]) for k, v in exported.items())


def test_load_refuses_another_format_and_warns_on_another_world_size(tmp_path, world):
    m = manager(tmp_path)
    model = nn.Linear(4, 4)
    path = m.save(2, model=model, data_state={"batches": 4})
    with pytest.raises(LauncherError, match=r'written by distributed.strategy = "ddp" \(dcp format\); this run uses "deepspeed"'):
        manager(tmp_path, strategy="deepspeed").load(path, model=model)
    marker = read_marker(path)
    Path(path, MARKER).write_text(json.dumps({**marker, "world_size": 4}))
    loaded = manager(tmp_path, strategy="fsdp2").load(path, model=model)  # DCP reshards: ddp -> fsdp2, 4 -> 1
    assert loaded.saved_world_size == 4 and loaded.data_state == {"batches": 4}
    assert loaded.warnings and "written by 4 processes and this run has 1" in loaded.warnings[0]
    Path(path, MARKER).write_text(json.dumps({**marker, "world_size": 4, "strategy": "deepspeed", "format": "deepspeed"}))
    with pytest.raises(LauncherError, match="written by 4 processes and this run has 1; DeepSpeed's ZeRO checkpoints load only"):
        manager(tmp_path, strategy="deepspeed").load(path, model=model, deepspeed_engine=object())


def test_load_into_another_model_names_train_resume(tmp_path, world):
    m = manager(tmp_path)
    path = m.save(2, model=nn.Linear(4, 4))
    with pytest.raises(LauncherError,
                       match=r"train.resume: .* does not fit this run's model and optimizer .*fix: resume with the train.model"):
        m.load(path, model=nn.Linear(4, 8))


class WithScalingState(nn.Module):
    """A Linear with state in `_extra_state` that grows, as Transformer Engine keeps its amax history."""

    def __init__(self, history):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.amax_history = list(history)

    def get_extra_state(self):
        return torch.tensor(self.amax_history)

    def set_extra_state(self, state):
        self.amax_history = state.tolist()


def test_fp8_extra_state_rides_in_the_rank_file_and_stays_out_of_the_weights(tmp_path, world):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    m = manager(tmp_path)
    saved = WithScalingState([1.0, 2.0, 3.0])
    path = m.save(1, model=saved)
    rank_file = torch.load(os.path.join(path, "rank-00000.pt"), weights_only=True)
    assert rank_file["fp8_extra_state"]["_extra_state"].tolist() == [1.0, 2.0, 3.0]
    fresh = WithScalingState([0.5])  # a shorter history than the saved one: DCP could not load into it
    m.load(path, model=fresh)
    assert fresh.amax_history == [1.0, 2.0, 3.0] and torch.equal(fresh.linear.weight, saved.linear.weight)
    dcp_to_torch_save(os.path.join(path, "model"), tmp_path / "w.pt")
    assert sorted(torch.load(tmp_path / "w.pt")) == ["linear.bias", "linear.weight"]


# -- two real ranks ----------------------------------------------------------------------------

def _fsdp2_float8_worker(rank: int, world_size: int, port: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from launcher.train.precision import apply_precision

    from ._precision import fp8_plan

    plan = fp8_plan(torchao={"fsdp_float8_all_gather": True, "precompute_scale": True, "skip_small": False}, strategy="fsdp2")
    torch.set_num_threads(1)
    with gloo_world(rank, world_size, port):
        mesh = init_device_mesh("cpu", (world_size,))

        def build(seed: int):
            model = llama(seed)
            precision = apply_precision(model, plan, torch.device("cpu"))
            assert precision.fsdp_float8_all_gather and precision.report.fp8_layers > 0
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in model.layers:
                fully_shard(block, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
            optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN.lr, weight_decay=TRAIN.weight_decay)
            return model, optimizer, build_scheduler(optimizer, TRAIN), stream(rank), precision

        m = CheckpointManager(out, keep=2, strategy="fsdp2")
        model, opt, sched, data, precision = build(seed=0)
        kw = dict(autocast=precision.autocast, after_step=precision.after_optimizer_step)
        train(model, opt, sched, data, 2, **kw)
        m.save(2, model=model, optimizer=opt, scheduler=sched, data_state=data.state_dict())
        at_save = _weights(model)
        try:  # rank 0 decides; rank 1 must raise the same error rather than wait for rank 0 forever
            m.resolve_resume("never")
        except LauncherError as e:
            Path(out, f"never-{rank}.txt").write_text(f"{e.exit_code} {e}")
        expected = train(model, opt, sched, data, 2, **kw)
        expected_weights = _weights(model)

        model, opt, sched, data, precision = build(seed=1)
        loaded = m.load(m.resolve_resume("auto"), model=model, optimizer=opt, scheduler=sched)
        data.load_state_dict(loaded.data_state)
        got = train(model, opt, sched, data, 2, **kw)
        weights = _weights(model)  # collective: full tensors from the shards

        # Back to step 2 in the same objects (a rollback): the float8 scales precomputed at step 4 must not survive.
        loaded = m.load(loaded.path, model=model, optimizer=opt, scheduler=sched)
        data.load_state_dict(loaded.data_state)
        again = train(model, opt, sched, data, 2, **kw)
        if rank == 0:
            torch.save({"expected": expected, "got": got, "again": again, "expected_weights": expected_weights,
                        "weights": weights, "at_save": at_save, "step": loaded.step}, os.path.join(out, "result.pt"))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_fsdp2_torchao_float8_allgather_resume_is_bit_identical_and_exports_plain(tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # what `python -m ...format_utils dcp_to_torch` runs

    out = str(tmp_path / "run")
    spawn_ranks(_fsdp2_float8_worker, 2, out)
    r = torch.load(os.path.join(out, "result.pt"))
    assert r["step"] == 2 and r["got"] == r["expected"] and r["again"] == r["expected"]
    assert all(torch.equal(r["weights"][k], v) for k, v in r["expected_weights"].items())
    assert read_marker(os.path.join(out, "checkpoints", "step-2"))["float8_precomputed_scale"] is True
    never = [Path(out, f"never-{rank}.txt").read_text() for rank in (0, 1)]
    assert never[0] == never[1] and never[0].startswith('2 error: train.resume: "never" starts a fresh run')
    model_dir = os.path.join(out, "checkpoints", "step-2", "model")
    shards = sorted(f for f in os.listdir(model_dir) if f.endswith(".distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shard
    # torchao's WeightWithDynamicFloat8CastTensor was saved as the plain tensor it wraps: nothing
    # names torchao, and the export loads with weights_only=True (which refuses unknown classes).
    assert not any(b"torchao" in Path(model_dir, f).read_bytes() for f in shards)
    exported = tmp_path / "weights.pt"
    dcp_to_torch_save(model_dir, exported)
    weights = torch.load(exported, weights_only=True)
    assert all(type(v) is torch.Tensor and v.dtype == torch.float32 for v in weights.values())
    Llama(CFG).load_state_dict(weights, strict=True)
    assert all(torch.equal(weights[k], v) for k, v in r["at_save"].items())
    # DCP reshards: the 2-rank FSDP2 checkpoint loads into DDP in a world of one, optimizer state included.
    with gloo_world():
        model, opt, sched, _ = _ddp_run(seed=1)
        loaded = CheckpointManager(out, keep=2, strategy="ddp").load(os.path.join(out, "checkpoints", "step-2"),
                                                                      model=model, optimizer=opt, scheduler=sched)
        assert loaded.saved_world_size == 2 and "written by 2 processes and this run has 1" in loaded.warnings[0]
        assert all(torch.equal(v, r["at_save"][k]) for k, v in _weights(model).items())
        assert sched.last_epoch == 2 and all(int(s["step"]) == 2 for s in opt.state_dict()["state"].values())


def _deepspeed_worker(rank: int, world_size: int, port: int, out: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from launcher.train.engines.deepspeed_engine import import_deepspeed, without_shm_comm

    deepspeed = import_deepspeed(torch.device("cpu"))
    torch.set_num_threads(1)
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
              "steps_per_print": 1000}
    with gloo_world(rank, world_size, port):
        without_shm_comm()
        deepspeed.init_distributed(dist_backend="gloo")

        def build(seed: int):
            model = llama(seed)
            model.layers[0] = checkpoint_wrapper(model.layers[0])  # its parameter names gain _checkpoint_wrapped_module
            optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN.lr, weight_decay=TRAIN.weight_decay)
            engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                                   lr_scheduler=lambda o: build_scheduler(o, TRAIN))
            return engine, stream(rank)

        def run(engine, data, steps):
            losses = []
            for _ in range(steps):
                tokens = next(data)
                loss = F.cross_entropy(engine(tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten())
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
            return losses

        m = CheckpointManager(out, keep=2, strategy="deepspeed")
        engine, data = build(seed=0)
        run(engine, data, 2)
        m.save(2, model=engine, deepspeed_engine=engine, data_state=data.state_dict(), extra={"tokens_seen": 128})
        at_save = {clean_fqn(k): v.detach().clone() for k, v in engine.module.named_parameters()}
        expected = run(engine, data, 2)
        expected_weights = {k: v.detach().clone() for k, v in engine.module.named_parameters()}

        engine, data = build(seed=1)
        loaded = m.load(m.resolve_resume("auto"), model=engine, deepspeed_engine=engine)
        data.load_state_dict(loaded.data_state)
        got = run(engine, data, 2)
        weights = {k: v.detach().clone() for k, v in engine.module.named_parameters()}
        if rank == 0:
            torch.save({"expected": expected, "got": got, "expected_weights": expected_weights, "weights": weights,
                        "at_save": at_save, "step": loaded.step, "extra": loaded.extra, "lr": engine.get_lr()},
                       os.path.join(out, "result.pt"))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_deepspeed_zero2_resume_is_bit_identical_and_zero_to_fp32_exports_clean_fqns(tmp_path):
    out = str(tmp_path / "run")
    spawn_ranks(_deepspeed_worker, 2, out)
    r = torch.load(os.path.join(out, "result.pt"))
    assert (r["step"], r["extra"]) == (2, {"tokens_seen": 128}) and r["got"] == r["expected"]
    assert all(torch.equal(r["weights"][k], v) for k, v in r["expected_weights"].items())
    ds_dir = os.path.join(out, "checkpoints", "step-2", "deepspeed")
    assert {"zero_to_fp32.py", "latest", "ds"} <= set(os.listdir(ds_dir))
    _run(os.path.join(ds_dir, "zero_to_fp32.py"), ds_dir, str(tmp_path / "export"))
    exported = torch.load(tmp_path / "export" / "pytorch_model.bin")
    Llama(CFG).load_state_dict(exported, strict=True)  # no _checkpoint_wrapped_module. in the names
    assert all(v.dtype == torch.float32 for v in exported.values())
    # fp32 master weights, of which the bf16 module weights DeepSpeed trained with are the rounding
    assert all(torch.equal(exported[k].to(torch.bfloat16), v) for k, v in r["at_save"].items())
