"""What a user reads when a run fails, through the real CLI and real torchrun (2 processes, gloo):
the worker's one-line error last, then where the logs are; torchrun's traceback and failure table
only in <output_dir>/logs/torchrun.log; an unforeseen crash still shows its traceback; bench
passes a training run's exit code through."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import output_of, run, write_spec

pytestmark = pytest.mark.slow

FAILING_MODEL = '''\
"""builtin llama-debug (2 layers) whose forward fails on rank {rank} at call {at}: {how}."""
import os

import torch

from launcher.train.models.llama import Llama, parse_builtin


class Failing(Llama):
    def __init__(self):
        super().__init__(parse_builtin("builtin:llama-debug?layers=2"))
        self.calls = 0

    def forward(self, tokens):
        self.calls += 1
        logits = super().forward(tokens)
        if self.calls == {at} and int(os.environ.get("RANK", 0)) == {rank}:
            {how}
        return logits


def build():
    return Failing()
'''


def _spec(tmp_path: Path, name: str, how: str, rank: int = 1, procs: int = 2) -> Path:
    (tmp_path / f"{name}_model.py").write_text(FAILING_MODEL.format(rank=rank, at=2, how=how))
    return write_spec(tmp_path, name, train__model=f"py:{name}_model:build", train__steps=4, train__checkpoint_at_end=False,
                      distributed__strategy="ddp", distributed__procs_per_node=procs, precision__mode="bf16")


def test_our_error_is_the_last_line_then_the_logs(tmp_path):
    r, _ = run(tmp_path, "run", str(_spec(tmp_path, "nan", 'return logits * float("nan")')))
    assert r.returncode == 4, output_of(r)
    lines = r.stderr.splitlines()
    assert lines[-2].startswith("error: step 2: non-finite loss nan"), output_of(r)
    logs = Path("runs") / "nan" / "logs"
    assert lines[-1] == f"fp8launch: nan: torchrun exited with code 4; full logs (torchrun's report, each rank's output): {logs}/"
    assert sum("non-finite" in line for line in lines) == 1
    for noise in ("Traceback", "ChildFailedError", "Root Cause", "Failed to load", "Enum subclass"):
        assert noise not in r.stderr + r.stdout, noise
    report = (tmp_path / logs / "torchrun.log").read_text()
    assert "ChildFailedError" in report and "Root Cause" in report  # torchrun's report is kept, in the log
    rank_logs = sorted(p.relative_to(tmp_path / logs).parts[1:] for p in (tmp_path / logs).rglob("std*.log"))
    assert rank_logs == [("attempt_0", "0", "stderr.log"), ("attempt_0", "0", "stdout.log"),
                         ("attempt_0", "1", "stderr.log"), ("attempt_0", "1", "stdout.log")]
    assert "step 1/4" in r.stdout  # the workers' own lines still reach the terminal


def test_an_unforeseen_crash_shows_its_traceback_once(tmp_path):
    r, _ = run(tmp_path, "run", str(_spec(tmp_path, "crash", 'raise RuntimeError("boom in forward")')))
    assert r.returncode == 1, output_of(r)
    assert r.stderr.count("RuntimeError: boom in forward") == 1, output_of(r)
    assert r.stderr.count("Traceback (most recent call last)") == 1
    assert "[rank1]: Traceback (most recent call last)" in r.stderr and "ChildFailedError" not in r.stderr
    report = (tmp_path / "runs" / "crash" / "logs" / "torchrun.log").read_text()
    assert "[fp8launch-rank0]:[rank0]: Traceback" in report  # rank 0's consequent failure (its peer gone): in the log
    assert r.stderr.splitlines()[-1].startswith("fp8launch: crash: torchrun exited with code 1; full logs")


def test_bench_passes_the_training_exit_code_through(tmp_path):
    spec = _spec(tmp_path, "benchnan", 'return logits * float("nan")', rank=0, procs=1)
    r, _ = run(tmp_path, "bench", str(spec), "--repeats", "1", "--out", "b", "--no-plot")
    assert r.returncode == 4, output_of(r)
    assert r.stderr.splitlines()[-1] == "error: bench: the spec run exited with code 4; see b/spec-1/train.log"
    assert "non-finite" in (tmp_path / "b" / "spec-1" / "train.log").read_text()


BLOCKS_ELSEWHERE = '''\
"""A user's model whose repeated blocks live in `self.blocks`, where fp8launch does not look for them."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.vocab_size = 256
        self.embed = nn.Embedding(256, 64)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(64, 256)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def build():
    return Model()
'''


def test_a_feature_that_did_not_take_effect_stops_before_step_1_with_exit_3(tmp_path):
    """compile.enabled on a model whose blocks fp8launch cannot find compiled nothing, silently, before
    the start record measured it; now the run stops before step 1 naming the key."""
    (tmp_path / "blocks_model.py").write_text(BLOCKS_ELSEWHERE)
    spec = write_spec(tmp_path, "no-blocks", train__model="py:blocks_model:build", train__steps=2, train__seq_len=16,
                      train__checkpoint_at_end=False, distributed__strategy="ddp", precision__mode="bf16", compile__enabled=True)
    r, _ = run(tmp_path, "run", str(spec))
    assert r.returncode == 3, output_of(r)
    ours = [line for line in r.stderr.splitlines() if "error[EFFECT-MISSING]" in line]
    assert len(ours) == 1 and "the model has no repeated blocks fp8launch can find" in ours[0]
    assert "compile.enabled needs compiled_blocks = 1, and this run has 0" in ours[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "runs" / "no-blocks" / "metrics.jsonl").exists()  # stopped before the start record
