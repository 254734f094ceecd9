"""A new user's first command pair on this CPU machine: `fp8launch init` then `fp8launch run` of what it wrote, for
each engine init offers here (FP8 with torchao on 2 processes over gloo). Before, the default starter spec stopped
with FP8-NOT-APPLIED: torchao's size rule kept every Linear of the debug model in bf16.

Each spec runs as written but for train.steps (12 for the default, 3 for DDP and DeepSpeed): ~1.5 min on 2 cores."""

from __future__ import annotations

import pytest

from .helpers import output_of, records, run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy,steps", [("fsdp2", 12), ("ddp", 3), ("deepspeed", 3)])
def test_init_then_run_trains_fp8_as_written(tmp_path, strategy, steps):
    r, _ = run(tmp_path, "init", "--strategy", strategy, "--out", f"{strategy}.toml")
    assert r.returncode == 0, output_of(r)
    assert "warning" not in r.stderr  # no advice a CPU smoke spec cannot act on (`plan --strict` passes)
    extra = ["--set", f"train.steps={steps}", "--set", "train.log_every=1"]  # the spec as written, fewer steps
    r, seconds = run(tmp_path, "run", f"{strategy}.toml", *extra)
    assert r.returncode == 0, output_of(r)
    out = records(tmp_path / "runs" / strategy)
    assert out.start["strategy"] == strategy and out.start["world_size"] == 2
    assert (out.start["fp8_layers"], out.start["total_linear"]) == (27, 29)  # every Linear but the first and the output layer
    assert [s["step"] for s in out.steps] == list(range(1, steps + 1))
    if steps >= 10:
        assert out.tail_loss() < 0.8 * out.losses[0]  # it learns
    print(f"init -> run ({strategy}): {seconds:.1f} s")
