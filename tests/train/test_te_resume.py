"""Transformer Engine runs checkpoint and resume to the bit, in this process, with the stand-in TE
(tests/train/test_te_standin.py: TE 2.20's extra state as a pickle its set_extra_state refuses, delayed
scaling from the amax history of earlier steps).

- delayed scaling, FSDP2 and DeepSpeed: a run resumed from another run's step-4 checkpoint logs the same losses
  for steps 5..8 as the uninterrupted run, because the scales and amax histories come back (as plain tensors in
  the rank file); without them (the restore skipped) the losses differ, so the test can tell;
- current scaling resumes with no TE state in the checkpoint at all;
- a checkpoint holding TE's own pickle (what fp8launch wrote before) is refused by TE, and the error says
  so with TE's opt-in, not that the checkpoint "does not fit".

TE runs only on CUDA, so the plan is made for cuda (rule CPU-BACKEND refuses te on the CPU) and plan.json
then pointed at the CPU, where the stand-in runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
import torch

from launcher.errors import InputError
from launcher.train.precision import te as te_backend
from launcher.train.precision import te_state

from ._engine_setup import make_plan, train_in_process
from .test_te_standin import fake_te

BASE = {"distributed.procs_per_node": 1, "train.model": "builtin:llama-debug?layers=2", "train.steps": 8,
        "train.micro_batch_size": 2, "train.checkpoint_every": 4, "train.lr": 3e-3, "train.warmup_steps": 0,
        "precision.mode": "fp8", "precision.backend": "te", "precision.keep_first_last": False, "launch.device": "cuda"}


def te_cpu_plan(folder, **keys) -> str:
    """plan.json of a TE spec planned for cuda, pointed at the CPU (where the stand-in TE runs)."""
    _, plan_dir = make_plan(folder, **{**BASE, **keys})
    path = os.path.join(plan_dir, "plan.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data["launch"]["device"] = "cpu"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return path


@pytest.fixture
def standin(monkeypatch):
    """The stand-in TE (on an H100) where launcher/train/precision/te.py imports the real one."""
    te, te_recipe, log = fake_te()
    monkeypatch.setattr(te_backend, "_te", lambda: (te, te_recipe))
    return te


@pytest.fixture
def blackwell_standin(monkeypatch):
    """The stand-in TE on a B200 (sm100): FP8 attention of llama-debug's head_dim 32, and under current scaling."""
    te, te_recipe, log = fake_te(capability=(10, 0))
    monkeypatch.setattr(te_backend, "_te", lambda: (te, te_recipe))
    return te


def run(tmp_path, name, **keys) -> tuple[list[dict], str]:
    """Train in this process; (metrics.jsonl records, output_dir)."""
    out = tmp_path / name
    plan = te_cpu_plan(tmp_path / f"plan-{name}", **{"train.output_dir": str(out), **keys})
    train_in_process(plan, stream=io.StringIO())
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], str(out)


def losses(records: list[dict]) -> dict[int, float]:
    out = {r["step"]: r["loss"] for r in records if r["event"] == "step"}
    assert out, "no step records"
    return out


@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
@pytest.mark.parametrize("strategy", ["fsdp2", "deepspeed"])
def test_a_resumed_delayed_scaling_run_continues_as_the_uninterrupted_one(tmp_path, standin, strategy):
    """FSDP2 (DCP: the modules' _extra_state in the rank file, empty) and DeepSpeed (its own checkpoint, written with
    the TE modules' _extra_state empty): the scaling state rides in the rank file either way."""
    keys = {"precision.te.recipe": "delayed", "precision.te.amax_history_len": 4, "distributed.strategy": strategy}
    ref, out = run(tmp_path, "ref", **keys)
    step4 = os.path.join(out, "checkpoints", "step-4")
    rank_file = torch.load(os.path.join(step4, "rank-00000.pt"), weights_only=True)  # plain tensors: no pickle to trust
    scaling = rank_file["te_scaling"]
    assert "layers.0.attention.wk" in scaling and scaling["layers.0.attention.wk"]["amax_history_fwd"].shape == (4, 3)
    assert scaling["layers.0.attention.wk"]["amax_history_fwd"].abs().sum() > 0  # the history it continues from
    assert all(v.numel() == 0 for v in (rank_file.get("fp8_extra_state") or {}).values())  # never TE's pickle

    resumed, _ = run(tmp_path, "resumed", **keys, **{"train.resume": step4})
    assert resumed[0]["resumed_from"] == step4
    assert losses(resumed) == {s: v for s, v in losses(ref).items() if s > 4}


