"""Nothing lost, end to end: real `fp8launch run` processes (torchrun, gloo, 2 ranks on this CPU).

- A run resumed from another run's step-10 checkpoint logs bit-identical losses for the steps
  after it and ends with bit-identical weights and optimizer state: FSDP2 + torchao float8
  (float8 all-gather), DeepSpeed ZeRO-2 and 3; DDP bf16 resumes from it past newer checkpoints
  damaged after they were written (skipped, one line each), and exports past one.
- SIGKILL of one worker (found through /proc, killed from this process): torchrun restarts the
  group (launch.max_restarts = 1), which resumes from the newest checkpoint and ends exactly as
  the uninterrupted run.
- SIGTERM to the `fp8launch run` process group: every rank finishes its step, a checkpoint of
  that step is written, exit 75; the next `run` resumes from it and ends exactly as the
  uninterrupted run; train.resume = "never" then refuses to overwrite it.
- A non-finite loss on one rank: on_nan = "stop" stops both ranks at that step (exit 4) naming
  the last checkpoint and the backend's likely causes; "skip" counts skipped steps and stops
  after MAX_CONSECUTIVE_SKIPS in a row.
- The checkpoint of a real run exports with the one-liner of docs/checkpoints.md (torch alone)
  and loads into a plain model with strict=True.

Each `fp8launch run` costs ~5-9 s here, most of it importing torch in every process; the
file takes ~1.5 min on the 2-core development machine (the tests' docstrings give theirs,
the module-scoped reference runs of ~8 s each included in the first test that uses them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from launcher.targets import checkpoint_record as record
from launcher.train.checkpoint import read_marker
from launcher.train.loop import MAX_CONSECUTIVE_SKIPS

from .helpers import FP8, FP8LAUNCH, children, env, output_of, run, write_spec

pytestmark = pytest.mark.slow

MODEL = "builtin:llama-debug?layers=2"
DDP = dict(distributed__strategy="ddp", precision__mode="bf16", train__grad_accum_steps=2)
FSDP2_FP8 = dict(distributed__strategy="fsdp2", precision__torchao__fsdp_float8_all_gather=True, **FP8)
DEEPSPEED = dict(distributed__strategy="deepspeed", distributed__deepspeed__zero_stage=2, precision__mode="bf16")


@dataclass(frozen=True)
class Run:
    """An uninterrupted reference run: its folder (cwd), spec and output_dir."""

    folder: Path
    spec: Path
    name: str

    @property
    def out(self) -> Path:
        return self.folder / "runs" / self.name

    def checkpoint(self, step: int) -> Path:
        return self.out / "checkpoints" / f"step-{step}"


def _reference(folder: Path, name: str, steps: int, **keys) -> Run:
    spec = write_spec(folder, name, train__model=MODEL, train__steps=steps, train__checkpoint_every=10, train__keep_checkpoints=3, **keys)
    r, seconds = run(folder, "run", str(spec))
    assert r.returncode == 0, output_of(r)
    print(f"{name}: uninterrupted run of {steps} steps in {seconds:.1f} s")
    return Run(folder, spec, name)


DDP_REF = pytest.mark.xdist_group("resume_ddp_ref")
FSDP2_REF = pytest.mark.xdist_group("resume_fsdp2_ref")
"""The tests that read one module-scoped reference run share a worker (pytest -n, --dist loadgroup): built once."""


@pytest.fixture(scope="module")
def ddp_ref(tmp_path_factory) -> Run:
    return _reference(tmp_path_factory.mktemp("ddp"), "ddp", 30, **DDP)


@pytest.fixture(scope="module")
def fsdp2_ref(tmp_path_factory) -> Run:
    return _reference(tmp_path_factory.mktemp("fsdp2"), "fsdp2-fp8", 20, **FSDP2_FP8)


# -- reading what a run left ------------------------------------------------------------------

def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def losses(records: list[dict]) -> dict[int, float]:
    """step -> loss as metrics.jsonl holds it (the float, exactly); a step logged twice (a restart) keeps its last."""
    return {r["step"]: r["loss"] for r in records if r["event"] == "step"}


def starts(records: list[dict]) -> list[dict]:
    return [r for r in records if r["event"] == "start"]


def exported(folder: Path, tmp: Path) -> dict:
    """A DCP folder (model/ or optim/) as the plain dict `dcp_to_torch_save` makes of it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = tmp / f"export-{abs(hash(str(folder)))}.pt"
    dcp_to_torch_save(str(folder), str(target))
    return torch.load(target, weights_only=True)


