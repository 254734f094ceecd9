"""fp8launch installs as its instructions say: from a clone (pip install -e ".[extra]", a git URL) or from the
wheel `make dist` builds, never from a package index (it is on none). Every hint comes from one module
(launcher/planning/install.py); the CI example's install line and the pre-commit hooks run for real here,
from a clone of this repository, in fresh virtual environments (their dependencies from the registry)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO
from launcher.planning.install import INSTALL, requirement

WORKFLOW = REPO / "examples" / "ci" / "fp8launch-configs.yml"


def test_each_hint_installs_the_backend_with_its_extras_range_or_fp8launch_from_a_clone():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert requirement("torchao") in extras["torchao"] and requirement("deepspeed") in extras["deepspeed"]
    assert requirement("transformer_engine") in extras["te"] and requirement("matplotlib") in extras["bench"]
    assert INSTALL["torchao"] == f"""pip install '{requirement("torchao")}', or in your fp8launch clone: pip install -e ".[torchao]\""""
    assert INSTALL["tokenizers"].startswith(f"pip install '{requirement('transformers')}'")


def test_no_instruction_installs_fp8launch_from_an_index():
    """`pip install fp8launch` / `fp8launch[extra]` fail: the package is on no index."""
    offenders = []
    for path in [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "examples").rglob("*"), *(REPO / "launcher").rglob("*.py"),
                 *(REPO / "templates").rglob("*"), REPO / ".pre-commit-hooks.yaml"]:
        if path.is_file():
            text = path.read_text(errors="replace")
            if re.search(r"pip install ['\"]?fp8launch(?!\s*@)(\[|['\"\s]|$)", text, re.M):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> tuple[Path, str]:
    """A clone of this repository at its HEAD, as a user would have (what is committed, not the work tree)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and this repository's history")
    target = tmp_path_factory.mktemp("clone") / "fp8launch"
    _git("clone", "--quiet", str(REPO), str(target), cwd=REPO)
    return target, _git("rev-parse", "HEAD", cwd=target)


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin"


@pytest.mark.slow
def test_the_ci_examples_install_line_installs_from_the_repository_and_its_check_runs(clone, tmp_path):
    import yaml

    repo, sha = clone
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["check-generated-configs"]["steps"]
    install, check = [s["run"] for s in steps if "run" in s]
    assert "https://github.com/<org>/fp8launch@<commit>" in install
    bin_ = _venv(tmp_path / "venv")
    line = install.replace("https://github.com/<org>/fp8launch@<commit>", f"file://{repo}@{sha}")
    words = shlex.split(line)
    r = subprocess.run([str(bin_ / "pip"), *words[1:], "-q", "--disable-pip-version-check"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    project = tmp_path / "project"
    shutil.copytree(REPO / "specs", project / "specs")
    r = subprocess.run(["bash", "-c", check], cwd=project, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"up to date: {len(list((REPO / 'specs').glob('*.toml')))} specs checked." in r.stderr
    assert (bin_ / "fp8launch-train").exists()  # the entrypoint torchrun starts


@pytest.mark.slow
def test_the_wheel_make_dist_builds_installs_and_plans(clone, tmp_path):
    repo, _ = clone
    r = subprocess.run(["make", "dist", f"PYTHON={sys.executable}"], cwd=repo, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (repo / "dist").glob("fp8launch-*-py3-none-any.whl")
    bin_ = _venv(tmp_path / "venv")
    r = subprocess.run([str(bin_ / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(bin_ / "fp8launch"), "plan", "--out", str(tmp_path / "gen"), str(REPO / "specs" / "cpu-smoke.toml")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]  # schema.json and the templates ship inside the wheel
    assert (tmp_path / "gen" / "cpu-smoke" / "torchrun.sh").read_text().count("--no-python fp8launch-train") == 1


@pytest.mark.slow
def test_the_pre_commit_hooks_run_from_the_repository_at_a_commit(clone, tmp_path):
    """`pre-commit try-repo` installs the hooks' repository at a commit, as `rev: <SHA>` does: no tag needed."""
    repo, sha = clone
    project = tmp_path / "project"
    shutil.copytree(REPO / "specs", project / "specs")
    # the hook's args in README are [--out, specs/generated]; try-repo takes none, so the project says it (as README shows)
    (project / "pyproject.toml").write_text('[tool.fp8launch]\nout = "specs/generated"\n')
    _git("init", "-q", cwd=project)
    _git("add", ".", cwd=project)
    specs = sorted(f"specs/{p.name}" for p in (project / "specs").glob("*.toml"))
    exe = Path(sys.executable).parent / "pre-commit"
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home")}
    run = lambda: subprocess.run([str(exe), "try-repo", str(repo), "fp8launch-check", "--ref", sha, "--files", *specs],  # noqa: E731
                                 cwd=project, capture_output=True, text=True, timeout=900, env=env)
    r = run()
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])
    spec = project / "specs" / "cpu-smoke.toml"
    spec.write_text(spec.read_text().replace("steps = 30", "steps = 31"))
    r = run()
    assert r.returncode == 1 and "would update specs/generated/cpu-smoke/plan.json" in r.stdout, r.stdout[-3000:]
