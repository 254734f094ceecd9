"""The user-factory example trains through `fp8launch run` with FP8 applied to its own Linears."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def test_custom_model_example_trains_in_fp8(tmp_path):
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    exe = os.path.join(os.path.dirname(sys.executable), "fp8launch")
    r = subprocess.run([exe, "run", "examples/custom-model.toml", "--set", f"train.output_dir={tmp_path}/run"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    start = next(x for x in records if x["event"] == "start")
    # 2 blocks x (attention out_proj + 2 MLP Linears) + head = 7 Linears. out_proj's weight is used
    # functionally by nn.MultiheadAttention, so it cannot run in FP8; first and last real ones are kept.
    assert (start["fp8_layers"], start["total_linear"], start["world_size"]) == (3, 7, 2)
    assert "layers.0.attn.out_proj (weight used functionally" in start["precision"]
    assert "layers.0.mlp.0 (keep_first_last)" in start["precision"] and "head (keep_first_last)" in start["precision"]
    steps = [x for x in records if x["event"] == "step"]
    assert [x["step"] for x in steps] == [2, 4, 6, 8]
    assert steps[-1]["loss"] < steps[0]["loss"]