def assert_identical(a, b, where: str = "") -> None:
    """The same nested structure, every tensor bit for bit (torch.equal), every other value equal."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_dcp_checkpoint(a: Path, b: Path, tmp: Path) -> int:
    """Weights and optimizer state of two DCP checkpoints are bit-identical; returns the number of weight tensors."""
    weights = exported(a / "model", tmp)
    assert_identical(weights, exported(b / "model", tmp), "model")
    assert_identical(exported(a / "optim", tmp), exported(b / "optim", tmp), "optim")
    return len(weights)


# -- processes -----------------------------------------------------------------------------------

def start_group(cwd: Path, *args: str) -> subprocess.Popen:
    """`fp8launch ARGS` in a process group of its own (fp8launch + torchrun; the workers get their own)."""
    return subprocess.Popen([FP8LAUNCH, *args], cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_step(proc: subprocess.Popen, out: Path, step: int, timeout: float = 120) -> int:
    """Wait until metrics.jsonl holds a step record >= `step`; returns the newest step logged."""
    deadline = time.monotonic() + timeout
    path = out / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended before step {step}: exit {proc.returncode}\n{proc.stderr.read()[-3000:]}"
        if path.exists():
            complete = path.read_text().split("\n")[:-1]  # rank 0 may be writing the last line right now
            stepped = [r["step"] for r in map(json.loads, complete) if r["event"] == "step"]
            if stepped and stepped[-1] >= step:
                return stepped[-1]
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"no step {step} within {timeout} s")


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a run that is still going, with its workers (they run in sessions of their own)."""
    if proc.poll() is not None:
        return
    pids, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children(pid))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def worker_pids(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the training processes under `fp8launch run` (pid) -> torchrun."""
    (torchrun,) = children(launcher_pid)
    workers = {}
    for pid in children(torchrun):
        environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in item)
        workers[int(environ[b"RANK"])] = pid
    return workers


# -- bit-identical continuation -------------------------------------------------------------------

def resume_from_step_10(ref: Run, steps: int) -> tuple[list[dict], Path, subprocess.CompletedProcess]:
    """A second run that starts from the reference's step-10 checkpoint (train.resume = its path) in its own output_dir."""
    out = ref.folder / "runs" / f"{ref.name}-resumed"
    r, seconds = run(ref.folder, "run", str(ref.spec), "--set", f"train.output_dir=runs/{ref.name}-resumed",
                     "--set", f"train.resume=runs/{ref.name}/checkpoints/step-10")
    assert r.returncode == 0, output_of(r)
    print(f"{ref.name}: resumed at step 10, ran to {steps} in {seconds:.1f} s")
    assert f"resumed from runs/{ref.name}/checkpoints/step-10 at step 10\n" in r.stdout
    records = metrics(out)
    (start,) = starts(records)
    assert (start["start_step"], start["resumed_from"], start["restart_count"]) == (10, str(ref.checkpoint(10)), 0)
    expected = losses(metrics(ref.out))
    got = losses(records)
    assert sorted(got) == list(range(11, steps + 1))
    assert got == {s: expected[s] for s in got}, (got, expected)  # float equality: bit for bit
    assert records[-1]["event"] == "end" and records[-1]["final_step"] == steps and records[-1]["steps_run"] == steps - 10
    return records, out, r


@FSDP2_REF
def test_fsdp2_torchao_fp8_resume_is_bit_identical_and_exports_with_the_documented_one_liner(fsdp2_ref, tmp_path):
    """FSDP2 + torchao float8 all-gather: losses 11-20 and the final weights and optimizer state. ~18 s."""
    _, out, _ = resume_from_step_10(fsdp2_ref, 20)
    final = out / "checkpoints" / "step-20"
    # precision.torchao.precompute_scale (the default): the scales are recomputed from the loaded weights.
    assert read_marker(str(final))["float8_precomputed_scale"] is True
    n = assert_same_dcp_checkpoint(fsdp2_ref.checkpoint(20), final, tmp_path)
    assert n == 21  # llama-debug with 2 layers: 9 tensors per layer + embeddings, final norm, head

    # docs/checkpoints.md: one line, torch alone, then torch.load (weights_only) into the plain model, strict.
    target = tmp_path / "weights.pt"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch",
                           str(final / "model"), str(target)], capture_output=True, text=True, env=env(), timeout=120)
    assert done.returncode == 0 and target.exists(), done.stderr[-3000:]
    from launcher.train.models import build_model

    weights = torch.load(target)
    model = build_model(MODEL, ".")
    model.load_state_dict(weights, strict=True)
    assert all(type(v) is torch.Tensor and v.dtype == torch.float32 for v in weights.values())
    assert not any(b"torchao" in f.read_bytes() for f in (final / "model").glob("*.distcp"))
    assert_identical(weights, exported(fsdp2_ref.checkpoint(20) / "model", tmp_path), "weights")


