"""Output folders: fp8launch never removes or overwrites a file it did not write, never writes or deletes through a link
under the folder it was given, and a place it cannot write is one line, not a traceback (plan, run, export, init,
import, bench, tune). Each case also checks that nothing outside its folder changed (a sentinel folder beside it, the
target of every link here) and that a refused command left its folder byte for byte as it was."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import main
from tests.hostile.corpus import Case, check, snapshot

SPEC = 'version = 1\nname = "t"\n[launch]\ndevice = "cpu"\n'
"""fsdp2 (the default strategy): writes plan.json, torchrun.sh, fsdp2.json; its run folder is runs/t."""
MINE = "the user's own file\n"
SENTINEL = "outside --out: must never change\n"
RECORD = ".fp8launch-files.json"
NOT_IN_RECORD = r"was not written by fp8launch \(it is not in \.fp8launch-files\.json\)"
NO_RECORD = (r"was not written by fp8launch \(the folder has no \.fp8launch-files\.json, and no plan\.json of fp8launch's that "
             r"generates it\)")
FORCE = r"and the plan writes that file; fix: move it away, or pass --force to overwrite it$"
KEPT = r"; left as it is$"


def _outside(folder: Path) -> Path:
    return folder.parent / "outside"


def planned(*sets: str, legacy: bool = False, then=None):
    """A setup: `fp8launch plan s.toml --out out` as a user ran it before (with `sets`); `legacy`: as a version before the
    record wrote it (no record, another fp8launch_version in plan.json); `then(folder)` afterwards."""

    def setup(folder: Path) -> None:
        old = os.getcwd()
        os.chdir(folder)
        try:
            args = ["plan", "s.toml", "--out", "out", *[a for s in sets for a in ("--set", s)]]
            result = CliRunner().invoke(main, args, catch_exceptions=False)
            assert result.exit_code == 0, result.stderr
        finally:
            os.chdir(old)
        if legacy:
            (folder / "out" / "t" / RECORD).unlink()
            plan = folder / "out" / "t" / "plan.json"
            plan.write_text(plan.read_text().replace('"fp8launch_version": "', '"fp8launch_version": "0.0.1-'))
        if then is not None:
            then(folder)

    return setup


def link(name: str, to: str):
    """A setup: a symbolic link `name` (in the case's folder) to `to`, relative to the case's folder's parent."""

    def setup(folder: Path) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(folder.parent / to, path.parent), path)

    return setup


def both(*setups):
    def setup(folder: Path) -> None:
        for s in setups:
            s(folder)

    return setup


def fifo(name: str):
    def setup(folder: Path) -> None:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(folder / name)

    return setup


def read_only(*names: str):
    """A setup: `names` made read-only (folders 0o555, files 0o444). Root ignores modes: such cases run as a process in
    a user namespace with another uid (`unprivileged`)."""

    def setup(folder: Path) -> None:
        for name in names:
            path = folder / name
            if name.endswith("/"):
                path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, 0o555 if path.is_dir() else 0o444)

    return setup


def fake_run(folder: Path) -> None:
    """A run folder `run/` as `fp8launch run` leaves it: plan/plan.json and a complete checkpoint of step 1 (export checks
    its --out before it reads a weight)."""
    planned()(folder)
    (folder / "run").mkdir()
    os.replace(folder / "out" / "t", folder / "run" / "plan")
    (folder / "out").rmdir()
    (folder / "run" / "checkpoints" / "step-1").mkdir(parents=True)
    (folder / "run" / "checkpoints" / "step-1" / "COMPLETE.json").write_text('{"step": 1}\n')


EXPORT = {"fp8launch-export.json": json.dumps({"format": "hf", "files": ["fp8launch-export.json", "model.safetensors"]}) + "\n",
          "model.safetensors": "weights\n"}


def _outside_export(folder: Path) -> None:
    for name, text in EXPORT.items():
        (_outside(folder) / name).write_text(text)


GENERATED_BY_NAME = {"deepspeed.json": "distributed.strategy=deepspeed", "accelerate.yaml": "export.accelerate=true",
                     "slurm.sbatch": "launch.launcher=slurm"}

