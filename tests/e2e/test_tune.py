"""`fp8launch tune` end to end on CPU: four torchao recipes (mxfp8 emulated) and the bf16 twin, real runs, alternating,
ranked; tune.json, tune.png and a tuned spec that plans. Ctrl-C keeps what was measured."""

from __future__ import annotations

import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import time

import pytest

from tests.e2e.helpers import one_process_fp8_spec

pytestmark = pytest.mark.slow

CANDIDATES = ["torchao-tensorwise", "torchao-rowwise", "torchao-rowwise_with_gw_hp", "torchao-mxfp8"]
EXE = os.path.join(os.path.dirname(sys.executable), "fp8launch")
GAP = 0.0002
"""A loss-gap threshold tight enough that some FP8 candidates may be rejected: the test checks the rule, whichever way it falls."""


def steady_median(run_dir, warmup: int) -> float:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        steps = [r for r in map(json.loads, f) if r.get("event") == "step"]
    return statistics.median(r["tokens_per_s"] for r in steps[warmup:])


def test_tune_measures_every_candidate_ranks_them_and_writes_a_winner_that_plans(tmp_path):
    spec = tmp_path / "tune.toml"
    spec.write_text(one_process_fp8_spec("tune-cpu", tmp_path, 10))
    out = tmp_path / "t"
    out.mkdir()
    (out / "keep.txt").write_text("not tune's")
    r = subprocess.run([EXE, "tune", str(spec), "--steps", "4", "--repeats", "2", "--warmup", "1", "--out", str(out),
                        "--max-loss-gap", str(GAP)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    order = [line.split(":")[1].strip().split(" run ")[0] for line in r.stderr.splitlines() if line.startswith("tune: ")]
    assert order == (["bf16"] + CANDIDATES) * 2  # alternating rounds, baseline first
    assert (out / "keep.txt").read_text() == "not tune's"

    record = json.loads((out / "tune.json").read_text())
    rows = {c["name"]: c for c in record["candidates"]}
    assert list(rows) == ["bf16"] + CANDIDATES and isinstance(record["candidates"], list)
    for name, c in rows.items():
        assert len(c["runs"]) == 2 and all(run["exit_code"] == 0 for run in c["runs"])
        per_run = [steady_median(out / run["dir"], 1) for run in c["runs"]]
        assert [run["figures"]["tokens_per_s"] for run in c["runs"]] == pytest.approx(per_run)
        assert c["tokens_per_s"] == pytest.approx(statistics.median(per_run))  # the candidate's figure: median of its runs
        assert c["vs_bf16"] == pytest.approx(c["tokens_per_s"] / rows["bf16"]["tokens_per_s"])
        assert (c["fp8_layers"] > 0) == (name != "bf16")
        assert c["peak_mem_gib"] > 0
    base = dict(map(tuple, rows["bf16"]["losses"]))
    for name in CANDIDATES:
        c = rows[name]
        mine = dict(map(tuple, c["losses"]))
        assert sorted(mine) == [1, 2, 3, 4]
        gap = statistics.fmean((mine[s] - base[s]) / base[s] for s in base)
        assert c["loss_gap"] == pytest.approx(gap)
        assert (c["status"] == "rejected") == (gap > GAP)
    eligible = [c for c in record["candidates"] if c["status"] != "rejected"]
    winner = max(eligible, key=lambda c: c["tokens_per_s"])
    assert record["winner"] == winner["name"] and winner["rank"] == 1
    assert record["ranking"] == [c["name"] for c in sorted(eligible, key=lambda c: -c["tokens_per_s"])]

    with open(out / "runs" / "torchao-rowwise-1" / "metrics.jsonl", encoding="utf-8") as f:
        start = json.loads(f.readline())
    assert start["event"] == "start" and start["mfu_peak"] == "bf16 dense"

    png = (out / "tune.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24])[0] > 800

    tuned = out / "tune-cpu-tuned.toml"
    text = tuned.read_text()
    assert text.startswith(f"# Chosen by `fp8launch tune tune.toml` on cpu x 1: {winner['name']}")
    for name in rows:
        if name != winner["name"]:
            assert f"#   {name}: " in text
    p = subprocess.run([EXE, "plan", str(tuned), "--out", str(tmp_path / "gen"), "--format", "json"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)["plan"]
    assert plan["name"] == "tune-cpu-tuned"
    if winner["name"] == "bf16":
        assert plan["precision"]["mode"] == "bf16"
    else:
        assert plan["precision"]["mode"] == "fp8" and plan["precision"]["torchao"]["recipe"] == winner["name"].split("-", 1)[1]

    again = subprocess.run([EXE, "tune", str(spec), "--out", str(out), "--candidates", "torchao-nope"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 2 and "torchao-nope is not a candidate here" in again.stderr


def test_ctrl_c_stops_after_the_current_run_and_keeps_what_was_measured(tmp_path):
    spec = tmp_path / "tune.toml"
    spec.write_text(one_process_fp8_spec("tune-cpu", tmp_path, 10))
    out = tmp_path / "t"
    child = subprocess.Popen([EXE, "tune", str(spec), "--steps", "3", "--repeats", "1", "--warmup", "1", "--out", str(out),
                              "--candidates", "torchao-tensorwise,torchao-rowwise"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True)
    second = out / "runs" / "torchao-tensorwise-1" / "train.log"  # the bf16 run is done and recorded
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not second.exists():
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(child.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 130, stderr[-2000:]
    record = json.loads((out / "tune.json").read_text())
    rows = {c["name"]: c for c in record["candidates"]}
    assert record["interrupted"] is True and record["winner"] is None
    assert rows["bf16"]["status"] == "baseline" and rows["bf16"]["tokens_per_s"] > 0
    assert rows["torchao-rowwise"]["status"] == "interrupted" and rows["torchao-rowwise"]["runs"] == []
    assert not (out / "tune-cpu-tuned.toml").exists()
    assert "bf16" in stdout and "winner: none" in stdout


def test_a_failed_bf16_baseline_stops_tune_with_the_runs_own_exit_code(tmp_path):
    """Without a baseline there is nothing to rank against: tune stops at once, with the code the run exited
    with (4, diverged, here: a learning rate that overflows the weights at the first update), not its own 2."""
    spec = tmp_path / "tune.toml"
    spec.write_text(one_process_fp8_spec("tune-cpu", tmp_path, 10).replace("lr = 3e-3", "lr = 1e30"))
    r = subprocess.run([EXE, "tune", str(spec), "--steps", "3", "--repeats", "1", "--warmup", "0", "--out", str(tmp_path / "t"),
                        "--candidates", "torchao-tensorwise"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 4, r.stderr[-3000:]
    assert "tune: the bf16 baseline run exited with code 4" in r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("tune: ") and " run " in line] == [
        f"tune: bf16 run 1/1 -> {tmp_path / 't' / 'runs' / 'bf16-1'}/train.log"]  # no FP8 candidate ran after it