def test_fsdp2_torchao_mxfp8_resume_is_bit_identical_and_saves_plain_weights(tmp_path):
    """torchao MXFP8 (emulated on CPU) under FSDP2: its weights live in MXFP8TrainingWeightWrapperTensor, which the
    checkpoint saves as the plain tensor it wraps (else loading needs weights_only=False); losses 11-20 match. ~35 s."""
    mx = _reference(tmp_path, "fsdp2-mxfp8", 20, distributed__strategy="fsdp2", **{**FP8, "precision.torchao.recipe": "mxfp8"})
    (start,) = starts(metrics(mx.out))
    assert start["recipe"] == "mxfp8" and "fp8 mxfp8" in start["layers"].values()
    _, out, _ = resume_from_step_10(mx, 20)
    assert not any(b"torchao" in f.read_bytes() for f in (out / "checkpoints" / "step-20" / "model").glob("*.distcp"))
    assert assert_same_dcp_checkpoint(mx.checkpoint(20), out / "checkpoints" / "step-20", tmp_path) == 21


def test_a_precision_schedule_resumes_bit_identically_between_two_switches(tmp_path):
    """[[precision.schedule]] through every direction the switch takes (compiled FSDP2): the last block back to bf16
    from step 6, FP8 rowwise everywhere from step 14 (the kept block back into FP8, the others to another recipe),
    bf16 from step 18. The run resumed from step 10 is built in phase 1's precision, switches at 14 and 18 like the
    uninterrupted one, and matches it bit for bit; both write the `precision` events. ~40 s warm. keep_first_last off:
    both blocks then hold the same layers, so each phase compiles one graph per precision rather than one per block
    (layers.0 kept its first Linear in bf16): 3 graphs from a cold cache instead of 5."""
    schedule = [{"at_step": 6, "keep_last_blocks": 1}, {"at_step": 14, "keep_last_blocks": 0, "recipe": "rowwise"},
                {"at_step": 18, "mode": "bf16"}]
    ref = _reference(tmp_path, "scheduled", 20, distributed__strategy="fsdp2", compile__enabled=True,
                     precision__schedule=schedule, **FP8, precision__keep_first_last=False)
    events = [r for r in metrics(ref.out) if r["event"] == "precision"]
    # 7 Linear a block; the output layer stays in FP8 until bf16 (keep_last_blocks counts blocks)
    assert [(e["step"], e["phase"], e["fp8_layers"]) for e in events] == [(6, 1, 8), (14, 2, 15), (18, 3, 0)]
    assert set(events[1]["changed"].values()) == {"fp8 rowwise"} and len(events[1]["changed"]) == 15
    records, _, r = resume_from_step_10(ref, 20)
    (start,) = starts(records)
    assert start["precision_phase"] == 1 and start["fp8_layers"] == 8
    assert [(e["step"], e["phase"]) for e in records if e["event"] == "precision"] == [(14, 2), (18, 3)]
    assert "precision: from step 14: fp8 torchao rowwise (was fp8 torchao tensorwise)" in r.stdout
    assert "precision: from step 18: bf16 (was fp8 torchao rowwise)" in r.stdout