PLAN = [
    # the case: a file of a generated name the plan does not write now, whoever's folder it is in
    *[Case(id=f"plan-keeps-the-users-{name}-{where}", argv=("plan", "s.toml", "--out", "out"), code=0,
           line=rf"^note: out/t/{name.replace('.', chr(92) + '.')} {why}{KEPT}",
           files={"s.toml": SPEC, f"out/t/{name}": MINE}, setup=setup)
      for name in GENERATED_BY_NAME
      for where, why, setup in [("in-a-recorded-folder", NOT_IN_RECORD, planned()),
                                ("in-a-folder-from-before-the-record", NO_RECORD, planned(legacy=True)),
                                ("in-a-new-folder", NO_RECORD, None)]],
    *[Case(id=f"plan-refuses-to-overwrite-the-users-{name}", argv=("plan", "s.toml", "--out", "out", "--set", sets), code=2,
           line=rf"^error: out/t/{name.replace('.', chr(92) + '.')} {NOT_IN_RECORD}, {FORCE}",
           files={"s.toml": SPEC, f"out/t/{name}": MINE}, setup=planned())
      for name, sets in GENERATED_BY_NAME.items()],
    Case(id="plan-refuses-to-overwrite-the-users-file-in-a-folder-from-before-the-record",
         argv=("plan", "s.toml", "--out", "out", "--set", "distributed.strategy=deepspeed"), code=2,
         line=rf"^error: out/t/deepspeed\.json {NO_RECORD}, {FORCE}",
         files={"s.toml": SPEC, "out/t/deepspeed.json": MINE}, setup=planned(legacy=True)),
    Case(id="plan-refuses-to-overwrite-a-hand-edit", argv=("plan", "s.toml", "--out", "out", "--set", "train.steps=7"), code=2,
         line=rf"^error: out/t/fsdp2\.json changed since fp8launch wrote it \(its bytes are not the ones \.fp8launch-files\.json "
              rf"records\), {FORCE}",
         files={"s.toml": SPEC}, kept={"s.toml": SPEC, "out/t/fsdp2.json": "{}\n"},
         setup=planned(then=lambda f: (f / "out/t/fsdp2.json").write_text("{}\n"))),
    Case(id="plan-keeps-a-hand-edited-file-it-no-longer-writes",
         argv=("plan", "s.toml", "--out", "out", "--set", "distributed.strategy=ddp"), code=0,
         line=r"^note: out/t/fsdp2\.json changed since fp8launch wrote it .*; left as it is$",
         files={"s.toml": SPEC}, kept={"s.toml": SPEC, "out/t/fsdp2.json": "{}\n"},
         setup=planned(then=lambda f: (f / "out/t/fsdp2.json").write_text("{}\n"))),
    Case(id="plan-keeps-the-users-file-beside-an-unreadable-record", argv=("plan", "s.toml", "--out", "out"), code=0,
         line=r"^note: out/t/slurm\.sbatch cannot be told to be fp8launch's: \.fp8launch-files\.json there is not a record "
              r"fp8launch can read \(JSONDecodeError\); left as it is$",
         files={"s.toml": SPEC, "out/t/slurm.sbatch": MINE}, setup=planned(then=lambda f: (f / "out/t" / RECORD).write_text("{"))),
    Case(id="plan-check-with-the-users-file-is-up-to-date", argv=("plan", "s.toml", "--out", "out", "--check"), code=0, lines=2,
         line=r"^up to date: 1 spec checked\.$", files={"s.toml": SPEC, "out/t/deepspeed.json": MINE}, setup=planned()),
    Case(id="plan-check-names-the-file-plan-would-refuse", lines=8,
         argv=("plan", "s.toml", "--out", "out", "--check", "--set", "distributed.strategy=deepspeed"), code=1,
         line=r"^drift found: 1 spec checked\.$", files={"s.toml": SPEC, "out/t/deepspeed.json": MINE}, setup=planned()),
    Case(id="plan-several-specs-write-nothing-when-one-folder-refuses",
         argv=("plan", "s.toml", "u.toml", "--out", "out"), code=2, line=rf"^error: out/u/deepspeed\.json {NO_RECORD}, {FORCE}",
         files={"s.toml": SPEC, "u.toml": SPEC.replace('"t"', '"u"') + '[distributed]\nstrategy = "deepspeed"\n',
                "out/u/deepspeed.json": MINE}, absent=("out/t",)),
    # links: never followed to write or delete
    *[Case(id=f"plan-refuses-a-linked-output-folder{'-check' if check_ else ''}",
           argv=("plan", "s.toml", "--out", "out", *(["--check"] if check_ else [])), code=2,
           line=r"^error: out/t is a symbolic link \(to \.\./\.\./outside\), and fp8launch writes into no folder through a link; "
                r"fix: remove the link \(fp8launch then makes the folder\), or point --out elsewhere$",
           files={"s.toml": SPEC}, setup=link("out/t", "outside")) for check_ in (False, True)],
    Case(id="plan-refuses-a-dangling-linked-output-folder", argv=("plan", "s.toml", "--out", "out"), code=2,
         line=r"^error: out/t is a symbolic link \(to \.\./\.\./outside/nothing\), and fp8launch writes into no folder through a link",
         files={"s.toml": SPEC}, setup=link("out/t", "outside/nothing")),
    Case(id="plan-refuses-a-link-at-a-file-it-writes", argv=("plan", "s.toml", "--out", "out"), code=2,
         line=rf"^error: out/t/plan\.json is a symbolic link \(to \.\./\.\./\.\./outside/sentinel\), which fp8launch never writes "
              rf"through, {FORCE}",
         files={"s.toml": SPEC}, setup=link("out/t/plan.json", "outside/sentinel")),
    Case(id="plan-refuses-a-linked-record", argv=("plan", "s.toml", "--out", "out"), code=2,
         line=rf"^error: out/t/\.fp8launch-files\.json is a symbolic link .*, {FORCE}",
         files={"s.toml": SPEC}, setup=link("out/t/.fp8launch-files.json", "outside/sentinel")),
    Case(id="plan-keeps-a-link-at-a-name-it-no-longer-writes", argv=("plan", "s.toml", "--out", "out"), code=0,
         line=r"^note: out/t/deepspeed\.json is a symbolic link \(to \.\./\.\./\.\./outside/sentinel\), which fp8launch never "
              r"writes through; left as it is$",
         files={"s.toml": SPEC}, setup=link("out/t/deepspeed.json", "outside/sentinel")),
    # paths of the wrong kind: exit 2, one line
    Case(id="plan-out-is-a-file", argv=("plan", "s.toml", "--out", "outfile"), code=2,
         line=r"^error: outfile is a file, not a folder, so fp8launch cannot make outfile/t/; fix: move it away, or point --out "
              r"elsewhere$", files={"s.toml": SPEC, "outfile": MINE}),
    Case(id="plan-out-is-under-a-file", argv=("plan", "s.toml", "--out", "outfile/gen"), code=2,
         line=r"^error: outfile is a file, not a folder, so fp8launch cannot make outfile/gen/t/", files={"s.toml": SPEC, "outfile": MINE}),
    Case(id="plan-out-is-a-dangling-link", argv=("plan", "s.toml", "--out", "out"), code=2,
         line=r"^error: out is a symbolic link to nothing \(\.\./outside/nothing\), not a folder, so fp8launch cannot make out/t/",
         files={"s.toml": SPEC}, setup=link("out", "outside/nothing")),
    Case(id="plan-output-folder-is-a-file", argv=("plan", "s.toml", "--out", "out"), code=2,
         line=r"^error: out/t is a file, not a folder; fix: move it away, or point --out elsewhere$",
         files={"s.toml": SPEC, "out/t": MINE}),
    *[Case(id=f"plan-a-folder-at-a-file-it-writes{'-force' if force else ''}",
           argv=("plan", "s.toml", "--out", "out", *(["--force"] if force else [])), code=2,
           line=r"^error: out/t/plan\.json is a folder, where the plan writes a file, and fp8launch never removes a folder; fix: move it "
                r"away, or point --out elsewhere$", files={"s.toml": SPEC, "out/t/plan.json/mine.txt": MINE}) for force in (False, True)],
    Case(id="plan-a-fifo-at-a-file-it-writes", argv=("plan", "s.toml", "--out", "out"), code=2, process=True,
         line=rf"^error: out/t/plan\.json is not a regular file, {FORCE}", files={"s.toml": SPEC}, setup=fifo("out/t/plan.json")),
    Case(id="plan-keeps-a-fifo-at-a-name-it-no-longer-writes", argv=("plan", "s.toml", "--out", "out"), code=0, process=True,
         line=r"^note: out/t/slurm\.sbatch is not a regular file; left as it is$", files={"s.toml": SPEC},
         setup=fifo("out/t/slurm.sbatch")),
]

