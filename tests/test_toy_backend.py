"""A fourth backend is one new record plus its module (launcher/planning/backends.py `register`): the toy backend of
tests/toy_backend.py, registered here and nowhere else, validates, plans and trains on CPU through the real path
(plan_one -> plan.json -> build_run -> Trainer), and fp8launch reports exactly the layers it asked the backend for."""

from __future__ import annotations

import json

import pytest

from launcher.errors import SpecError
from launcher.planning.backends import BACKENDS, register, unregister
from launcher.planning.read import choices, schema_text
from tests.toy_backend import CALLS, TOY
from tests.train._engine_setup import make_plan, train_in_process

SPEC = {"precision.mode": "fp8", "precision.backend": "toy", "train.model": "builtin:llama-debug?layers=2", "train.steps": 3}


@pytest.fixture
def toy():
    register(TOY)
    CALLS.clear()
    try:
        yield TOY
    finally:
        unregister(TOY.name)


def test_registering_adds_the_name_to_the_schema_the_planner_validates_with(toy, tmp_path):
    assert '"toy"' not in schema_text() and "toy" in choices("precision.backend")  # schema.json itself is not edited
    plan, folder = make_plan(tmp_path, **SPEC)
    assert plan.precision.backend == "toy"
    table = json.loads((tmp_path / "gen" / "t" / "plan.json").read_text())["derived"]["precision_table"]
    assert table["gemm"] == "toy: bf16 GEMMs marked as fp8, nothing converted"  # the record's gemms, {hp} filled in
    unregister(TOY.name)
    try:
        with pytest.raises(SpecError, match="precision.backend"):
            make_plan(tmp_path, **SPEC)
    finally:
        register(TOY)


def test_the_toy_backend_plans_and_trains_on_cpu_with_exactly_the_layers_it_was_asked_for(toy, tmp_path):
    _, folder = make_plan(tmp_path / "toy", **SPEC, **{"train.output_dir": str(tmp_path / "toy" / "out")})
    train_in_process(f"{folder}/plan.json")
    records = [json.loads(x) for x in (tmp_path / "toy" / "out" / "metrics.jsonl").read_text().splitlines()]
    start, steps = records[0], [r for r in records if r["event"] == "step"]
    (_, marked), wrapped = CALLS[0], CALLS[1:]
    assert CALLS[0][0] == "apply" and wrapped == [("wrap_optimizer", ())]  # each called once, in this order
    # the selection every backend shares: every Linear but the first and the last (precision.keep_first_last)
    assert marked == tuple(k for k in start["layers"] if k not in ("layers.0.attention.wq", "output"))
    assert {k for k, v in start["layers"].items() if v == "fp8 noop"} == set(marked)
    assert start["backend"] == "toy" and start["recipe"] == "noop" and start["fp8_layers"] == len(marked) == 13
    # it converts nothing: the loss is a bf16 run's, step for step, to the bit
    _, bf16 = make_plan(tmp_path / "bf16", **{**SPEC, "precision.mode": "bf16", "precision.backend": "torchao",
                                               "train.output_dir": str(tmp_path / "bf16" / "out")})
    train_in_process(f"{bf16}/plan.json")
    twin = [json.loads(x) for x in (tmp_path / "bf16" / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [s["loss"] for s in steps] == [s["loss"] for s in twin if s["event"] == "step"] and len(steps) == 3


def test_a_registered_name_is_refused_twice_and_a_built_in_one_stays(toy):
    with pytest.raises(ValueError, match="already registered"):
        register(TOY)
    with pytest.raises(ValueError, match="built-in"):
        unregister("torchao")
    assert list(BACKENDS)[-1] == "toy"