@DDP_REF
def test_ddp_bf16_resume_skips_damaged_checkpoints_and_is_bit_identical_from_the_intact_one(ddp_ref, tmp_path):
    """DDP bf16 with 2 micro-batches per step: the reference's checkpoints 10, 20, 30 copied into a new run's folder,
    then damaged after they were written: a bit flipped in one of step-30's model shards, the one rank 1 checks (the
    ranks split the check and must decide alike), and step-20's rank file cut short. train.resume = "auto" skips
    both, one line each, and resumes from step-10: losses 11-30, final weights and optimizer state bit for bit.
    Then `fp8launch export` of that run with a damaged newest checkpoint falls back with one line, and --step of it
    exits 2. ~15 s."""
    out = ddp_ref.folder / "runs" / "ddp-resumed"
    shutil.copytree(ddp_ref.out / "checkpoints", out / "checkpoints")
    files = read_marker(str(ddp_ref.checkpoint(30)))["files"]
    shard = next(n for n in record.share(files, 1, 2) if n.startswith("model/") and n.endswith(".distcp"))
    flip(out / "checkpoints" / "step-30" / shard)
    rank_file = out / "checkpoints" / "step-20" / "rank-00001.pt"
    rank_file.write_bytes(rank_file.read_bytes()[:1024])
    r, seconds = run(ddp_ref.folder, "run", str(ddp_ref.spec), "--set", "train.output_dir=runs/ddp-resumed")
    assert r.returncode == 0, output_of(r)
    print(f"ddp: resumed past two damaged checkpoints at step 10, ran to 30 in {seconds:.1f} s")
    skipped = [line for line in r.stderr.splitlines() if line.endswith("; skipped")]
    assert len(skipped) == 2, r.stderr[-3000:]
    assert re.fullmatch(rf"warning: runs/ddp-resumed/checkpoints/step-30: {re.escape(shard)} does not match its checksum "
                        r"\(crc32 [0-9a-f]{8}, the record says [0-9a-f]{8}\); skipped", skipped[0]), skipped
    assert skipped[1] == (f"warning: runs/ddp-resumed/checkpoints/step-20: rank-00001.pt is 1,024 bytes, the record says "
                          f"{files['rank-00001.pt']['bytes']:,}; skipped")
    assert "resumed from runs/ddp-resumed/checkpoints/step-10 at step 10\n" in r.stdout
    records = metrics(out)
    (start,) = starts(records)
    assert (start["start_step"], start["resumed_from"]) == (10, str(out / "checkpoints" / "step-10"))
    expected, got = losses(metrics(ddp_ref.out)), losses(records)
    assert sorted(got) == list(range(11, 31)) and got == {s: expected[s] for s in got}  # bit for bit
    assert_same_dcp_checkpoint(ddp_ref.checkpoint(30), out / "checkpoints" / "step-30", tmp_path)
    assert sorted(p.name for p in (ddp_ref.out / "checkpoints").iterdir()) == ["step-10", "step-20", "step-30"]  # keep 3
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-10", "step-20", "step-30"]  # saved again, intact

    from click.testing import CliRunner

    from launcher.cli import main

    flip(out / "checkpoints" / "step-30" / shard)
    cli = CliRunner()
    done = cli.invoke(main, ["export", str(out), "--format", "torch", "--out", str(tmp_path / "export")])
    assert done.exit_code == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {out}/checkpoints/step-30: {shard} does not match its checksum")
    assert json.loads((tmp_path / "export" / "fp8launch-export.json").read_text())["step"] == 20
    refused = cli.invoke(main, ["export", str(out), "--step", "30", "--format", "torch", "--out", str(tmp_path / "refused")])
    assert refused.exit_code == 2 and "Traceback" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: --step: {out}/checkpoints/step-30 is damaged: {shard} does not match its checksum")
    assert not (tmp_path / "refused").exists()