RUN = [
    Case(id="run-keeps-the-users-file-in-its-plan-folder", argv=("run", "s.toml", "--dry-run"), code=0,
         line=rf"^note: runs/t/plan/deepspeed\.json {NO_RECORD}{KEPT}", files={"s.toml": SPEC, "runs/t/plan/deepspeed.json": MINE}),
    Case(id="run-refuses-to-overwrite-the-users-file-in-its-plan-folder",
         argv=("run", "s.toml", "--dry-run", "--set", "distributed.strategy=deepspeed"), code=2,
         line=rf"^error: runs/t/plan/deepspeed\.json {NO_RECORD}, {FORCE}", files={"s.toml": SPEC, "runs/t/plan/deepspeed.json": MINE}),
    Case(id="run-refuses-a-linked-plan-folder", argv=("run", "s.toml", "--dry-run"), code=2,
         line=r"^error: runs/t/plan is a symbolic link \(to \.\./\.\./\.\./outside\), and fp8launch writes into no folder through a "
              r"link; fix: remove the link \(fp8launch then makes the folder\), or point train\.output_dir elsewhere$",
         files={"s.toml": SPEC}, setup=link("runs/t/plan", "outside")),
    Case(id="run-plan-folder-is-a-file", argv=("run", "s.toml", "--dry-run"), code=2,
         line=r"^error: runs/t/plan is a file, not a folder; fix: move it away, or point train\.output_dir elsewhere$",
         files={"s.toml": SPEC, "runs/t/plan": MINE}),
    Case(id="run-output-dir-is-a-file", argv=("run", "s.toml", "--dry-run"), code=3,  # preflight's check of train.output_dir
         line=r"runs/t.* is a file", files={"s.toml": SPEC, "runs/t": MINE}),
]