def test_without_the_scaling_state_the_resumed_losses_differ(tmp_path, standin, monkeypatch):
    """The equality above is not luck: dropping the restored scales and histories changes steps 5..8."""
    keys = {"precision.te.recipe": "delayed", "precision.te.amax_history_len": 4}
    ref, out = run(tmp_path, "ref", **keys)
    monkeypatch.setattr(te_state, "restore_scaling_state", lambda model, saved, *recipes: 0)
    resumed, _ = run(tmp_path, "lost", **keys, **{"train.resume": os.path.join(out, "checkpoints", "step-4")})
    after = {s: v for s, v in losses(ref).items() if s > 4}
    assert set(losses(resumed)) == set(after) and losses(resumed) != after


def test_a_current_scaling_run_resumes_with_no_te_state(tmp_path, standin):
    ref, out = run(tmp_path, "ref", **{"precision.te.recipe": "current"})
    step4 = os.path.join(out, "checkpoints", "step-4")
    assert torch.load(os.path.join(step4, "rank-00000.pt"), weights_only=True)["te_scaling"] == {}
    resumed, _ = run(tmp_path, "resumed", **{"precision.te.recipe": "current", "train.resume": step4})
    assert losses(resumed) == {s: v for s, v in losses(ref).items() if s > 4}


def test_current_scaling_fp8_attention_resumes_in_tes_layout(tmp_path, blackwell_standin):
    """Float8CurrentScaling with fp8_dpa: each te.DotProductAttention keeps one GEMM's delayed-scaling state (S and dP: 3
    forward and 2 backward slots) under num_gemms 3. The resumed run puts it back in that layout and continues as the
    uninterrupted one (rebuilt as three GEMMs it failed: "The size of tensor a (9) must match the size of tensor b (3)")."""
    keys = {"precision.te.recipe": "current", "precision.te.fp8_dpa": True}
    ref, out = run(tmp_path, "ref", **keys)
    step4 = os.path.join(out, "checkpoints", "step-4")
    scaling = torch.load(os.path.join(step4, "rank-00000.pt"), weights_only=True)["te_scaling"]
    assert sorted(scaling) == ["layers.0.attention.core", "layers.1.attention.core"]  # the Linears keep none
    core = scaling["layers.0.attention.core"]
    assert core["scale_fwd"].shape == (3,) and core["amax_history_bwd"].shape == (1, 2) and int(core["num_gemms"]) == 3
    resumed, _ = run(tmp_path, "resumed", **keys, **{"train.resume": step4})
    assert losses(resumed) == {s: v for s, v in losses(ref).items() if s > 4}


def test_tes_pickled_extra_state_is_refused_by_te_and_said_so(tmp_path, standin, monkeypatch):
    """What fp8launch wrote before: TE's pickle in the rank file. TE 2.20 refuses to unpickle it; the message is TE's
    refusal and its opt-in, not "does not fit"."""
    keys = {"precision.te.recipe": "delayed", "precision.te.amax_history_len": 4, "train.steps": 4}
    with monkeypatch.context() as m:  # the old save: TE's own _extra_state, no plain tensors
        m.setattr(te_state, "empty_extra_state", _as_te_writes_it)
        m.setattr(te_state, "scaling_state", lambda model: {})
        _, out = run(tmp_path, "old", **keys)
    step4 = os.path.join(out, "checkpoints", "step-4")
    payloads = torch.load(os.path.join(step4, "rank-00000.pt"), weights_only=True)["fp8_extra_state"]
    assert any(v.numel() > 0 for v in payloads.values())
    with pytest.raises(InputError) as e:
        run(tmp_path, "resumed", **{**keys, "train.steps": 8, "train.resume": step4})
    message = str(e.value)
    assert "Transformer Engine refuses to unpickle it" in message and "Refusing to load pickled Transformer Engine extra state" in message
    assert 'launch.env NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE = "1"' in message and "does not fit" not in message


def test_a_checkpoint_that_does_not_fit_keeps_its_message(tmp_path, standin):
    """Scaling state of modules the resuming model does not have (another model): "does not fit", as before."""
    _, out = run(tmp_path, "ref", **{"precision.te.recipe": "delayed", "precision.te.amax_history_len": 4, "train.steps": 4})
    with pytest.raises(InputError, match="does not fit this run's model"):
        run(tmp_path, "other", **{"precision.te.recipe": "delayed", "precision.te.amax_history_len": 4,
                                  "train.model": "builtin:llama-debug?layers=1", "train.steps": 8,
                                  "train.resume": os.path.join(out, "checkpoints", "step-4")})


@contextlib.contextmanager
def _as_te_writes_it(model):
    """empty_extra_state replaced by nothing: the modules' _extra_state is what TE's get_extra_state returns."""
    yield 0