def flip(path: Path) -> None:
    """One bit flipped in the middle of the file at `path` (its size stays)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _zero_to_fp32(checkpoint: Path, target: Path) -> dict:
    ds = checkpoint / "deepspeed"
    done = subprocess.run([sys.executable, str(ds / "zero_to_fp32.py"), str(ds), str(target)], capture_output=True, text=True,
                          env=env(), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(target / "pytorch_model.bin", weights_only=True)


@pytest.mark.parametrize("stage, files", [(2, 3), (3, 4)])
def test_deepspeed_zero_resume_is_bit_identical(tmp_path, stage, files):
    """ZeRO-2 and ZeRO-3 bf16: losses 11-20, DeepSpeed's own files (module, fp32 partitions, optimizer, lr schedule)
    and the zero_to_fp32 export. ZeRO-3 resumes a model partitioned module by module as it is given storage, without
    initialising it (launcher/train/materialize.py), then DeepSpeed loads each rank's partition. ~18 s each."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    ref = _reference(tmp_path, f"ds-z{stage}", 20, **{**DEEPSPEED, "distributed__deepspeed__zero_stage": stage})
    _, out, _ = resume_from_step_10(ref, 20)
    a, b = ref.checkpoint(20) / "deepspeed" / "ds", out / "checkpoints" / "step-20" / "deepspeed" / "ds"
    names = sorted(p.name for p in a.iterdir())
    # ZeRO-2: one model-states file + an optimizer partition per rank; ZeRO-3: both per rank
    assert names == sorted(p.name for p in b.iterdir()) and len(names) == files, names
    files = names
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # unpickling DeepSpeed's files imports deepspeed
    for name in files:  # DeepSpeed pickles more than tensors: its own files need weights_only=False
        sa, sb = (torch.load(d / name, weights_only=False, map_location="cpu") for d in (a, b))
        assert_identical(_tensors_only(sa), _tensors_only(sb), name)
    fp32 = _zero_to_fp32(out / "checkpoints" / "step-20", tmp_path / "export")
    from launcher.train.models import build_model

    build_model(MODEL, ".").load_state_dict(fp32, strict=True)
    assert all(v.dtype == torch.float32 for v in fp32.values())


