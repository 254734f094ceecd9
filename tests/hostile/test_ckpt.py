"""Hostile cases for checkpoints: `fp8launch export` of a run whose checkpoints were damaged after they were
written (cut short, a flipped bit, a file or the marker gone, the marker garbage) or are absent. Each export
checks the record of the files it reads the weights from (COMPLETE.json's "files"), skips a damaged newest
checkpoint with one line and exports the newest intact one; none intact, or a damaged --step: exit 2, one line.

The checkpoints are real: a tiny run's (builtin:llama-debug?layers=2, a checkpoint after each of 2 optimizer steps),
saved once in this process by the CheckpointManager runs use, copied into each case's folder and damaged there. The
exports run in-process.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import main
from tests.hostile.corpus import Case, check
from tests.support import write_toml_spec

MODEL = "builtin:llama-debug?layers=2"
SHARD = "model/__0_0.distcp"
CHECKSUM = r"does not match its checksum \(crc32 [0-9a-f]{8}, the record says [0-9a-f]{8}\)"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A run's output_dir as `fp8launch run` leaves it: plan/plan.json and checkpoints/step-1, step-2 of its model,
    saved by the CheckpointManager a run uses, between two AdamW steps (in a world of one, here: ~1.5 s)."""
    import torch

    from launcher.commands.run import plan_for_run, write_plan
    from launcher.train.checkpoint import CheckpointManager
    from launcher.train.models import build_model
    from tests.train._engine_setup import gloo_world

    folder = tmp_path_factory.mktemp("ckpt-run")
    out = folder / "run"
    values = {"version": 1, "name": "tiny", "launch.device": "cpu", "distributed.procs_per_node": 1,
              "distributed.strategy": "ddp", "train.model": MODEL, "train.steps": 2, "train.output_dir": str(out)}
    write_plan(plan_for_run(str(write_toml_spec(folder / "tiny.toml", values))))
    torch.manual_seed(0)
    model = build_model(MODEL, str(folder))
    optimizer = torch.optim.AdamW(model.parameters())
    with gloo_world():
        checkpoints = CheckpointManager(str(out), keep=3, strategy="ddp")
        for step in (1, 2):
            model(torch.randint(0, 96, (2, 16))).float().pow(2).mean().backward()
            optimizer.step()
            checkpoints.save(step, model=model, optimizer=optimizer)
    return out


def damaged(run: Path, to: Path, damages: tuple[tuple[str, str], ...]) -> None:
    """A copy of `run` at `to`, then each (path under checkpoints/, how) done to it."""
    shutil.copytree(run, to)
    for name, how in damages:
        target = to / "checkpoints" / name
        if how == "truncate":
            target.write_bytes(target.read_bytes()[:1024])
        elif how == "flip":
            data = bytearray(target.read_bytes())
            data[len(data) // 2] ^= 0x01
            target.write_bytes(bytes(data))
        elif how == "garbage":
            target.write_text("{")
        elif how == "delete":
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        elif how == "unrecord":  # as checkpoints were written before they recorded their files
            marker = json.loads(target.read_text())
            del marker["files"]
            target.write_text(json.dumps(marker))


def case(id: str, argv: tuple[str, ...], line: str, damages: tuple[tuple[str, str], ...], lines: int = 1):
    return pytest.param(Case(id=id, argv=("export", "{dir}/run", *argv), code=2, line=line, absent=("run/export",), lines=lines),
                        damages, id=id)


CASES = [
    case("export-every-checkpoint-damaged", (),
         r"^error: RUN_DIR: no checkpoint in \S+/run/checkpoints is intact: step-2: model/__0_0\.distcp is 1,024 bytes, the record "
         rf"says [\d,]+; step-1: model/__0_0\.distcp {CHECKSUM}; fix: restore one from a copy, or export another run$",
         (("step-2/" + SHARD, "truncate"), ("step-1/" + SHARD, "flip"))),
    case("export-markers-gone-or-garbage", (),
         r"^error: RUN_DIR: no checkpoint in \S+ is intact: step-2: no COMPLETE\.json \(a save that did not finish, or a damaged "
         r"checkpoint\); step-1: COMPLETE\.json is unreadable \(Expecting property name enclosed in double quotes: .*\); fix: ",
         (("step-2/COMPLETE.json", "delete"), ("step-1/COMPLETE.json", "garbage"))),
    case("export-no-checkpoints", (), r"^error: RUN_DIR: \S+/run/checkpoints holds no complete checkpoint .*; fix: export a run",
         (("", "delete"),)),
    case("export-step-of-a-damaged-checkpoint", ("--step", "2"),
         r"^error: --step: \S+/run/checkpoints/step-2 is damaged: model/\.metadata is missing; fix: leave out --step to export "
         r"the newest intact checkpoint, or restore this one from a copy$",
         (("step-2/model/.metadata", "delete"),)),
    # no record to check it by: the note, the export's header, then the read itself names the file (no traceback, nothing left)
    case("export-unrecorded-checkpoint-cut-short", ("--format", "torch"),
         r"^error: RUN_DIR: \S+/run/checkpoints/step-2: model/__0_0\.distcp cannot be read \(EOFError\); fix: export another "
         r"checkpoint with --step, or restore this one from a copy$",
         (("step-2/COMPLETE.json", "unrecord"), ("step-2/" + SHARD, "truncate")), lines=3),
]


@pytest.mark.parametrize("case, damages", CASES)
def test_case(case, damages, tiny_run, tmp_path):
    check(dataclasses.replace(case, setup=lambda folder: damaged(tiny_run, folder / "run", damages)), tmp_path)


def test_export_skips_a_damaged_newest_checkpoint_with_one_line_and_exports_the_one_before(tiny_run, tmp_path):
    run = tmp_path / "run"
    damaged(tiny_run, run, (("step-2/" + SHARD, "flip"),))
    r = CliRunner().invoke(main, ["export", str(run), "--format", "torch", "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {run}/checkpoints/step-2: {SHARD} does not match its checksum")
    assert warnings[0].endswith("; skipped") and "Traceback" not in r.stderr
    assert json.loads((tmp_path / "out" / "fp8launch-export.json").read_text())["step"] == 1


def test_export_checks_only_the_files_it_reads_the_weights_from(tiny_run, tmp_path):
    """A damaged optimizer state does not stop an export of the weights beside it."""
    run = tmp_path / "run"
    damaged(tiny_run, run, (("step-2/optim/__0_0.distcp", "truncate"), ("step-2/rank-00000.pt", "delete")))
    r = CliRunner().invoke(main, ["export", str(run), "--format", "torch", "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.stderr
    assert "warning" not in r.stderr
    assert json.loads((tmp_path / "out" / "fp8launch-export.json").read_text())["step"] == 2
