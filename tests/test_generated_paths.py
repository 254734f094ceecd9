"""Paths inside generated files are relative to the project root (black's rule: the nearest folder
upward holding .git or pyproject.toml): the same bytes however `--out` is spelled, never a machine path."""

from __future__ import annotations

import os

import pytest

SPEC = """\
version = 1
name = "s"
[precision]
mode = "fp8"
[precision.torchao]
skip_small = false
[distributed]
strategy = "deepspeed"
nodes = 2
[launch]
launcher = "slurm"
[export]
accelerate = true
[train]
output_dir = "runs/{name}"
"""


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "proj"
    (root / "specs").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "p"\n')
    (root / "specs" / "s.toml").write_text(SPEC)
    return root


def _files(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("where, out, spec_arg", [
    ("proj", "{root}/specs/generated", "specs/s.toml"),         # absolute --out
    ("proj/specs", "generated", "s.toml"),                        # from a subfolder
    ("", "proj/specs/generated", "proj/specs/s.toml"),            # from outside the project
    ("proj/specs", "../specs/generated", "{root}/specs/s.toml"),  # roundabout, spec absolute
])
def test_every_spelling_of_out_writes_the_same_bytes(cli, project, tmp_path, monkeypatch, where, out, spec_arg):
    monkeypatch.chdir(project)
    r = cli("plan", "--out", "specs/generated", "specs/s.toml")
    assert r.exit_code == 0, r.stderr
    folder = project / "specs" / "generated" / "s"
    reference = _files(folder)
    assert sorted(reference) == [".fp8launch-files.json", "accelerate.yaml", "deepspeed.json", "plan.json", "slurm.sbatch", "torchrun.sh"]
    for text in reference.values():
        assert str(tmp_path).encode() not in text
    assert b"default_plan_dir=specs/generated/s\n" in reference["slurm.sbatch"]
    assert b'deepspeed_config_file: "specs/generated/s/deepspeed.json"' in reference["accelerate.yaml"]

    monkeypatch.chdir(tmp_path / where)
    args = ["--out", out.format(root=project), spec_arg.format(root=project)]
    r = cli("plan", "--check", *args)
    assert r.exit_code == 0, r.stderr
    assert "up to date: 1 spec checked." in r.stderr
    for name in reference:
        (folder / name).unlink()
    assert cli("plan", *args).exit_code == 0
    assert _files(folder) == reference


def test_default_out_from_the_root_pyproject_applies_in_a_subfolder(cli, project, monkeypatch):
    (project / "pyproject.toml").write_text('[project]\nname = "p"\n\n[tool.fp8launch]\nout = "specs/generated"\n')
    monkeypatch.chdir(project / "specs")
    r = cli("plan", "s.toml")
    assert r.exit_code == 0, r.stderr
    assert (project / "specs" / "generated" / "s" / "plan.json").is_file()
    assert not (project / "specs" / "specs").exists()
    assert b"default_plan_dir=specs/generated/s\n" in (project / "specs" / "generated" / "s" / "slurm.sbatch").read_bytes()


def test_out_through_a_link_of_the_users_own_is_written_and_a_link_under_it_is_refused(cli, project, monkeypatch):
    """--out itself may lead anywhere (the user's own path: a scratch disk); OUT/<name> is fp8launch's, and a link there
    is never followed, to write or to remove."""
    monkeypatch.chdir(project)
    (project / "scratch").mkdir()
    os.symlink("scratch", project / "gen")
    r = cli("plan", "--out", "gen", "specs/s.toml")
    assert r.exit_code == 0, r.stderr
    assert (project / "scratch" / "s" / "plan.json").is_file()
    assert b"default_plan_dir=gen/s\n" in (project / "scratch" / "s" / "slurm.sbatch").read_bytes()  # the path as given
    (project / "elsewhere").mkdir()
    (project / "elsewhere" / "slurm.sbatch").write_text("theirs\n")
    os.symlink("../elsewhere", project / "scratch" / "t")
    (project / "specs" / "t.toml").write_text(SPEC.replace('name = "s"', 'name = "t"'))
    r = cli("plan", "--out", "gen", "specs/t.toml", "--set", "launch.launcher=torchrun")
    assert r.exit_code == 2
    assert r.stderr == ("error: gen/t is a symbolic link (to ../elsewhere), and fp8launch writes into no folder through a link; "
                        "fix: remove the link (fp8launch then makes the folder), or point --out elsewhere\n")
    assert os.listdir(project / "elsewhere") == ["slurm.sbatch"] and (project / "elsewhere" / "slurm.sbatch").read_text() == "theirs\n"