def _tensors_only(tree):
    """The tensors and numbers of a DeepSpeed state file (its argparse and config objects left out)."""
    if isinstance(tree, dict):
        return {k: _tensors_only(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_tensors_only(v) for v in tree]
    return tree if isinstance(tree, (torch.Tensor, int, float, str, bool, type(None))) else None


# -- a worker killed: torchrun restarts the group, which resumes --------------------------------

@DDP_REF
def test_a_killed_worker_is_restarted_and_resumes_to_the_same_losses(ddp_ref, tmp_path):
    """SIGKILL to rank 1 mid-run; torchrun (launch.max_restarts = 1) restarts both ranks, which resume
    from the newest complete checkpoint (every 5 steps) and finish as the uninterrupted run. ~10 s."""
    # torch >= 2.5 shares torchrun's rendezvous TCPStore with the workers' process group, and a restarted
    # group then reads the dead group's gloo addresses from it and hangs (pytorch/pytorch#135712): opt out.
    spec = write_spec(tmp_path, ddp_ref.name, train__model=MODEL, train__steps=30, train__keep_checkpoints=3,
                      **DDP)
    out = tmp_path / "runs" / ddp_ref.name
    # train.resume = "never" protects other runs' checkpoints; a restart of this run still continues it.
    proc = start_group(tmp_path, "run", str(spec), "--set", "launch.max_restarts=1", "--set", "train.checkpoint_every=5",
                       "--set", "train.resume=never")
    t0 = time.monotonic()
    try:
        logged = wait_for_step(proc, out, 7)
        workers = worker_pids(proc.pid)
        assert sorted(workers) == [0, 1], workers
        os.kill(workers[1], signal.SIGKILL)
        killed_at = time.monotonic() - t0
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        stop_tree(proc)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    records = metrics(out)
    first, second = starts(records)  # the restart wrote a second start record
    assert (first["start_step"], first["restart_count"], first["resumed_from"]) == (0, 0, None)
    resumed = second["start_step"]
    before = [r["step"] for r in records[: records.index(second)] if r["event"] == "step"]
    assert before == list(range(1, before[-1] + 1)) and before[-1] >= logged
    # The newest checkpoint complete when rank 1 died: every 5 steps, or the one before when it died mid-save.
    assert resumed % 5 == 0 and 5 <= resumed <= before[-1] < resumed + 10, (resumed, before[-1])
    assert second["restart_count"] == 1 and second["resumed_from"] == str(out / "checkpoints" / f"step-{resumed}")
    assert f"resumed from runs/{ddp_ref.name}/checkpoints/step-{resumed} at step {resumed} (torchrun restart 1 of 1)" in stdout
    # the failed attempt's survivor tracebacks ("Connection closed by peer") are one note; they stay in torchrun.log
    assert stderr.count("note: local rank 1 was killed by SIGKILL (signal 9); torchrun restarted the ranks (launch.max_restarts), "
                        "which resume from the newest complete checkpoint") == 1, stderr[-4000:]
    assert "Traceback" not in stderr and "Connection closed by peer" not in stderr
    after = [r["step"] for r in records[records.index(second):] if r["event"] == "step"]
    assert after == list(range(resumed + 1, 31)) and records[-1]["event"] == "end"
    expected, got = losses(metrics(ddp_ref.out)), losses(records)
    assert got == expected  # both attempts' steps, the re-run ones last: bit for bit
    print(f"killed rank 1 (pid {workers[1]}) {killed_at:.1f} s after start, at step {before[-1]}; restarted from step "
          f"{resumed}; losses {resumed + 1}-30 equal the uninterrupted run's, e.g. step 30: {got[30]!r}")
    assert_same_dcp_checkpoint(ddp_ref.checkpoint(30), out / "checkpoints" / "step-30", tmp_path)


# -- preemption: SIGTERM -------------------------------------------------------------------------

@FSDP2_REF
def test_sigterm_checkpoints_exits_75_and_the_next_run_resumes_exactly(fsdp2_ref, tmp_path):
    """SIGTERM to the process group of `fp8launch run` (FSDP2 + FP8); then the same command again;
    then train.resume = "never" refuses to overwrite the run. ~18 s."""
    spec = write_spec(tmp_path, fsdp2_ref.name, train__model=MODEL, train__steps=20, train__checkpoint_every=10,
                      train__keep_checkpoints=3, **FSDP2_FP8)
    out = tmp_path / "runs" / fsdp2_ref.name
    proc = start_group(tmp_path, "run", str(spec))
    try:
        logged = wait_for_step(proc, out, 3)
        os.killpg(proc.pid, signal.SIGTERM)  # fp8launch and torchrun both get it; torchrun passes it to the workers
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
        stop_s = time.monotonic() - t0
    finally:
        stop_tree(proc)
    assert proc.returncode == 75, f"exit {proc.returncode}\n{stdout[-2000:]}\n{stderr[-4000:]}"
    records = metrics(out)
    stopped = records[-1]["step"]
    assert records[-1]["event"] == "step" and logged <= stopped < 20  # no end record: the run did not end
    checkpoint = out / "checkpoints" / f"step-{stopped}"
    marker = read_marker(str(checkpoint))
    assert marker is not None and (marker["step"], marker["world_size"]) == (stopped, 2)
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]  # nothing half-written
    assert stderr.count(f"preempted: SIGTERM after step {stopped} of 20; every rank stopped after it and checkpoint "
                        f"{checkpoint} is complete; run the same command again") == 1
    expected = losses(metrics(fsdp2_ref.out))
    assert losses(records) == {s: expected[s] for s in range(1, stopped + 1)}

    r, seconds = run(tmp_path, "run", str(spec))
    assert r.returncode == 0, output_of(r)
    assert f"resumed from runs/{fsdp2_ref.name}/checkpoints/step-{stopped} at step {stopped}\n" in r.stdout
    records = metrics(out)
    first, second = starts(records)
    assert second["start_step"] == stopped and second["resumed_from"] == str(checkpoint) and second["restart_count"] == 0
    assert [r["step"] for r in records[records.index(second):] if r["event"] == "step"] == list(range(stopped + 1, 21))
    got = losses(records)
    assert got == expected  # steps 1-20 across both runs, bit for bit
    assert_same_dcp_checkpoint(fsdp2_ref.checkpoint(20), out / "checkpoints" / "step-20", tmp_path)
    print(f"SIGTERM at step {stopped}: exit 75 {stop_s:.1f} s after the signal; resumed and finished in {seconds:.1f} s; "
          f"losses {stopped + 1}-20 equal the uninterrupted run's, e.g. step 20: {got[20]!r}")

    r, _ = run(tmp_path, "run", str(spec), "--set", "train.resume=never")
    assert r.returncode == 2, output_of(r)
    assert r.stderr.count(f'error: train.resume: "never" starts a fresh run, but {out / "checkpoints"} already holds') == 1
    assert 'fix: set train.resume = "auto" to continue that run, or give this run a new train.output_dir' in r.stderr
    assert len(starts(metrics(out))) == 2  # refused before anything started


