"""The GPU support matrix (docs/support-matrix.md, launcher/support_matrix.GPU_OPTIONS): every row through
`fp8launch run --profile 1` on CUDA, 3 steps (the third profiled); its start record's effects and layers must follow
the spec, and its FP8 must have run by its ops: the profiled step's torch._scaled_mm calls (torchao's tensorwise and
rowwise recipes, none in bf16: one_gpu.expected_scaled_mm), else FP8 kernels in the trace (Transformer Engine, MS-AMP,
torchao's block recipes). A row whose
backend is not installed, or that needs more GPUs or a newer GPU than this machine has, is skipped with
the reason (TE's mxfp8/nvfp4 recipes need compute capability >= 10.0: rule TE-RECIPE-HARDWARE must then
refuse it, exit 3, which is checked instead). Refused pairs are checked on CPU (tests/test_support_matrix.py).

Record the outcomes for the docs: FP8LAUNCH_MATRIX_RESULTS=benchmarks/results/support_matrix_gpu.json
pytest -m gpu tests/gpu/test_support_matrix_gpu.py, then `make support-matrix`.
"""

from __future__ import annotations

import datetime
import fcntl
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launcher.planning.backends import BACKENDS, TORCHAO
from launcher.planning.hardware import capability_text, requirement, supports
from launcher.planning.rules import Facts, check
from launcher.train.precision.torchao_fp8 import mx_torch_supported
from tests.gpu.one_gpu import expected_scaled_mm, fp8_kernels, scaled_mm_per_step
from tests.support import plan_from
from tools.support_matrix import GPU_BASE, _default, config_key, load, spec_of

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA GPU")]
MATRIX = load("gpu")  # docs/support-matrix.json (tests/test_support_matrix.py holds it to the generator)
FP8LAUNCH = str(Path(sys.executable).parent / "fp8launch")
PACKAGE = {b.name: b.package for b in BACKENDS.values()}
STEPS = 3
"""GPU_BASE's 2 steps and one more: `--profile 1` records the third, after the compile and the profiler's warm-up."""


def _get(config, key):
    return config.get(key, _default(key))


def _record(config: dict, outcome: str) -> None:
    """Add this row's outcome to FP8LAUNCH_MATRIX_RESULTS, keyed by its config (row names move)."""
    path = os.environ.get("FP8LAUNCH_MATRIX_RESULTS")
    if not path:
        return
    with open(path + ".lock", "w") as lock:  # pytest-xdist workers record into one file
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(Path(path).read_text()) if Path(path).exists() else {"runs": []}
        data.update(device=torch.cuda.get_device_name(0), torch=torch.__version__, date=datetime.date.today().isoformat())
        data["runs"] = [r for r in data["runs"] if config_key(r["config"]) != config_key(config)] + [{"config": config, "outcome": outcome}]
        data["runs"].sort(key=lambda r: config_key(r["config"]))
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@pytest.mark.parametrize("matrix_run", MATRIX.trained, ids=[r.name for r in MATRIX.trained])
def test_gpu_row_trains_and_its_effects_follow_the_spec(matrix_run, tmp_path):
    c = matrix_run.config
    plan = plan_from(spec_of(c, matrix_run.name, GPU_BASE))  # backend = "msamp" under DDP / FSDP2: its levels on torchao
    backend = plan.precision.backend if plan.precision.fp8 else None
    if backend and importlib.util.find_spec(PACKAGE[backend]) is None:
        pytest.skip(f"{PACKAGE[backend]} is not installed")
    if _get(c, "distributed.strategy") == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    procs = max(1, _get(c, "distributed.tensor_parallel"))
    if torch.cuda.device_count() < procs:
        pytest.skip(f"needs {procs} GPUs")
    spec = tmp_path / f"{matrix_run.name}.json"
    spec.write_text(json.dumps(spec_of(c, matrix_run.name, {**GPU_BASE, "train.steps": STEPS})))
    r = subprocess.run([FP8LAUNCH, "run", str(spec), "--profile", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    b = BACKENDS.get(backend or "")
    recipe = b.recipe(plan.precision) if b is not None and b.has_recipes else None
    if recipe is not None and not supports(torch.cuda.get_device_capability(), "fp8", b.name, recipe):
        facts = Facts(plan=plan, device="cuda", capability=torch.cuda.get_device_capability())
        rule = next(f.rule.id for f in check(facts, "run") if f.is_error)  # FP8-HARDWARE, TE-RECIPE-HARDWARE, ...
        assert r.returncode == 3 and f"error[{rule}]" in r.stderr, r.stderr[-3000:]
        gpu = capability_text(torch.cuda.get_device_capability())
        _record(matrix_run.config, f"refused: {rule} (GPU {gpu}; needs {requirement('fp8', b.name, recipe)})")
        return
    if b is TORCHAO and recipe == "mxfp8" and "error[TORCHAO-MX-TORCH]" in r.stderr:
        assert r.returncode == 3 and not mx_torch_supported(), r.stderr[-3000:]
        _record(matrix_run.config, f"refused: TORCHAO-MX-TORCH (torch {torch.__version__})")
        return
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    out = tmp_path / "runs" / matrix_run.name
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    start, steps = lines[0], [x for x in lines if x["event"] == "step"]
    assert len(steps) == STEPS and all(math.isfinite(x["loss"]) for x in steps)
    assert lines[-1]["event"] == "end" and lines[-1].get("profile_error") is None, lines[-1]
    e = start["effects"]
    assert e["compiled_blocks"] == (2 if _get(c, "compile.enabled") else 0)
    assert e["checkpointed_blocks"] == (2 if _get(c, "activation_checkpointing.mode") == "full" else 0)
    assert e["tensor_parallel"] == _get(c, "distributed.tensor_parallel")
    assert e["async_tp"] == bool(_get(c, "distributed.tensor_parallel") > 1 and _get(c, "distributed.async_tp"))
    assert e["msamp_level"] == (f"{plan.msamp_native} natively" if plan.msamp_native else None)
    fp8 = [v for v in start["layers"].values() if v.startswith("fp8")]
    assert len(fp8) == start["fp8_layers"] and (start["fp8_layers"] > 0) == (backend is not None)
    expected = expected_scaled_mm(plan, start["fp8_layers"])
    if expected is not None:
        assert expected[0] <= scaled_mm_per_step(out) <= expected[1], expected
    else:  # FP8 GEMMs that are not torch._scaled_mm calls: their kernels
        assert scaled_mm_per_step(out) > 0 or fp8_kernels(out) > 0
    _record(matrix_run.config, "trained")
