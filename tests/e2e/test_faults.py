"""The machine fails a real run (issue 49, item 7), through the real CLI and torchrun (2 processes, gloo): a disk that
fills while a checkpoint is written, and a rank killed with SIGKILL. Each is one line naming its cause, the exit code
says it, and what is safe to resume from is named and intact; the killed run then resumes past the partial line a
killed writer leaves in metrics.jsonl. The refusals that start nothing (a held rendezvous port, a CPU run beyond the
machine's memory) and odd metrics files are in tests/hostile/test_faults.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.targets import checkpoint_record as record
from tests.support import tmpfs

from .helpers import FP8LAUNCH, descendants, env, output_of, run, write_spec

pytestmark = pytest.mark.slow
MODEL = "builtin:llama-debug?layers=1&vocab=512"
"""1.1M parameters: a checkpoint with AdamW's states is 13 MB."""


@pytest.fixture
def small_disk(tmp_path):
    """A 20 MB tmpfs: one checkpoint of the model below fits, a second does not."""
    with tmpfs(tmp_path / "disk", "20m") as mnt:
        yield mnt


def test_a_disk_that_fills_during_a_checkpoint_is_one_line_and_the_checkpoint_before_stays_whole(tmp_path, small_disk):
    """Before: "torchrun exited with code 3" and nothing else (the rank's line went into its log file, on the full disk).
    1.1M parameters with AdamW: 13 MB a checkpoint; step 2's fits on the 20 MB disk, step 4's does not. ~20 s."""
    spec = write_spec(tmp_path, "full", train__model=MODEL, train__seq_len=32, train__steps=4,
                      train__checkpoint_every=2, train__output_dir=str(small_disk / "run"), distributed__strategy="ddp",
                      precision__mode="bf16")
    r, seconds = run(tmp_path, "run", str(spec))
    print(f"full disk: exit {r.returncode} in {seconds:.1f} s")
    assert r.returncode == 3, output_of(r)
    checkpoints = small_disk / "run" / "checkpoints"
    lines = r.stderr.splitlines()
    assert lines[-2] == (f"error: no space left on device writing {checkpoints}/.tmp-step-4 (0 bytes free on {small_disk}); the newest "
                         f"complete checkpoint is {checkpoints}/step-2; fix: free space on {small_disk}, or set train.output_dir to a "
                         "folder on another filesystem"), output_of(r)
    assert lines[-1].startswith("fp8launch: full: torchrun exited with code 3; full logs")
    assert "Traceback" not in r.stderr and sum(line.startswith("error") for line in lines) == 1
    assert json.loads((checkpoints / "step-2" / "COMPLETE.json").read_text())["step"] == 2
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoints / "step-2" / "model", tmp_path / "step2.pt")  # reads every byte of the shards
    weights = torch.load(tmp_path / "step2.pt", weights_only=True)
    from launcher.train.models.llama import Llama, parse_builtin

    model = Llama(parse_builtin(MODEL)).state_dict()
    assert {k: t.shape for k, t in weights.items()} == {k: t.shape for k, t in model.items()}
    assert all(torch.isfinite(t).all() for t in weights.values())


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.decode().split("=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return {}


def test_a_rank_killed_by_a_signal_is_one_line_then_the_run_resumes_past_a_cut_metrics_line(tmp_path):
    """Before: the survivor's gloo traceback ("Connection closed by peer"), the cause only in torchrun.log. The worker of
    rank 1 is found among the run's own processes (children of the torchrun this test started) and killed with SIGKILL
    after step 3; then a record cut short is left at the end of metrics.jsonl, as rank 0 killed mid-write leaves it, and
    the same command resumes from step 2 to the end. ~35 s."""
    spec = write_spec(tmp_path, "killed", train__seq_len=32, train__steps=8, train__checkpoint_every=2, train__output_dir="runs/killed",
                      distributed__strategy="ddp", precision__mode="bf16")
    p = subprocess.Popen([FP8LAUNCH, "run", str(spec)], cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        for line in p.stdout:
            if line.startswith("step 3/8"):
                break
        workers = [d for d in descendants(p.pid) if _environ(d).get("RANK") == "1" and "TORCHELASTIC_RUN_ID" in _environ(d)]
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        killed = time.monotonic()
        out, err = p.communicate(timeout=120)
        seconds = time.monotonic() - killed
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # its own group only
            p.wait()
    print(f"killed rank: exit {p.returncode} {seconds:.1f} s after the kill")
    assert p.returncode == 128 + signal.SIGKILL, err
    lines = err.splitlines()
    # the kill lands after step 3 or, where rank 0 ran on while /proc was read, a step later: the line names what the run's
    # own files say, the last step logged and the newest complete checkpoint
    out_dir = tmp_path / "runs" / "killed"
    last = [json.loads(line)["step"] for line in (out_dir / "metrics.jsonl").read_text().splitlines() if '"event": "step"' in line][-1]
    newest = max(step for step, _ in record.complete(str(out_dir / "checkpoints")))
    assert last >= 3 and newest in (2, 4) and newest <= last, (last, newest)
    assert lines[-2] == (f"error: rank 1 was killed by SIGKILL (signal 9) after step {last}; the other ranks stopped with it; the "
                         f"newest complete checkpoint is runs/killed/checkpoints/step-{newest}; fix: find what sent it (SIGKILL: most "
                         "often the kernel's out-of-memory killer, which `dmesg` names; lower train.micro_batch_size or use fewer ranks "
                         "if so); then run the same command again to continue from that checkpoint"), err
    assert lines[-1].startswith("fp8launch: killed: torchrun exited with code 137; full logs")
    for consequence in ("Traceback", "Connection closed by peer", "ChildFailedError"):
        assert consequence not in err, consequence
    log = (tmp_path / "runs" / "killed" / "logs" / "torchrun.log").read_text()
    assert "(SIGKILL)" in log and "Traceback" in log  # torchrun's table and the survivor's traceback: kept, in the log

    metrics = tmp_path / "runs" / "killed" / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write(f'{{"event": "step", "step": {last + 1}, "lo')
    r, seconds = run(tmp_path, "run", str(spec))
    print(f"resumed: {seconds:.1f} s")
    assert r.returncode == 0, output_of(r)
    note = ("note: metrics.jsonl: cut a partial last line (32 bytes, from a run stopped while writing it) back to the last complete "
            "record before appending")
    assert r.stdout.count(note) == 1, r.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line whole
    starts = [i for i, rec in enumerate(records) if rec["event"] == "start"]
    assert len(starts) == 2 and records[starts[1]]["resumed_from"].endswith(f"runs/killed/checkpoints/step-{newest}")
    assert [rec["step"] for rec in records[starts[1]:] if rec["event"] == "step"] == list(range(newest + 1, 9))
    assert re.search(rf"resumed from \S*runs/killed/checkpoints/step-{newest} at step {newest}", r.stdout)
    assert Path(tmp_path / "runs" / "killed" / "checkpoints" / "step-8" / "COMPLETE.json").exists()
