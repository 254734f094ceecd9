"""`fp8launch bench` end to end on CPU: real runs of a spec and its bf16 twin, alternating, compared."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

import launcher
from launcher.commands.bench import table
from tests.e2e.helpers import one_process_fp8_spec

pytestmark = pytest.mark.slow


def test_bench_runs_both_variants_alternately_and_reports_ratios(tmp_path):
    spec = tmp_path / "bench.toml"
    spec.write_text(one_process_fp8_spec("bench-cpu", tmp_path, 5, eval_steps=2))
    exe = os.path.join(os.path.dirname(sys.executable), "fp8launch")
    r = subprocess.run([exe, "bench", str(spec), "--repeats", "2", "--warmup", "1", "--out", str(tmp_path / "b"), "--max-loss-gap", "0.25"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    order = [line.split(":")[1].strip() for line in r.stderr.splitlines() if line.startswith("bench: ")]
    assert order == ["spec run 1/2", "bf16 run 1/2", "spec run 2/2", "bf16 run 2/2"]
    progress = [line.strip() for line in r.stderr.splitlines() if line.startswith("  ") and " step " in line]
    for label in ("spec run 1", "bf16 run 1", "spec run 2", "bf16 run 2"):  # each run shows its last step at least
        assert any(line.startswith(f"{label}: step 5/5, ") and line.endswith(", 0 s left") for line in progress), (label, progress)

    record = json.loads((tmp_path / "b" / "bench.json").read_text())
    spec_side, base = record["spec"], record["baseline"]
    assert spec_side["fp8_layers"] > 0 and base["fp8_layers"] == 0
    assert "fp8 torchao tensorwise" in spec_side["precision"] and "bf16" in base["precision"]
    for side in (spec_side, base):
        assert len(side["runs"]) == 2
        for run in side["runs"]:
            assert [s for s, _ in run["losses"]] == [1, 2, 3, 4, 5]
            assert run["start"]["world_size"] == 1
    # a variant's figure is the median over its runs of each run's steady-state median
    for key in ("tokens_per_s", "step_time_s", "final_loss"):
        per_run = sorted(run["figures"][key] for run in spec_side["runs"])
        assert spec_side["figures"][key] == pytest.approx(sum(per_run) / 2)
        assert record["ratios"][key] == pytest.approx(spec_side["figures"][key] / base["figures"][key])
    # [eval]: one held-out evaluation after the last step of every run; the gate compares the medians of those
    for side in (spec_side, base):
        assert all([s for s, _ in run["evals"]] == [5] for run in side["runs"])
        assert side["figures"]["eval_loss"] == pytest.approx(sum(run["evals"][0][1] for run in side["runs"]) / 2)
    gate = record["loss_gate"]
    gap = spec_side["figures"]["eval_loss"] / base["figures"]["eval_loss"] - 1
    assert gate["basis"] == "eval_loss" and gate["gated"] and gate["gap"] == pytest.approx(gap) and gate["passed"] == (gap <= 0.25)
    assert f"loss gap {gap:+.2%} on the held-out eval loss: within the 25.0% gate" in r.stdout
    # same model, data and seed: the first losses agree closely; FP8 only perturbs the numerics
    first_fp8, first_bf16 = spec_side["runs"][0]["losses"][0][1], base["runs"][0]["losses"][0][1]
    assert abs(first_fp8 - first_bf16) / first_bf16 < 0.02
    assert record["ratios"]["mfu"] is None  # CPU: no known peak, no MFU
    assert record["environment"]["mfu_peak"] == "bf16 dense" and "bf16 dense" in record["mfu_peak"]
    assert "MFU vs bf16 dense" in r.stdout
    import torch
    import torchao

    assert record["environment"] == {"device_name": "cpu", "world_size": 1, "torch": torch.__version__, "torchao": torchao.__version__,
                                     "deepspeed": record["environment"]["deepspeed"], "transformer_engine": None,
                                     "fp8launch": launcher.__version__,
                                     "mfu_peak": "bf16 dense", "peak_tflops": None}  # a CPU has no known peak

    printed = r.stdout
    assert "step 1/5 |" not in printed + r.stderr  # each run's own output goes to its train.log (progress lines say "step 1/5,")
    assert "precision: fp8 torchao tensorwise" in (tmp_path / "b" / "spec-1" / "train.log").read_text()
    assert "precision: bf16" in (tmp_path / "b" / "bf16-2" / "train.log").read_text()
    assert table(record).splitlines()[0] in printed and "tokens/s" in printed and "ratio" in printed
    png = tmp_path / "b" / "bench.png"
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (1210, 440)


def test_bench_profile_says_where_each_step_goes_and_what_holds_fp8_back(tmp_path):
    """`bench --profile`: each variant's first run profiles its measured steps; profile.json holds both runs' parts
    (adding up to the measured step), the FP8 FLOP share (0 for bf16), the ceiling and the advice; profile.png draws them."""
    spec = tmp_path / "bench.toml"
    spec.write_text(one_process_fp8_spec("bench-cpu", tmp_path, 5))
    exe = os.path.join(os.path.dirname(sys.executable), "fp8launch")
    r = subprocess.run([exe, "bench", str(spec), "--repeats", "1", "--warmup", "2", "--profile", "--out", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    profile = json.loads((tmp_path / "b" / "profile.json").read_text())
    bench = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert bench["profile"] == profile
    spec_run, base = profile["spec"], profile["baseline"]
    for run, side in ((spec_run, "spec"), (base, "baseline")):
        assert run["steps"] == 3  # the measured steps 3..5, after --warmup 2
        measured = bench[side]["runs"][0]["step_times"][2:]  # the loop's own timing of steps 3..5
        assert run["step_time_s"] == pytest.approx(sum(measured) / 3)
        assert abs(sum(run["parts"].values()) / run["step_time_s"] - 1) < 0.25
    assert base["parts"]["gemm_fp8"] == 0 and base["fp8_gemm_flop_share"] == 0 and base["ceiling"] == 1.0
    assert spec_run["parts"]["gemm_fp8"] > 0
    assert spec_run["fp8_gemm_flop_share"] == pytest.approx(bench["spec"]["runs"][0]["start"]["fp8_flop_share"], abs=0.01)
    assert spec_run["ceiling"] > 1 and "cpu has no FP8 peak" in profile["ceiling_basis"]
    assert profile["prediction"]["gpu"] == "h100" and not profile["prediction"]["compared"]
    assert "FP8 GEMM FLOP share" in r.stdout and "ceiling (Amdahl)" in r.stdout and "holds it back: " in r.stdout
    assert (tmp_path / "b" / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "b" / "spec-1" / "profile" / "trace.json.gz").is_file() and not (tmp_path / "b" / "spec-2").exists()


def test_bench_profile_goes_on_past_a_profiler_that_fails_and_records_why(tmp_path):
    """A profiler failure is the profile's, not the bench's: with FP8LAUNCH_PROFILE_FAULT=write each run's profiler
    raises where it would read its trace back (as StepProfiler._write did on the first CUDA trace). Both runs still
    train every step, the baseline runs after the failed spec run, bench.json is written with the timing figures,
    and it says why there is no profile."""
    spec = tmp_path / "bench.toml"
    spec.write_text(one_process_fp8_spec("bench-cpu", tmp_path, 4).replace('mode = "fp8"', 'mode = "bf16"')
                    .replace("layers=2", "layers=1").replace("seq_len = 64", "seq_len = 16"))
    exe = os.path.join(os.path.dirname(sys.executable), "fp8launch")
    r = subprocess.run([exe, "bench", str(spec), "--vs", "fp32", "--repeats", "1", "--warmup", "2", "--profile", "--no-plot",
                        "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={**os.environ, "FP8LAUNCH_PROFILE_FAULT": "write"})
    assert r.returncode == 0, r.stderr[-3000:]
    record = json.loads((tmp_path / "b" / "bench.json").read_text())
    for side in ("spec", "baseline"):
        run = record[side]["runs"][0]
        assert [s for s, _ in run["losses"]] == [1, 2, 3, 4] and run["exit_code"] == 0
        assert run["profile_error"] == "RuntimeError: injected by FP8LAUNCH_PROFILE_FAULT=write"
        assert record[side]["figures"]["tokens_per_s"] > 0
    assert record["profile"] is None and record["ratios"]["tokens_per_s"] > 0
    why = "RuntimeError: injected by FP8LAUNCH_PROFILE_FAULT=write"
    assert record["profile_error"] == "bench --profile: " + "; ".join(
        f"{tmp_path / 'b' / run} has no profile.json ({why})" for run in ("spec-1", "fp32-1"))
    assert "bench: no profile: bench --profile: " in r.stderr and f"profile: failed ({record['profile_error']})" in r.stdout
    assert not (tmp_path / "b" / "profile.json").exists()
