"""torchao's block-scaled recipes on a Blackwell GPU (compute capability >= 10.0): MXFP8 and NVFP4 each train
20 steps of the 2-layer Llama-3-8B shape through `fp8launch run` beside their bf16 twin, their layers named in
the start record, their loss within 5% of bf16's. Below 10.0 the run is refused (TORCHAO-BLOCK-HARDWARE, exit 3),
which is checked instead. Skips without a CUDA GPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support import write_toml_spec

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]
FP8LAUNCH = str(Path(sys.executable).parent / "fp8launch")
STEPS = 20
BASE = {"version": 1, "launch.device": "cuda", "distributed.strategy": "fsdp2", "distributed.procs_per_node": 1,
        "compile.enabled": True, "train.model": "builtin:llama3-8b?layers=2", "train.seq_len": 4096,
        "train.micro_batch_size": 1, "train.steps": STEPS, "train.lr": 3e-4, "train.warmup_steps": 4, "train.log_every": 1}


def _run(tmp_path: Path, name: str, **keys) -> tuple[subprocess.CompletedProcess, list[dict]]:
    spec = write_toml_spec(tmp_path / f"{name}.toml", {**BASE, "name": name, "train.output_dir": f"runs/{name}", **keys})
    r = subprocess.run([FP8LAUNCH, "run", str(spec)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    path = tmp_path / "runs" / name / "metrics.jsonl"
    return r, [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_block_recipe_trains_beside_bf16_or_is_refused_below_sm100(recipe, tmp_path):
    r, records = _run(tmp_path, recipe, **{"precision.mode": "fp8", "precision.backend": "torchao", "precision.torchao.recipe": recipe})
    if torch.cuda.get_device_capability() < (10, 0):
        assert r.returncode == 3 and "error[TORCHAO-BLOCK-HARDWARE]" in r.stderr, r.stderr[-3000:]
        return
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    start = records[0]
    assert start["recipe"] == recipe and start["fp8_layers"] > 0
    assert sum(v == f"fp8 {recipe}" for v in start["layers"].values()) == start["fp8_layers"]
    base, base_records = _run(tmp_path, f"{recipe}-bf16", **{"precision.mode": "bf16"})
    assert base.returncode == 0, base.stderr[-4000:]
    losses = [[x["loss"] for x in recs if x["event"] == "step"] for recs in (records, base_records)]
    assert all(len(ls) == STEPS and all(math.isfinite(v) for v in ls) for ls in losses)
    tail = [sum(ls[-3:]) / 3 for ls in losses]
    assert abs(tail[0] - tail[1]) / tail[1] < 0.05, losses
