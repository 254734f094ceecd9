"""`fp8launch bench`'s arguments and its table, without training (the e2e test trains)."""

from __future__ import annotations

import pytest

from launcher.commands.bench import table, variants


def test_vs_names_a_precision_or_a_spec(cli, spec):
    a, b = variants("x.toml", "fp16", ["train.steps=3"])
    assert b.overrides == ["train.steps=3", "precision.mode=fp16"] and a.overrides == ["train.steps=3"]
    path = spec('version = 1\nname = "b"\n')
    r = cli("bench", path, "--vs", "nope.toml")
    assert r.exit_code == 2 and "--vs 'nope.toml' is neither bf16/fp16/fp32 nor a spec file" in r.stderr


def test_table_shows_figures_and_ratios():
    fig = lambda tps, loss: {"tokens_per_s": tps, "step_time_s": 1000 / tps, "tflops_per_device": tps / 100, "mfu": None,  # noqa: E731
                             "peak_mem_gib": 2.0, "final_loss": loss}
    record = {"repeats": 2, "warmup_steps_excluded": 2,
              "environment": {"device_name": "NVIDIA H100", "world_size": 1, "torch": "2.11", "torchao": "0.18.0"},
              "spec": {"label": "spec", "figures": fig(1300.0, 2.5)}, "baseline": {"label": "bf16", "figures": fig(1000.0, 2.45)},
              "ratios": {"tokens_per_s": 1.3, "step_time_s": 1 / 1.3, "tflops_per_device": 1.3, "mfu": None, "peak_mem_gib": 1.0,
                         "final_loss": 2.5 / 2.45}}
    lines = table(record).splitlines()
    assert lines[1].split() == ["tokens/s", "1,300", "1,000", "1.300"]
    assert lines[4].split() == ["MFU", "vs", "bf16", "dense", "n/a", "n/a", "n/a"]  # no mfu_peak recorded: the default basis
    record["environment"]["mfu_peak"] = "fp16 dense"
    assert table(record).splitlines()[4].split()[:4] == ["MFU", "vs", "fp16", "dense"]
    assert "NVIDIA H100 x 1, torch 2.11, torchao 0.18.0" in lines[-1]


def test_out_that_holds_other_files_is_refused_and_kept(cli, spec, tmp_path):
    path = spec('version = 1\nname = "b"\n[launch]\ndevice = "cpu"\n[distributed]\nprocs_per_node = 1\n')
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "mine.csv").write_text("keep me\n")
    r = cli("bench", path, "--out", "results")
    assert r.exit_code == 2
    assert r.stderr.strip() == ("error: bench --out results: the folder is not empty and is not a bench's output, and bench "
                                "writes its runs there; fix: name a new or empty folder")
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["mine.csv"]
    assert (tmp_path / "results" / "mine.csv").read_text() == "keep me\n"