EXPORT_CASES = [
    Case(id="export-refuses-a-link-at-out", argv=("export", "run", "--out", "ex"), code=2,
         line=r"^error: --out: ex is a symbolic link \(to \.\./outside\), and an export replaces --out whole; fix: give the folder it "
              r"leads to, or a new path$", files={"s.toml": SPEC}, setup=both(fake_run, _outside_export, link("ex", "outside"))),
    Case(id="export-refuses-a-dangling-link-at-out", argv=("export", "run", "--out", "ex"), code=2,
         line=r"^error: --out: ex is a symbolic link", files={"s.toml": SPEC}, setup=both(fake_run, link("ex", "outside/nothing"))),
    Case(id="export-keeps-the-users-file-in-an-earlier-export", argv=("export", "run", "--out", "ex"), code=2,
         line=r"^error: --out: ex holds an earlier export and ex/README\.md, which that export did not write, and an export replaces "
              r"the folder whole; fix: move it away, or give a new or empty folder$",
         files={"s.toml": SPEC, "ex/README.md": MINE, **{f"ex/{n}": t for n, t in EXPORT.items()}}, setup=fake_run),
    Case(id="export-out-is-a-file", argv=("export", "run", "--out", "ex"), code=2, line=r"^error: --out: ex is a file; fix: ",
         files={"s.toml": SPEC, "ex": MINE}, setup=fake_run),
]

INIT = [
    Case(id="init-out-is-a-folder", argv=("init", "--name", "a", "--out", "d"), code=2,
         line=r"^error: d is a directory; give a file name such as d/spec\.toml$", files={"d/": ""}),
    Case(id="init-out-is-a-dangling-link", argv=("init", "--name", "a", "--out", "a.toml"), code=2,
         line=r"^error: a\.toml already exists; pass --force to overwrite it$", setup=link("a.toml", "outside/nothing")),
    Case(id="init-out-is-a-link", argv=("init", "--name", "a", "--out", "a.toml"), code=2,
         line=r"^error: a\.toml already exists; pass --force to overwrite it$", setup=link("a.toml", "outside/sentinel")),
    Case(id="init-out-is-under-a-file", argv=("init", "--name", "a", "--out", "afile/a.toml"), code=2,
         line=r"^error: afile is not a folder; fix: give --out a path in a folder, such as a\.toml$", files={"afile": MINE}),
    Case(id="import-out-is-a-folder", argv=("import", "acc.yaml", "--out", "d"), code=2,
         line=r"^error: d is a directory; give a file name such as d/spec\.toml$",
         files={"d/": "", "acc.yaml": "distributed_type: FSDP\n"}),
]

TOOLS = [
    Case(id="bench-out-is-under-a-file", argv=("bench", "s.toml", "--out", "afile/b", "--steps", "2", "--repeats", "1"), code=2,
         line=r"^error: afile is a file, not a folder, so fp8launch cannot make afile/b/; fix: move it away, or point --out elsewhere$",
         files={"s.toml": SPEC, "afile": MINE}),
    Case(id="bench-out-is-a-dangling-link", argv=("bench", "s.toml", "--out", "b", "--steps", "2", "--repeats", "1"), code=2,
         line=r"^error: b is a symbolic link to nothing", files={"s.toml": SPEC}, setup=link("b", "outside/nothing")),
    Case(id="tune-refuses-a-link-under-out", code=2,
         argv=("tune", "s.toml", "--out", "tl", "--steps", "2", "--repeats", "1", "--candidates", "torchao-tensorwise"),
         line=r"^error: --out tl: tl/runs is a symbolic link, and tune writes into no folder through a link; fix: remove the link, or "
              r"choose another --out$", files={"s.toml": SPEC, "tl/tune.json": '{"candidates": [{"run_dirs": ["runs/bf16-1"]}]}\n'},
         setup=link("tl/runs", "outside")),
]

