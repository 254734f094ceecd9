"""`backend = "msamp"` in today's stack (issue 37): where MS-AMP 0.4's own stack is not installed (it needs torch
2.1-2.2, so never beside this project's), a spec naming MS-AMP's opt level is planned as the native keys that level
equals (launcher/planning/levels.py), the plan says so in one line, and the run's start record's `effects` say which
level took; MS-AMP itself is used where its stack is installed, and what the native keys cannot express stays with
MS-AMP and its refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest

from launcher.commands.plan_text import plan_summary
from launcher.planning.msamp_levels import MSAMP_LEVELS, native_keys
from launcher.planning.read import nested
from launcher.train import effects
from tests.support import plan_from

from ._engine_setup import make_plan, train_in_process

STRATEGY = {"O1": "ddp", "O2": "ddp", "O3": "fsdp2"}
"""Where each level is planned natively: O3 is ZeRO-3-style sharding, FSDP2."""


def _msamp(level: str, **keys) -> dict:
    return nested({"precision.mode": "fp8", "precision.backend": "msamp", "precision.msamp.opt_level": level,
                   "distributed.strategy": STRATEGY[level], "distributed.procs_per_node": 2, **keys})


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_each_level_plans_as_the_native_keys_it_equals_and_says_so_in_one_line(level):
    plan = plan_from(_msamp(level))
    native = plan_from(nested({"distributed.strategy": "ddp", "distributed.procs_per_node": 2, **MSAMP_LEVELS[level]}))
    assert plan.msamp_native == level and native.msamp_native == ""
    # the same precision and engine as the spec that writes the level's keys (only the unread MS-AMP table differs)
    assert dataclasses.replace(plan.precision, msamp=native.precision.msamp) == native.precision
    assert plan.distributed == native.distributed
    lines = [x for x in plan_summary(plan, "gen/t", []).splitlines() if "native levels" in x]
    assert lines == [f'  MS-AMP      precision.backend = "msamp" with opt_level {level} planned as its native levels '
                     f"({native_keys(level)}): MS-AMP 0.4 is not installed here (it needs torch 2.1-2.2)"]


@pytest.mark.parametrize("keys", [
    {"distributed.strategy": "deepspeed"},  # MS-AMP's DeepSpeed integration
    {"precision.msamp.use_te": True},  # its TE modules
    {"precision.optimizer_states": "bf16"},  # level keys of its own, against the level's
    {"train.optimizer": "sgd"},  # bf16 master weights need Adam's stochastic rounding
    {"precision.high_precision": "fp16"},  # and a bf16 compute dtype
    {"distributed.tensor_parallel": 2},
], ids=["deepspeed", "use_te", "level-key", "sgd", "fp16", "tp"])
def test_what_the_native_keys_cannot_express_stays_with_ms_amp(keys):
    plan = plan_from(_msamp("O2", **keys))
    assert plan.precision.backend == "msamp" and plan.msamp_native == ""


def test_o3_without_fsdp2_stays_with_ms_amp_and_where_its_stack_runs_ms_amp_is_used(monkeypatch):
    assert plan_from(_msamp("O3", **{"distributed.strategy": "ddp"})).precision.backend == "msamp"
    from launcher.planning import stack

    monkeypatch.setattr(stack, "msamp_runs", lambda strategy: strategy == "ddp")  # MS-AMP's own environment
    assert plan_from(_msamp("O2")).precision.backend == "msamp"
    assert plan_from(_msamp("O3")).msamp_native == "O3"  # FSDP2: MS-AMP has none, its native keys do


def test_msamp_o2_plans_and_trains_on_cpu_as_its_native_levels_and_effects_say_so(tmp_path):
    plan, folder = make_plan(tmp_path, **{"precision.mode": "fp8", "precision.backend": "msamp", "precision.msamp.opt_level": "O2",
                                          "precision.torchao.skip_small": False, "distributed.strategy": "ddp",
                                          "train.model": "builtin:llama-debug?layers=2", "train.steps": 2,
                                          "train.output_dir": str(tmp_path / "out")})
    assert json.loads((tmp_path / "gen" / "t" / "plan.json").read_text())["msamp_native"] == "O2"
    train_in_process(f"{folder}/plan.json")
    start = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    e = start["effects"]
    assert e["msamp_level"] == "O2 natively"
    # read from the live objects: torchao's FP8 Adam with FP8 moments, the FP8 gradient reduction, bf16 weights
    assert (e["optimizer"], e["optimizer_states"], e["grad_reduce"], e["master_weights"]) == ("AdamWFp8", "fp8", "fp8", "bf16")
    assert start["backend"] == "torchao" and start["fp8_layers"] == 13  # every Linear but the first and the last


@pytest.mark.parametrize(("measured", "level"), [
    ({"grad_reduce": "fp8", "master_weights": "bf16", "optimizer_states": "fp32", "all_gather_dtype": None}, "O1 natively"),
    ({"grad_reduce": "fp8", "master_weights": "bf16", "optimizer_states": "fp8", "all_gather_dtype": "bfloat16"}, "O2 natively"),
    ({"grad_reduce": "fp8", "master_weights": "bf16", "optimizer_states": "fp8", "all_gather_dtype": "float8_e4m3fn"}, "O3 natively"),
    ({"grad_reduce": "bf16", "master_weights": "bf16", "optimizer_states": "fp8", "all_gather_dtype": None}, None),
    ({"grad_reduce": "fp8", "master_weights": "fp32", "optimizer_states": "fp8", "all_gather_dtype": None}, None),
])
def test_the_level_is_read_from_the_measured_effects_and_a_missing_one_stops_the_run(measured, level):
    fp8 = type("Report", (), {"backend": "torchao", "recipe": "tensorwise", "mode": "fp8"})
    assert effects.msamp_level(measured, fp8) == level
    assert effects.msamp_level(measured, type("Report", (), {"backend": "amp", "recipe": "bf16", "mode": "bf16"})) is None
    assert effects.msamp_level(measured, type("Report", (), {"backend": "msamp", "recipe": "O2", "mode": "fp8"})) == "O2 (MS-AMP)"
    plan = plan_from(_msamp("O2"))
    lines = [x for x in effects.missing(plan, {**measured, "msamp_level": level}, 2) if x.startswith("precision.msamp")]
    assert lines == ([] if level == "O2 natively" else [f"precision.msamp.opt_level needs msamp_level = O2 natively, "
                                                        f"and this run has {level!r}"])