def test_a_previous_bench_folder_loses_only_what_that_bench_wrote(tmp_path):
    from launcher.commands.bench import MARKER, prepare_out

    out = tmp_path / "b"
    prepare_out(str(out), ["spec-1", "bf16-1"])
    for run in ("spec-1", "bf16-1"):
        (out / run).mkdir()
        (out / run / "train.log").write_text("log\n")
    (out / "bench.json").write_text("{}\n")
    (out / "profile.json").write_text("{}\n")  # bench --profile's
    (out / "notes.txt").write_text("the user's\n")
    prepare_out(str(out), ["spec-1", "bf16-1", "spec-2", "bf16-2"])
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "notes.txt"]
    assert (out / MARKER).read_text().split() == ["spec-1", "bf16-1", "spec-2", "bf16-2", "bench.json", "bench.png", "profile.json",
                                                     "profile.png", MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_out(str(empty), ["spec-1"])  # an empty folder is used as it is
    assert sorted(p.name for p in empty.iterdir()) == [MARKER]


def _variant(label: str, final: float, eval_loss: float | None):
    from launcher.commands.runs import Variant

    v = Variant(label, "s.toml", [])
    v.runs = [{"exit_code": 0, "figures": {"final_loss": final, "eval_loss": eval_loss}}]
    return v


def test_loss_gate_uses_the_held_out_eval_loss_where_both_evaluated():
    from launcher.commands.bench import gate_line, loss_gate

    gate = loss_gate(_variant("spec", 9.0, 2.06), _variant("bf16", 1.0, 2.0), 0.02)
    assert gate["basis"] == "eval_loss" and gate["gap"] == pytest.approx(0.03) and gate["gated"] and gate["passed"] is False
    assert gate_line(gate) == "loss gap +3.00% on the held-out eval loss: OVER the 2.0% gate"
    assert loss_gate(_variant("spec", 9.0, 2.02), _variant("bf16", 1.0, 2.0), 0.02)["passed"] is True
    # no [eval]: the final training loss, reported but not gated
    plain = loss_gate(_variant("spec", 1.1, None), _variant("bf16", 1.0, None), 0.02)
    assert plain["basis"] == "final_loss" and plain["gap"] == pytest.approx(0.1) and not plain["gated"] and plain["passed"] is None
    assert "not gated" in gate_line(plain)


def test_table_shows_the_eval_loss_row_and_the_gate_line():
    fig = lambda loss: {"tokens_per_s": 1000.0, "step_time_s": 1.0, "tflops_per_device": 1.0, "mfu": None,  # noqa: E731
                        "peak_mem_gib": 2.0, "final_loss": 2.0, "eval_loss": loss}
    record = {"repeats": 1, "warmup_steps_excluded": 0, "environment": {},
              "spec": {"label": "spec", "figures": fig(2.04)}, "baseline": {"label": "bf16", "figures": fig(2.0)},
              "ratios": {"tokens_per_s": 1.0, "step_time_s": 1.0, "tflops_per_device": 1.0, "mfu": None, "peak_mem_gib": 1.0,
                         "final_loss": 1.0, "eval_loss": 1.02},
              "loss_gate": {"basis": "eval_loss", "gap": 0.02, "max_loss_gap": 0.01, "gated": True, "passed": False}}
    lines = table(record).splitlines()
    assert lines[7].split() == ["eval", "loss", "(held", "out)", "2.0400", "2.0000", "1.020"]
    assert lines[8] == "loss gap +2.00% on the held-out eval loss: OVER the 1.0% gate"


def test_table_compares_the_levels_bytes_where_a_run_measured_them(tmp_path):
    """bench --vs compares precision.optimizer_states / grad_reduce: rank 0's optimizer state at the last step and the
    median of the gradient bytes it sent per steady step, read back from metrics.jsonl."""
    import json

    from launcher.commands.runs import read_run

    def figures(state: int, sent: list[int]) -> dict:
        folder = tmp_path / str(state)
        folder.mkdir()
        steps = [{"event": "step", "step": i + 1, "loss": 2.0, "step_time_s": 1.0, "tokens_per_s": 10.0,
                  "optimizer_state_bytes": state if i else 0, "grad_comm_bytes": b} for i, b in enumerate(sent)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{"event": "start"}, *steps]))
        return read_run(str(folder), 0, warmup=1)["figures"]

    fp8, fp32 = figures(2 * 2**20, [9, 2**20, 3 * 2**20, 2 * 2**20]), figures(8 * 2**20, [9, 4 * 2**20, 4 * 2**20, 4 * 2**20])
    assert fp8["optimizer_state_bytes"] == 2 * 2**20 and fp8["grad_comm_bytes"] == 2 * 2**20  # the warm-up step left out
    record = {"repeats": 1, "warmup_steps_excluded": 1, "environment": {},
              "spec": {"label": "spec", "figures": fp8}, "baseline": {"label": "fp32-states", "figures": fp32},
              "ratios": {"optimizer_state_bytes": 0.25, "grad_comm_bytes": 0.5}}
    rows = {line[:22].strip(): line.split()[-3:] for line in table(record).splitlines()[1:]}
    assert rows["optimizer state (MiB)"] == ["2.00", "8.00", "0.250"]
    assert rows["gradient MiB sent/step"] == ["2.00", "4.00", "0.500"]
    del fp8["grad_comm_bytes"], fp32["grad_comm_bytes"]  # one rank sends nothing: no row
    assert "gradient MiB sent/step" not in table(record)


def test_profile_last_keeps_the_profilers_steps_out_of_every_figure(cli, spec, tmp_path):
    """`bench --profile-last N`: a run's medians stop at the step before the profiler's warm-up step (read_run's
    `until`), and a bench whose steps leave none to measure is refused before anything runs."""
    import json

    from launcher.commands.runs import read_run

    steps = [{"event": "step", "step": i, "loss": 2.0, "step_time_s": 1.0, "tokens_per_s": tps}
             for i, tps in enumerate([1.0, 50.0, 60.0, 70.0, 5.0, 6.0, 7.0], start=1)]  # 2 warm-up, 3 timed, 2 under the profiler
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{"event": "start"}, *steps]))
    assert read_run(str(tmp_path), 0, warmup=1, until=4)["figures"]["tokens_per_s"] == 60.0  # steps 2..4
    assert read_run(str(tmp_path), 0, warmup=1)["figures"]["tokens_per_s"] == (7.0 + 50.0) / 2  # steps 2..7, the profiled in
    path = spec('version = 1\nname = "b"\n[launch]\ndevice = "cpu"\n[distributed]\nprocs_per_node = 1\n')
    r = cli("bench", path, "--steps", "5", "--warmup", "2", "--profile-last", "2", "--out", "b")
    assert r.exit_code == 2 and not (tmp_path / "b").exists()
    assert r.stderr.strip() == ("error: bench --profile-last 2 leaves no measured step: train.steps = 5 holds the 2 warm-up steps, "
                                "the profiler's own and the 2 profiled; fix: --steps 6 or more")
