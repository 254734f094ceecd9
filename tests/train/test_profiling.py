"""`run --profile`: the training profiles its steps after the warm-up and classifies its own CPU trace
(launcher/train/profiling.py, launcher/profiling). A real run in this process (build_run, the Trainer, torchao
FP8 on CPU) of the 2-layer debug Llama, in FP8 (tensorwise, eager) and in bf16."""

from __future__ import annotations

import io
import json

import pytest

from launcher.profiling import PROFILE_ENV, PROFILE_WARMUP_ENV
from launcher.profiling.trace import read_trace

from ._engine_setup import make_plan, train_in_process

BASE = {"train.model": "builtin:llama-debug?layers=2", "train.steps": 5, "train.seq_len": 32, "train.micro_batch_size": 2,
        "train.checkpoint_at_end": False, "train.log_every": 1}
FP8 = {"precision.mode": "fp8", "precision.backend": "torchao", "precision.torchao.skip_small": False}


def _profiled(tmp_path, monkeypatch, name, **keys):
    monkeypatch.setenv(PROFILE_ENV, "2")
    monkeypatch.setenv(PROFILE_WARMUP_ENV, "2")
    out = tmp_path / name
    _, plan_dir = make_plan(tmp_path / f"plan-{name}", **{**BASE, "train.output_dir": str(out), **keys})
    train_in_process(f"{plan_dir}/plan.json", stream=io.StringIO())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if r.get("event") == "step"}
    return json.loads((out / "profile.json").read_text())["run"], records[0], steps, out


@pytest.mark.slow  # in-process, but 5-18 s: the slow tier keeps `make test-fast` under 2 minutes
def test_an_fp8_run_profiles_its_steps_after_the_warm_up_into_parts_that_add_up(tmp_path, monkeypatch):
    run, start, steps, out = _profiled(tmp_path, monkeypatch, "fp8", **FP8)
    trace = read_trace(str(out / run["trace"]))
    assert len(trace.steps) == 2 == run["steps"]  # steps 3 and 4: after 2 warm-up steps (the second is the profiler's own)
    measured = (steps[3]["step_time_s"] + steps[4]["step_time_s"]) / 2
    assert run["step_time_s"] == pytest.approx(measured)
    assert sum(run["parts"].values()) == pytest.approx(run["window_s"], rel=1e-6)  # every host event's self time, once
    assert abs(sum(run["parts"].values()) / measured - 1) < 0.25  # the parts add up to the step the loop measured
    parts = run["parts"]
    assert parts["gemm_fp8"] > 0 and parts["fp8_cast"] > 0 and parts["optimizer"] > 0 and parts["loss"] > 0 and parts["attention"] > 0
    # the FP8 share of GEMM FLOPs measured from the trace's shapes is the start line's share of Linear FLOPs
    assert run["fp8_gemm_flop_share"] == pytest.approx(start["fp8_flop_share"], abs=0.01)
    # every GEMM is named after its layer: the kept ones in high precision, the rest in FP8
    kept = {k for k, v in start["layers"].items() if not v.startswith("fp8")}
    assert kept == {"layers.0.attention.wq", "output"}
    # (a K -> N layer's forward is an N -> K layer's input gradient: w1, w2 and w3 are one shape)
    assert set(run["gemm_by_module"]) == {"output (high precision)", "layers.0.attention.wq (high precision)",
                                          "layers.*.feed_forward.w1 / layers.*.feed_forward.w2 / layers.*.feed_forward.w3 (fp8)",
                                          "layers.*.attention.wk / layers.*.attention.wv (fp8)",
                                          "layers.*.attention.wo / layers.1.attention.wq (fp8)"}
    assert run["top"][0]["s"] >= run["top"][-1]["s"] and (out / "profile.png").is_file()


def test_a_bf16_run_has_no_fp8_gemm_time_and_a_zero_share(tmp_path, monkeypatch):
    run, start, _, _ = _profiled(tmp_path, monkeypatch, "bf16", **{"precision.mode": "bf16"})
    assert run["parts"]["gemm_fp8"] == 0 and run["parts"]["fp8_cast"] == 0 and run["fp8_gemm_flop_share"] == 0
    assert run["parts"]["gemm_high_precision"] > 0
    assert all(k.endswith("(high precision)") for k in run["gemm_by_module"])


def _run_records(tmp_path, monkeypatch, name, prepare=None):
    """A profiled bf16 run (steps 3 and 4 profiled, as above) whose output folder `prepare` may set up first; returns
    its metrics records and folder."""
    monkeypatch.setenv(PROFILE_ENV, "2")
    monkeypatch.setenv(PROFILE_WARMUP_ENV, "2")
    out = tmp_path / name
    if prepare is not None:
        prepare(out)
    _, plan_dir = make_plan(tmp_path / f"plan-{name}", **{**BASE, "train.output_dir": str(out), "precision.mode": "bf16"})
    train_in_process(f"{plan_dir}/plan.json", stream=io.StringIO())
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], out


def test_a_profiler_that_fails_exporting_its_trace_is_recorded_and_the_training_goes_on(tmp_path, monkeypatch, capfd):
    """A real failure: a folder where the trace goes, so torch's export_chrome_trace (inside the profiler's last step()
    call) cannot write it. The run still trains all 5 steps, writes its end record with profile_error, and no profile."""
    from launcher.commands.profile import run_failure, summary_lines

    records, out = _run_records(tmp_path, monkeypatch, "blocked", lambda out: (out / "profile" / "trace.json.gz").mkdir(parents=True))
    steps = [r["step"] for r in records if r.get("event") == "step"]
    end = records[-1]
    assert steps == [1, 2, 3, 4, 5] and end["event"] == "end" and end["final_step"] == 5
    assert end["profile_error"].startswith("IsADirectoryError: ") and "trace.json.gz" in end["profile_error"]
    assert not (out / "profile.json").exists()
    assert "profile: failed after step 4: IsADirectoryError" in capfd.readouterr().err  # the step whose step() exported
    assert run_failure(str(out)) == end["profile_error"]
    assert summary_lines(str(out))[0].startswith(f"profile: failed ({end['profile_error']}); the training went on")


def test_a_profiler_that_fails_reading_its_trace_back_is_recorded_and_the_training_goes_on(tmp_path, monkeypatch):
    """The issue's case: the trace is written, then reading it back (StepProfiler._write -> read_trace) raises, as on
    the first real CUDA trace. The failure is the reader's own exception, recorded; the training is unaffected."""
    import launcher.profiling.trace as trace_module

    def unreadable(path):
        raise KeyError(f"traceEvents ({path})")

    monkeypatch.setattr(trace_module, "read_trace", unreadable)
    records, out = _run_records(tmp_path, monkeypatch, "unreadable")
    end = records[-1]
    assert [r["step"] for r in records if r.get("event") == "step"] == [1, 2, 3, 4, 5]
    assert end["profile_error"].startswith("KeyError: ") and "traceEvents" in end["profile_error"]
    assert (out / "profile" / "trace.json.gz").is_file() and not (out / "profile.json").exists()
    monkeypatch.undo()
    records, out = _run_records(tmp_path, monkeypatch, "fine")  # the control: the same run profiles when nothing fails
    assert "profile_error" not in records[-1] and (out / "profile.json").is_file()