# A place this machine cannot write: exit 3, one line, nothing written (run unprivileged: see `read_only`).
READ_ONLY = [
    Case(id="plan-out-in-a-read-only-folder", argv=("plan", "s.toml", "--out", "ro/gen"), code=3,
         line=r"^error: cannot create ro/gen/t/ \(ro/gen: Permission denied\); fix: make it writable, or point --out at a folder you "
              r"can write to$", files={"s.toml": SPEC, "ro/": ""}, setup=read_only("ro/")),
    Case(id="plan-read-only-output-folder", argv=("plan", "s.toml", "--out", "out", "--set", "train.steps=7"), code=3,
         line=r"^error: cannot write into out/t/ \(Permission denied\); fix: ", files={"s.toml": SPEC},
         setup=both(planned(), read_only("out/t/"))),
    Case(id="run-read-only-output-dir", argv=("run", "s.toml", "--dry-run"), code=3, line=r"runs/t.*writ",
         files={"s.toml": SPEC, "runs/t/": ""}, setup=read_only("runs/t/")),
    Case(id="init-out-in-a-read-only-folder", argv=("init", "--name", "a", "--out", "ro/a.toml"), code=3,
         line=r"^error: cannot write ro/a\.toml: .*/ro takes no new file \(Permission denied\); fix: give --out a path in a folder you "
              r"can write to$", files={"ro/": ""}, setup=read_only("ro/")),
    Case(id="import-out-in-a-read-only-folder", argv=("import", "acc.yaml", "--out", "ro/a.toml"), code=3,
         line=r"^error: cannot write ro/a\.toml: .*/ro takes no new file \(Permission denied\)",
         files={"ro/": "", "acc.yaml": "distributed_type: FSDP\n"}, setup=read_only("ro/")),
    Case(id="import-into-a-read-only-current-folder", argv=("import", "../acc.yaml"), code=3, cwd="ro",
         line=r"^error: cannot write the spec: .*/ro takes no new file \(Permission denied\)",
         files={"ro/": "", "acc.yaml": "distributed_type: FSDP\n"}, setup=read_only("ro/")),
    Case(id="bench-out-in-a-read-only-folder", argv=("bench", "s.toml", "--out", "ro/b", "--steps", "2", "--repeats", "1"), code=3,
         line=r"^error: cannot create ro/b/ \(ro/b: Permission denied\); fix: ", files={"s.toml": SPEC, "ro/": ""}, setup=read_only("ro/")),
]

UNSHARE = ("unshare", "--map-user=1000", "--map-group=1000")


def unprivileged(case: Case) -> Case:
    """Root writes through any mode: as root, run the case as a process whose uid (1000 in a user namespace) owns the
    files but has no such power; elsewhere as it is."""
    if os.geteuid() != 0:
        return case
    try:
        ok = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip("running as root without user namespaces: file modes cannot refuse a write here")
    return dataclasses.replace(case, process=True, prefix=UNSHARE)


def _run(case: Case, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "sentinel").write_text(SENTINEL)
    (outside / "slurm.sbatch").write_text(SENTINEL)
    seen = {}
    setup = case.setup

    def laid_out(folder: Path) -> None:
        if setup is not None:
            setup(folder)
        seen["outside"] = snapshot(outside)
        seen["folder"] = snapshot(folder)

    try:
        check(dataclasses.replace(case, setup=laid_out), tmp_path)
    finally:
        for root, dirs, _ in os.walk(tmp_path):  # what read_only took away, back (pytest removes tmp_path later)
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
    assert snapshot(outside) == seen["outside"], f"{case.id}: something outside the case's folder changed"
    if case.code != 0:
        assert snapshot(tmp_path / "case") == seen["folder"], f"{case.id}: refused, yet its folder changed"


@pytest.mark.parametrize("case", PLAN + RUN + EXPORT_CASES + INIT + TOOLS, ids=lambda c: c.id)
def test_case(case, tmp_path):
    _run(case, tmp_path)


@pytest.mark.parametrize("case", READ_ONLY, ids=lambda c: c.id)
def test_read_only_case(case, tmp_path):
    _run(unprivileged(case), tmp_path)
