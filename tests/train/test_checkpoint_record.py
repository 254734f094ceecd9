"""The record of a checkpoint's files (launcher/targets/checkpoint_record.py) and the check before resuming: real
checkpoints saved in this process (a world of one), then damaged the ways disks and people damage them. Each
test takes well under a second."""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path

import pytest
import torch
from torch import nn

from launcher.errors import EXIT_INVALID, InputError
from launcher.targets import checkpoint_record as record
from launcher.train.checkpoint import MARKER, CheckpointManager, read_marker

from ._engine_setup import gloo_world

SHARD = "model/__0_0.distcp"


@pytest.fixture
def world():
    with gloo_world():
        yield


def manager(tmp_path: Path, keep: int = 3) -> CheckpointManager:
    return CheckpointManager(str(tmp_path / "run"), keep=keep, strategy="ddp")


def save(m: CheckpointManager, step: int) -> str:
    torch.manual_seed(step)
    model = nn.Linear(8, 8)
    return m.save(step, model=model, optimizer=torch.optim.AdamW(model.parameters()), data_state={"batches": step})


def two(tmp_path: Path, **kw) -> tuple[CheckpointManager, str, str]:
    m = manager(tmp_path, **kw)
    return m, save(m, 1), save(m, 2)


def damage(path: str, name: str, how: str) -> None:
    """Damage file `name` of checkpoint `path` the way `how` says."""
    target = Path(path, name)
    data = bytearray(target.read_bytes()) if target.exists() else bytearray()
    if how == "truncate":
        target.write_bytes(data[:1024])
    elif how == "flip":
        data[len(data) // 2] ^= 0x01  # one bit, in the middle: the size stays
        target.write_bytes(bytes(data))
    elif how == "delete":
        target.unlink()
    elif how == "garbage":
        target.write_text('{"step": 2, "files": ')


# -- the record ----------------------------------------------------------------------------------

def test_a_save_records_every_file_with_its_size_and_crc32(tmp_path, world):
    m = manager(tmp_path)
    path = save(m, 3)
    files = read_marker(path)["files"]
    on_disk = sorted(str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file() and p.name != MARKER)
    assert list(files) == on_disk
    assert {"model/.metadata", SHARD, "optim/.metadata", "optim/__0_0.distcp", "rank-00000.pt"} == set(files)
    for name, entry in files.items():
        data = Path(path, name).read_bytes()
        assert entry == {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}, name


def test_each_rank_describes_the_files_it_wrote_and_rank_0_the_rest():
    names = ["model/.metadata", "model/__0_0.distcp", "model/__1_0.distcp", "optim/__1_0.distcp", "rank-00000.pt",
             "rank-00001.pt", "deepspeed/ds/zero_pp_rank_1_mp_rank_00_optim_states.pt",
             "deepspeed/ds/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "deepspeed/ds/mp_rank_00_model_states.pt",
             "deepspeed/zero_to_fp32.py", "deepspeed/latest"]
    assert {n: record.owner(n, 2) for n in names} == {
        "model/.metadata": None, "model/__0_0.distcp": 0, "model/__1_0.distcp": 1, "optim/__1_0.distcp": 1,
        "rank-00000.pt": 0, "rank-00001.pt": 1, "deepspeed/ds/zero_pp_rank_1_mp_rank_00_optim_states.pt": 1,
        "deepspeed/ds/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 0, "deepspeed/ds/mp_rank_00_model_states.pt": None,
        "deepspeed/zero_to_fp32.py": None, "deepspeed/latest": None}
    assert record.owner("rank-00001.pt", 1) is None  # a rank beyond the world (a stray file): rank 0 describes it


def test_the_check_is_split_across_ranks_by_bytes_and_covers_every_file_once():
    files = {f"f{i}": {"bytes": b, "crc32": "0"} for i, b in enumerate([900, 500, 400, 300, 100, 100, 50])}
    shares = [record.share(files, r, 3) for r in range(3)]
    assert sorted(n for s in shares for n in s) == sorted(files)
    assert shares == [["f0"], ["f1", "f4", "f5", "f6"], ["f2", "f3"]]  # biggest first, each to the least loaded rank
    assert [sum(files[n]["bytes"] for n in s) for s in shares] == [900, 750, 700]


# -- resuming: the newest intact one, one line for each skipped ---------------------------------------

@pytest.mark.parametrize("name, how, why", [
    (SHARD, "truncate", r"model/__0_0\.distcp is 1,024 bytes, the record says [\d,]+"),
    (SHARD, "flip", r"model/__0_0\.distcp does not match its checksum \(crc32 [0-9a-f]{8}, the record says [0-9a-f]{8}\)"),
    ("optim/.metadata", "delete", r"optim/\.metadata is missing"),
    ("rank-00000.pt", "truncate", r"rank-00000\.pt is 1,024 bytes, the record says [\d,]+"),
    (MARKER, "delete", r"no COMPLETE\.json \(a save that did not finish, or a damaged checkpoint\)"),
    (MARKER, "garbage", r"COMPLETE\.json is unreadable \(Expecting value: line 1 column 22 \(char 21\)\)"),
], ids=["truncated-shard", "flipped-bit", "deleted-metadata", "truncated-rank-file", "no-marker", "garbage-marker"])
def test_resume_skips_a_damaged_newest_checkpoint_with_one_line_and_takes_the_one_before(tmp_path, world, name, how, why):
    m, older, newest = two(tmp_path)
    damage(newest, name, how)
    choice = m.choose_resume("auto")
    assert choice.path == older and not choice.unchecked
    (line,) = choice.notes()
    assert re.fullmatch(f"{re.escape(newest)}: {why}; skipped", line), line
    assert m.load(choice.path, model=nn.Linear(8, 8)).data_state == {"batches": 1}


def test_every_damaged_file_counts_and_the_line_names_the_first(tmp_path, world):
    m, older, newest = two(tmp_path)
    for name in ("rank-00000.pt", SHARD, "optim/__0_0.distcp"):
        damage(newest, name, "truncate")
    (line,) = m.choose_resume("auto").notes(lambda p: os.path.relpath(p, m.dir))
    assert line.startswith("step-2: model/__0_0.distcp is 1,024 bytes, the record says ")
    assert line.endswith(" (and 2 more files); skipped")


def test_none_intact_exits_2_naming_each_and_why(tmp_path, world):
    m, older, newest = two(tmp_path)
    damage(newest, SHARD, "flip")
    damage(older, MARKER, "garbage")
    with pytest.raises(InputError) as e:
        m.choose_resume("auto")
    assert e.value.exit_code == EXIT_INVALID and "\n" not in str(e.value)
    assert str(e.value).startswith(f"error: train.resume: no checkpoint in {m.dir} is intact: step-2: model/__0_0.distcp does "
                                   "not match its checksum (crc32 ")
    assert str(e.value).endswith("; step-1: COMPLETE.json is unreadable (Expecting value: line 1 column 22 (char 21)); "
                                 f"fix: restore one from a copy, or move {m.dir} aside to start this run afresh")


def test_a_damaged_checkpoint_named_in_train_resume_exits_2_naming_why(tmp_path, world):
    m, older, newest = two(tmp_path)
    damage(newest, "optim/__0_0.distcp", "delete")
    with pytest.raises(InputError) as e:
        m.choose_resume(newest)
    assert str(e.value) == (f"error: train.resume: {newest} is damaged: optim/__0_0.distcp is missing; fix: name another checkpoint, "
                            f'or its checkpoints folder {m.dir} (its newest intact one), or set train.resume = "auto"')
    assert m.choose_resume(str(tmp_path / "run")).path == older  # the run's folder: its newest intact one, as "auto"
    assert m.choose_resume(older).path == older


def test_a_checkpoint_without_a_record_is_read_unchecked_with_a_note(tmp_path, world):
    m, older, newest = two(tmp_path)
    marker = read_marker(newest)
    del marker["files"]  # as fp8launch wrote them before checkpoints recorded their files
    Path(newest, MARKER).write_text(json.dumps(marker))
    damage(newest, "optim/__0_0.distcp", "flip")  # nothing to tell it by
    choice = m.choose_resume("auto")
    assert choice.path == newest and choice.unchecked
    assert choice.notes() == [f"{newest} has no record of its files (written before checkpoints recorded them): read without "
                              "checking them"]


def test_a_load_that_fails_anyway_names_the_file_and_its_error_not_the_model(tmp_path, world):
    """Unchecked (no record), a file cut short: the error is the file's, and the fix names the checkpoint before."""
    m, older, newest = two(tmp_path)
    marker = read_marker(newest)
    del marker["files"]
    Path(newest, MARKER).write_text(json.dumps(marker))
    damage(newest, SHARD, "truncate")
    with pytest.raises(InputError) as e:
        m.load(m.resolve_resume("auto"), model=nn.Linear(8, 8))
    assert str(e.value) == (f"error: train.resume: {newest}: model/__0_0.distcp cannot be read (EOFError); "
                            f'fix: resume from an older checkpoint (train.resume = "{older}")')
    damage(newest, SHARD, "delete")
    damage(newest, "rank-00000.pt", "truncate")
    with pytest.raises(InputError, match=rf"^error: train.resume: {newest}: rank-00000\.pt cannot be read \((OSError|RuntimeError): "):
        m.load(newest, model=nn.Linear(8, 8))


def test_a_resumed_run_never_prunes_the_checkpoint_it_just_saved_below_a_damaged_newer_one(tmp_path, world):
    m = manager(tmp_path)
    save(m, 2)
    damage(save(m, 4), SHARD, "flip")
    assert m.choose_resume("auto").path == m.step_dir(2)
    m.keep = 1
    save(m, 3)  # the resumed run's next save, below the damaged step-4 that keep = 1 would count as the newest
    assert sorted(os.listdir(m.dir)) == ["step-3", "step-4"]
    assert m.choose_resume("auto").path == m.step_dir(3)


def test_deepspeed_reads_that_fail_name_the_file_and_a_missing_one_stays_deepspeeds_own(tmp_path):
    """DeepSpeed's own checkpoint engine (torch.load of its files) under _naming_reads, as CheckpointManager.load
    runs DeepSpeed's load_checkpoint."""
    pytest.importorskip("deepspeed")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from types import SimpleNamespace

    from launcher.train.checkpoint.deepspeed import _naming_reads
    from launcher.train.engines.deepspeed_engine import without_mlflow

    with without_mlflow():
        from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    folder = tmp_path / "step-2" / "deepspeed" / "ds"
    folder.mkdir(parents=True)
    states = folder / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(64, 64)}}, states)
    engine = SimpleNamespace(checkpoint_engine=TorchCheckpointEngine())
    with _naming_reads(engine, str(tmp_path / "step-2")):
        assert torch.equal(engine.checkpoint_engine.load(str(states))["module"]["w"], torch.ones(64, 64))
        states.write_bytes(states.read_bytes()[:1024])
        with pytest.raises(record.UnreadableFile) as e:
            engine.checkpoint_engine.load(str(states))
        assert str(e.value).startswith("deepspeed/ds/mp_rank_00_model_states.pt cannot be read (")
        with pytest.raises(FileNotFoundError):  # DeepSpeed looks for optional files: not a damaged one
            engine.checkpoint_engine.load(str(folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    assert "load" not in vars(engine.checkpoint_engine)  # its own method again
