"""[[precision.schedule]] in planning: which precision trains which step, and what `plan` shows of it."""

from __future__ import annotations

import json

from launcher.planning.schedule import phases, plan_at
from tests.support import plan_from


def _plan(schedule, steps=100, **precision):
    return plan_from({"precision": {"mode": "fp8", "backend": "torchao", **precision, "schedule": schedule},
                      "train": {"model": "builtin:llama3-8b", "seq_len": 8192, "steps": steps}})


def test_phases_start_at_their_step_in_order_and_each_changes_the_one_before():
    plan = _plan([{"at_fraction": 0.9, "mode": "bf16"}, {"at_step": 50, "keep_last_blocks": 2}])
    got = [(p.index, p.first_step, p.plan.precision.mode, p.plan.precision.keep_last_blocks) for p in phases(plan)]
    assert got == [(0, 1, "fp8", 0), (1, 50, "fp8", 2), (2, 91, "bf16", 2)]  # at_fraction 0.9 of 100: from step 91
    assert [plan_at(plan, s).index for s in (1, 49, 50, 90, 91, 100)] == [0, 0, 1, 1, 2, 2]


def test_plan_shows_each_phase_with_its_steps_memory_and_predicted_speed(cli, spec):
    path = spec('version = 1\nname = "s"\n[precision]\nmode = "fp8"\nschedule = [{ at_fraction = 0.9, mode = "bf16" }]\n'
                '[compile]\nenabled = true\n[train]\nmodel = "builtin:llama3-8b"\nseq_len = 8192\nsteps = 1000\n')
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 0, r.stderr
    text = r.stdout.splitlines()
    i = text.index("  precision phases:")
    assert text[i + 1].startswith("    0: steps 1-900: fp8 torchao tensorwise, peak ") and text[i + 1].endswith("x bf16's tokens/s")
    assert text[i + 2].startswith("    1: steps 901-1000: bf16, peak ") and text[i + 2].endswith("predicted 1.00x bf16's tokens/s")
    record = json.loads(cli("plan", path, "--out", "out", "--format", "json").stdout)
    first, second = record["phases"]
    assert (first["first_step"], first["last_step"], second["first_step"], second["last_step"]) == (1, 900, 901, 1000)
    assert round(first["fp8_vs_bf16"], 4) == record["prediction"]["fp8_vs_bf16"] and second["fp8_vs_bf16"] == 1.0
    assert first["peak_bytes_per_gpu"] == record["memory"]["peak_bytes_per_gpu"]
