"""`fp8launch report`: a run folder (metrics.jsonl, fp8_stats.jsonl) drawn into report.png,
several runs overlaid, the worst layers named, and one line with exit 2 for a folder with no run."""

from __future__ import annotations

import json
import os

import pytest

from launcher.commands.report import load_run

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")


def _write_run(folder, name: str, *, steps: int = 12, stats: bool = True, spiky: str = "layers.2.mlp"):
    folder.mkdir(parents=True)
    lines = [{"event": "start", "name": name}]
    lines += [{"event": "step", "step": s, "loss": 5 - 0.1 * s, "lr": 1e-3 * s / steps, "tokens_per_s": 1000 + s,
               "peak_mem_gib": 0.4 + 0.001 * s, "step_time_s": 0.1} for s in range(1, steps + 1)]
    lines.append({"event": "end", "steps_run": steps})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    if stats:
        recs = [{"step": s, "layer": f"layers.{i}.mlp", "tensor": op, "amax": 1.0, "scale": 448.0,
                 "underflow": (0.3 if f"layers.{i}.mlp" == spiky and op == "input" else 1e-5 * i), "overflow": 0.0}
                for s in range(4, steps + 1, 4) for i in range(6) for op in ("input", "weight", "grad_output")]
        (folder / "fp8_stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


def test_report_draws_a_png_that_opens(tmp_path, cli):
    run = _write_run(tmp_path / "run", "demo")
    r = cli("report", str(run))
    assert r.exit_code == 0, r.stderr
    png = run / "report.png"
    assert r.stdout.strip() == f"wrote {png}"
    image = Image.open(png)
    assert image.format == "PNG" and image.width > 1000 and image.height > 1000
    assert sum(1 for n in image.convert("L").histogram() if n) > 50  # not blank
    assert not [f for f in os.listdir(run) if f.endswith(".tmp.png")]


def test_several_runs_overlay_into_the_first_folder_and_the_heatmap_grows_with_them(tmp_path, cli):
    a = _write_run(tmp_path / "a", "fp8")
    b = _write_run(tmp_path / "b", "bf16", stats=False)
    c = _write_run(tmp_path / "c", "fp8-rowwise", spiky="layers.4.mlp")
    assert cli("report", str(a)).exit_code == 0
    one = Image.open(a / "report.png").height
    r = cli("report", str(a), str(b), str(c), "--out", str(tmp_path / "all.png"))
    assert r.exit_code == 0, r.stderr
    # two heatmaps (the runs with FP8 stats) instead of one: a taller picture
    assert Image.open(tmp_path / "all.png").height > one + 200
    assert not (b / "report.png").exists()


def test_worst_layers_and_grid(tmp_path):
    run = load_run(str(_write_run(tmp_path / "run", "demo")))
    assert run.worst()[0] == ("layers.2.mlp", "input", 0.3)
    assert [w[0] for w in run.worst()[1:]] == ["layers.5.mlp", "layers.4.mlp"]
    layers, steps, grid = run.underflow_grid()
    assert layers == [f"layers.{i}.mlp" for i in range(6)] and steps == [4, 8, 12]
    assert grid[2] == [0.3, 0.3, 0.3] and grid[1] == [1e-5] * 3


def test_a_folder_with_no_run_exits_2_with_one_line(tmp_path, cli):
    (tmp_path / "empty").mkdir()
    good = _write_run(tmp_path / "good", "demo")
    r = cli("report", str(good), str(tmp_path / "empty"))
    assert r.exit_code == 2
    assert r.stdout == "" and r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'empty'} holds no run (no metrics.jsonl); fix: pass a run's train.output_dir, "
        "where `fp8launch run` wrote metrics.jsonl"]
    assert not (good / "report.png").exists()  # nothing drawn when one folder is bad
    r = cli("report", str(tmp_path / "missing"))
    assert r.exit_code == 2 and "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_eval_records_load_as_the_held_out_loss_series_and_draw_over_the_loss(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from launcher.commands.report import draw

    folder = _write_run(tmp_path / "run", "demo", stats=False)
    evals = [{"event": "eval", "step": s, "eval_loss": 6 - 0.1 * s, "eval_perplexity": 1.0} for s in (4, 8, 12)]
    evals.append({"event": "eval", "step": 12, "eval_loss": 4.5})  # a resumed run's repeat: the last one written wins
    with open(folder / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in evals))
    run = load_run(str(folder))
    assert run.eval_series() == ([4, 8, 12], [pytest.approx(5.6), pytest.approx(5.2), 4.5])
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)  # keep the figure open to read its loss panel
    draw([run], str(tmp_path / "r.png"))
    loss_axes = kept[0].axes[0]
    dashed = [line for line in loss_axes.get_lines() if line.get_label() == "demo (eval, held out)"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == run.eval_series()[1] and dashed[0].get_linestyle() == "--"
    monkeypatch.undo()
    plt.close(kept[0])
