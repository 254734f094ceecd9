"""`fp8launch tune`'s pure parts: the candidates, --candidates, the loss gap, the tuned spec's TOML,
and what it refuses to overwrite (tests/e2e/test_tune.py runs it for real)."""

from __future__ import annotations

import json
import tomllib

import pytest

from launcher.commands.plan import plan_one
from launcher.commands.tune import _claim
from launcher.commands.tune.candidates import candidate_overrides, select
from launcher.commands.tune.record import loss_gap, tuned_spec
from launcher.errors import LauncherError, UsageError
from launcher.targets.toml_text import toml_text


def plan_of(tmp_path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return plan_one(str(path), str(tmp_path / "out")).plan


def test_candidates_are_what_runs_here_with_all_gather_on_fsdp2_and_compile_toggled(tmp_path):
    fsdp2 = plan_of(tmp_path, 'version = 1\nname = "c"\n[precision]\nmode = "fp8"\n[precision.torchao]\nskip_small = false\n')
    # this machine: torchao only, and no NVFP4 (TORCHAO-NVFP4-CPU)
    only_torchao = lambda sets: 'precision.backend="torchao"' in sets and 'precision.torchao.recipe="nvfp4"' not in sets  # noqa: E731
    labels = [label for label, _ in candidate_overrides(fsdp2, only_torchao)]
    assert labels == ["torchao-tensorwise", "torchao-tensorwise-fp8-allgather", "torchao-rowwise", "torchao-rowwise_with_gw_hp",
                      "torchao-mxfp8"]
    ddp = plan_of(tmp_path, 'version = 1\nname = "c"\n[distributed]\nstrategy = "ddp"\n')
    both = candidate_overrides(ddp, only_torchao, toggle_compile=True)
    assert [label for label, _ in both] == ["torchao-tensorwise", "torchao-rowwise", "torchao-rowwise_with_gw_hp", "torchao-mxfp8",
                                            "torchao-tensorwise+compile", "torchao-rowwise+compile", "torchao-rowwise_with_gw_hp+compile",
                                            "torchao-mxfp8+compile"]
    assert dict(both)["torchao-rowwise+compile"][-1] == "compile.enabled=true"
    everything = [label for label, _ in candidate_overrides(ddp, lambda sets: True)]
    # MS-AMP's levels without its stack plan as torchao plus native levels: no backend of their own to time
    assert "te-mxfp8" in everything and not any(label.startswith("msamp-") for label in everything)


def test_msamp_levels_are_candidates_where_msamps_own_stack_runs(tmp_path, msamp_stack):
    ddp = plan_of(tmp_path, 'version = 1\nname = "c"\n[distributed]\nstrategy = "ddp"\n')
    labels = [label for label, _ in candidate_overrides(ddp, lambda sets: True)]
    assert [label for label in labels if label.startswith("msamp-")] == ["msamp-O1", "msamp-O2", "msamp-O3"]


def test_candidates_option_picks_by_name_and_refuses_unknown_ones():
    available = [("torchao-tensorwise", ["a"]), ("torchao-rowwise", ["b"])]
    assert select(available, []) == available and select(available, ["compile"]) == available
    assert select(available, ["torchao-rowwise"]) == [("torchao-rowwise", ["b"])]
    with pytest.raises(UsageError, match="te-current is not a candidate here; "
                                         "candidates that run on this machine: torchao-tensorwise, torchao-rowwise"):
        select(available, ["te-current"])


def test_loss_gap_is_the_mean_relative_excess_over_bf16():
    assert loss_gap({1: 2.2, 2: 1.0}, {1: 2.0, 2: 1.0}) == pytest.approx(0.05)
    assert loss_gap({1: 1.8}, {1: 2.0}) == pytest.approx(-0.1)
    assert loss_gap({1: float("nan")}, {1: 2.0}) == float("inf")
    assert loss_gap({}, {1: 2.0}) is None


def test_toml_text_round_trips_a_spec():
    data = {"version": 1, "name": "x", "precision": {"mode": "fp8", "keep": ["lm_head", "*.router"], "torchao": {"recipe": "rowwise"}},
            "launch": {"device": "cpu", "env": {"OMP_NUM_THREADS": "1", "A B": 'q"uote'}}, "train": {"lr": 0.003, "steps": 5}}
    assert tomllib.loads(toml_text(data)) == data


def test_tuned_spec_applies_the_winner_drops_unread_sections_and_says_why(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('version = 1\nname = "s"\n[precision]\nmode = "fp8"\n[precision.te]\nrecipe = "current"\n[train]\nsteps = 9\n'
                    'model = "builtin:llama3-1b"\n')  # Linears torchao's size rule converts
    row = lambda name, tps, status, sets: {"name": name, "tokens_per_s": tps, "vs_bf16": tps / 100, "loss_gap": 0.001,  # noqa: E731
                                           "status": status, "note": "", "overrides": sets}
    record = {"name": "s", "repeats": 2, "steps": 4, "winner": "torchao-rowwise", "environment": {"device_name": "cpu", "world_size": 1},
              "candidates": [row("bf16", 100.0, "baseline", ['precision.mode="bf16"']),
                             row("torchao-rowwise", 120.0, "winner", ['precision.backend="torchao"', 'precision.torchao.recipe="rowwise"']),
                             {**row("torchao-tensorwise", 130.0, "rejected", []), "note": "loss gap +3.00% > 2.00%"}]}
    text = tuned_spec(str(spec), ["train.seq_len=64"], record)
    assert text.startswith("# Chosen by `fp8launch tune s.toml` on cpu x 1: torchao-rowwise at 120 tokens/s (1.200x bf16)")
    assert "#   bf16: 100 tokens/s, 16.7% slower (1.000x bf16)" in text
    assert "#   torchao-tensorwise: rejected: loss gap +3.00% > 2.00%" in text
    data = tomllib.loads(text)
    assert data["name"] == "s-tuned" and data["precision"] == {"mode": "fp8", "backend": "torchao", "torchao": {"recipe": "rowwise"}}
    assert data["train"] == {"steps": 9, "model": "builtin:llama3-1b", "seq_len": 64}
    out = tmp_path / "tuned.toml"
    out.write_text(text)
    planned = plan_one(str(out), str(tmp_path / "gen"))
    assert planned.plan.precision.torchao.recipe == "rowwise" and not [w for w in planned.warnings if w.rule.id == "SECTION-UNUSED"]


def test_out_folder_files_tune_did_not_write_are_never_touched(tmp_path):
    foreign = tmp_path / "runs" / "bf16-1"
    foreign.mkdir(parents=True)
    (foreign / "mine.txt").write_text("x")
    with pytest.raises(UsageError, match="exists and was not written by an earlier tune"):
        _claim(str(tmp_path), [str(foreign)])
    assert (foreign / "mine.txt").exists()
    (tmp_path / "tune.json").write_text(json.dumps({"candidates": [{"run_dirs": ["runs/bf16-1"]}]}))
    _claim(str(tmp_path), [str(foreign)])  # an earlier tune's run folder: replaced
    assert not foreign.exists()


def test_progress_shows_step_of_total_tokens_per_s_and_time_left_then_the_last_step(tmp_path, monkeypatch):
    import threading

    from launcher.commands import runs

    metrics = tmp_path / "metrics.jsonl"
    steps = [{"event": "step", "step": i, "step_time_s": t, "tokens_per_s": 1000 / t} for i, t in enumerate([2.0, 1.0, 1.0, 1.0, 1.0], 1)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in [{"event": "start"}, *steps]) + '{"event": "st')  # a line being written
    lines, done = [], threading.Event()
    done.set()  # read once and return
    monkeypatch.setattr(runs, "PROGRESS_EVERY_S", 3600.0)
    runs._progress(str(metrics), 6, "fp8 run 1", lines.append, done)
    # the first step (nothing shown yet), then nothing for PROGRESS_EVERY_S, but the last step is shown when it lands
    assert lines == ["  fp8 run 1: step 1/6, 500 tokens/s, 10 s left"]
    with metrics.open("a") as f:
        f.write('art"}\n' + json.dumps({"event": "step", "step": 6, "step_time_s": 1.0, "tokens_per_s": 1000.0}) + "\n")
    monkeypatch.setattr(runs, "PROGRESS_EVERY_S", 0.0)
    lines.clear()
    runs._progress(str(metrics), 6, "fp8 run 1", lines.append, done)
    # time left: the median of the last ten step times x the steps to go
    assert lines[1] == "  fp8 run 1: step 2/6, 1,000 tokens/s, 6 s left" and lines[-1] == "  fp8 run 1: step 6/6, 1,000 tokens/s, 0 s left"
    assert len(lines) == 6


def test_tune_where_no_fp8_recipe_runs_exits_3_before_any_run(tmp_path):
    from launcher.commands.tune import run_tune
    from launcher.errors import EXIT_ENVIRONMENT

    spec = tmp_path / "s.toml"
    spec.write_text('version = 1\nname = "c"\n[precision]\nmode = "fp8"\n[precision.torchao]\nskip_small = false\n'
                    f'[launch]\ndevice = "cpu"\n[train]\noutput_dir = "{tmp_path / "runs"}"\n')
    with pytest.raises(LauncherError) as e:
        run_tune(str(spec), out_dir=str(tmp_path / "t"), runs_here=lambda sets: False, echo=lambda line: None)
    assert e.value.exit_code == EXIT_ENVIRONMENT == 3 and "no FP8 recipe runs on this machine" in str(e.value)
    assert not (tmp_path / "t").exists()


def test_the_gap_is_taken_on_the_held_out_eval_losses_where_the_baseline_evaluated():
    from launcher.commands.runs import Variant
    from launcher.commands.tune.record import Candidate, tune_record

    def cand(label, losses, evals):
        v = Variant(label, "s.toml", [])
        v.runs = [{"exit_code": 0, "dir": f"/o/runs/{label}", "start": {}, "losses": losses, "evals": evals,
                   "figures": {"tokens_per_s": 100.0, "step_time_s": 1.0, "peak_mem_gib": 1.0, "final_loss": 1.0, "eval_loss": None}}]
        return Candidate(label, [], v)

    # training losses 10% worse, held-out losses 1% worse: with evals the candidate passes a 2% gate
    base, fp8 = cand("bf16", [[1, 2.0], [2, 1.0]], [[2, 3.0]]), cand("fp8", [[1, 2.2], [2, 1.1]], [[2, 3.03]])
    record = tune_record("t", [base, fp8], max_loss_gap=0.02, warmup=0, repeats=1, steps=2, interrupted=False, user_overrides=[])
    row = {r["name"]: r for r in record["candidates"]}["fp8"]
    assert record["loss_basis"] == "eval" and row["loss_gap"] == pytest.approx(0.01) and row["status"] != "rejected"
    base, fp8 = cand("bf16", [[1, 2.0], [2, 1.0]], []), cand("fp8", [[1, 2.2], [2, 1.1]], [])
    record = tune_record("t", [base, fp8], max_loss_gap=0.02, warmup=0, repeats=1, steps=2, interrupted=False, user_overrides=[])
    row = {r["name"]: r for r in record["candidates"]}["fp8"]
    assert record["loss_basis"] == "train" and row["loss_gap"] == pytest.approx(0.1) and row["status"] == "rejected"


def test_a_run_read_back_carries_its_eval_losses_and_the_last_one_as_a_figure(tmp_path):
    from launcher.commands.runs import read_run

    records = [{"event": "start"}] + [{"event": "step", "step": s, "loss": 3.0 - s, "step_time_s": 1.0, "tokens_per_s": 10.0}
                                      for s in (1, 2)]
    records += [{"event": "eval", "step": 1, "eval_loss": 2.5}, {"event": "eval", "step": 2, "eval_loss": 2.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = read_run(str(tmp_path), 0, warmup=0)
    assert run["evals"] == [[1, 2.5], [2, 2.25]] and run["figures"]["eval_loss"] == 2.25 and run["figures"]["final_loss"] == 1.0


def test_bench_and_tune_trials_write_to_no_experiment_tracker(tmp_path):
    from launcher.commands.runs import Variant, plan_variant

    spec = tmp_path / "s.toml"
    spec.write_text('version = 1\nname = "s"\n[log]\ntensorboard = true\nmlflow = true\n[log.wandb]\nproject = "p"\n')
    plan = plan_variant(Variant("spec", str(spec), []), None, 2).plan
    assert plan.log.trackers == ()


def test_an_moe_model_on_this_cpu_gets_no_rowwise_candidate_and_keeps_mxfp8(tmp_path):
    """Rowwise grouped GEMMs need CUDA (MOE-ROWWISE-CPU is about this machine, not the spec): not a candidate here;
    MXFP8's emulated grouped GEMMs are."""
    from launcher.commands.tune.candidates import doctor_says

    spec = tmp_path / "moe.toml"
    spec.write_text('version = 1\nname = "moe"\n[distributed]\nstrategy = "fsdp2"\nprocs_per_node = 2\n[launch]\ndevice = "cpu"\n'
                    '[train]\nmodel = "builtin:moe-debug"\nseq_len = 64\n')
    labels = [label for label, _ in candidate_overrides(plan_of(tmp_path, spec.read_text()), doctor_says(str(spec), []))]
    assert "torchao-mxfp8" in labels and "torchao-rowwise" not in labels and "torchao-tensorwise" in labels
