"""The FP8 monitor in a real run: `fp8launch run` starts torchrun, two processes train the debug
Llama with torchao FP8 under FSDP2 (float8 all-gather, so weights reach the layers already cast
and are measured from their high-precision shards), and rank 0 writes fp8_stats.jsonl; then
`fp8launch report` draws the run."""

from __future__ import annotations

import json

import pytest

from .helpers import FP8, FP8_LAYERS, output_of, records, run, write_spec

pytestmark = pytest.mark.slow

EVERY, STEPS, MICRO, SEQ = 5, 12, 2, 64


def test_fsdp2_torchao_run_writes_every_fp8_layer_at_the_sampled_steps_and_report_draws_it(tmp_path):
    """~20 s."""
    spec = write_spec(tmp_path, "monitored", distributed__strategy="fsdp2", precision__torchao__fsdp_float8_all_gather=True,
                      monitor__fp8_stats_every=EVERY, train__steps=STEPS, train__micro_batch_size=MICRO, train__seq_len=SEQ, **FP8)
    r, _ = run(tmp_path, "run", str(spec))
    assert r.returncode == 0, output_of(r)
    out = tmp_path / "runs" / "monitored"
    recs = records(out)
    stats = [json.loads(line) for line in (out / "fp8_stats.jsonl").read_text().splitlines()]

    assert {s["step"] for s in stats} == {5, 10}
    layers = {s["layer"] for s in stats}
    assert len(layers) == FP8_LAYERS == recs.start["fp8_layers"]
    assert all(name.startswith("layers.") for name in layers)  # the model's FQNs, no wrapper prefixes
    for step in (5, 10):  # one record per (layer, operand) and sampled step: rank 0 alone writes
        keys = [(s["layer"], s["tensor"]) for s in stats if s["step"] == step]
        assert sorted(keys) == sorted((layer, op) for layer in layers for op in ("input", "weight", "grad_output"))
    for s in stats:
        assert 0 <= s["underflow"] <= 1 and 0 <= s["overflow"] <= 1 and s["amax"] > 0 and s["scale"] > 0
        assert s["format"] == ("e5m2" if s["tensor"] == "grad_output" else "e4m3")
        assert s["scale"] == pytest.approx(448.0 / s["amax"] if s["format"] == "e4m3" else 57344.0 / s["amax"], rel=1e-6) \
            or s["tensor"] == "input"  # inputs: each rank scales its own batch; the record keeps the smallest scale
    # counts summed over both ranks: the weights from the two FSDP2 shards make the whole matrix,
    # the inputs are both ranks' micro-batches
    wq = {s["tensor"]: s for s in stats if s["step"] == 5 and s["layer"] == "layers.1.attention.wq"}
    dim = round((wq["weight"]["nonzero"]) ** 0.5)
    assert wq["weight"]["nonzero"] == dim * dim
    tokens = 2 * MICRO * SEQ
    assert tokens * dim * 0.9 < wq["input"]["nonzero"] <= tokens * dim
    assert "fp8 monitor: 2 samples" in r.stderr

    r, _ = run(tmp_path, "report", str(out))
    assert r.returncode == 0, output_of(r)
    png = out / "report.png"
    assert r.stdout.strip() == f"wrote {png}"
    from PIL import Image

    image = Image.open(png).convert("L")
    assert image.width > 1000 and image.height > 1000  # four panels and a 27-layer heatmap
    assert sum(1 for n in image.histogram() if n) > 50  # drawn, not blank: many grey levels
