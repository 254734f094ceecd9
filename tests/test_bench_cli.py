"""`fp8launch bench`'s arguments and its table, without training (the e2e test trains)."""

from __future__ import annotations

from launcher.bench import table, variants


def test_vs_names_a_precision_or_a_spec(cli, spec):
    a, b = variants("x.toml", "fp16", ["train.steps=3"])
    assert b.overrides == ["train.steps=3", "precision.mode=fp16"] and a.overrides == ["train.steps=3"]
    path = spec('version = 1\nname = "b"\n')
    r = cli("bench", path, "--vs", "nope.toml")
    assert r.exit_code == 2 and "--vs 'nope.toml' is neither bf16/fp16/fp32 nor a spec file" in r.stderr


def test_table_shows_figures_and_ratios():
    fig = lambda tps, loss: {"tokens_per_s": tps, "step_time_s": 1000 / tps, "tflops_per_device": tps / 100, "mfu": None,  # noqa: E731
                             "peak_mem_gib": 2.0, "final_loss": loss}
    record = {"repeats": 2, "warmup_steps_excluded": 2, "environment": {"device_name": "NVIDIA H100", "world_size": 1, "torch": "2.11", "torchao": "0.18.0"},
              "spec": {"label": "spec", "figures": fig(1300.0, 2.5)}, "baseline": {"label": "bf16", "figures": fig(1000.0, 2.45)},
              "ratios": {"tokens_per_s": 1.3, "step_time_s": 1 / 1.3, "tflops_per_device": 1.3, "mfu": None, "peak_mem_gib": 1.0, "final_loss": 2.5 / 2.45}}
    lines = table(record).splitlines()
    assert lines[1].split() == ["tokens/s", "1,300", "1,000", "1.300"]
    assert lines[4].split() == ["MFU", "vs", "bf16", "dense", "n/a", "n/a", "n/a"]  # no mfu_peak recorded: the default basis
    record["environment"]["mfu_peak"] = "fp16 dense"
    assert table(record).splitlines()[4].split()[:4] == ["MFU", "vs", "fp16", "dense"]
    assert "NVIDIA H100 x 1, torch 2.11, torchao 0.18.0" in lines[-1]