# -- non-finite losses ---------------------------------------------------------------------------

NAN_MODEL = '''\
"""A user model factory for the tests: builtin llama-debug (2 layers) whose logits turn NaN on
rank 1 only, on the forward calls (one per step here) listed in NAN_AT."""
import torch.distributed as dist

from launcher.train.models.llama import Llama, parse_builtin

NAN_AT = set({nan_at})


class NaNOnRank1(Llama):
    def __init__(self):
        super().__init__(parse_builtin("{model}"))
        self.calls = 0

    def forward(self, tokens):
        self.calls += 1
        logits = super().forward(tokens)
        return logits * float("nan") if self.calls in NAN_AT and dist.get_rank() == 1 else logits


def build():
    return NaNOnRank1()
'''


def _nan_run(tmp_path: Path, name: str, nan_at: set[int], **keys):
    (tmp_path / "nan_model.py").write_text(NAN_MODEL.format(nan_at=sorted(nan_at), model=MODEL))
    spec = write_spec(tmp_path, name, train__model="py:nan_model:build", **keys)
    r, seconds = run(tmp_path, "run", str(spec))
    print(f"{name}: {seconds:.1f} s")
    return r, metrics(tmp_path / "runs" / name)


def test_nan_stop_stops_every_rank_naming_the_step_the_checkpoint_and_the_causes(tmp_path):
    """NaN on rank 1 at step 5 (FSDP2 + torchao tensorwise); rank 0's own loss was finite. ~7 s."""
    r, records = _nan_run(tmp_path, "nan-stop", {5}, train__steps=8, train__checkpoint_every=2, **FSDP2_FP8)
    assert r.returncode == 4, output_of(r)
    checkpoint = tmp_path / "runs" / "nan-stop" / "checkpoints" / "step-4"
    errors = [line for line in r.stderr.splitlines() if "non-finite" in line]
    # One line, printed by rank 0 (no "[rank 1]" prefix): rank 0 stopped on its own, at the same step.
    assert len(errors) == 1 and errors[0].startswith("error: step 5: non-finite loss nan, gradient norm nan; every rank stopped "
                                                     'before the update (train.on_nan = "stop"); '
                                                     f"last complete checkpoint: {checkpoint}; likely causes (an overflow in FP8 e4m3 "
                                                     "with tensorwise scaling"), errors
    assert 'precision.torchao.recipe = "rowwise"' in errors[0]
    assert "]: Traceback" not in r.stderr  # no worker died of an exception ([rankN]: ...); torchrun prints its own
    assert [r["step"] for r in records if r["event"] == "step"] == [1, 2, 3, 4]
    assert not any(r["event"] == "end" for r in records)
    assert read_marker(str(checkpoint))["step"] == 4


def test_nan_skip_counts_skipped_steps_and_stops_after_the_cap(tmp_path):
    """DDP bf16, on_nan = "skip": NaN at step 3 (skipped, training goes on), then at steps 6-10 (the cap). ~5 s."""
    bad = {3, *range(6, 6 + MAX_CONSECUTIVE_SKIPS)}
    r, records = _nan_run(tmp_path, "nan-skip", bad, train__steps=14, train__on_nan="skip", train__checkpoint_every=0,
                          distributed__strategy="ddp", precision__mode="bf16")
    last_bad = 5 + MAX_CONSECUTIVE_SKIPS
    assert r.returncode == 4, output_of(r)
    errors = [line for line in r.stderr.splitlines() if "non-finite" in line]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: step {last_bad}: non-finite loss nan, gradient norm nan for {MAX_CONSECUTIVE_SKIPS} steps in a row, the most "
        f'train.on_nan = "skip" steps over (MAX_CONSECUTIVE_SKIPS); every rank stopped, {len(bad)} steps skipped in all; '
        "last complete checkpoint: none yet; likely causes (the learning rate"), errors
    stepped = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in stepped] == list(range(1, last_bad))
    assert [r["loss"] is None for r in stepped] == [s in bad for s in range(1, last_bad)]
    assert [r["skipped_steps"] for r in stepped] == [sum(1 for b in bad if b <= s) for s in range(1, last_bad)]
    assert all(r["loss"] > 0 for r in stepped if r["step"] not in bad)
