"""The pre-commit hooks and the CI example run the real CLI and catch drift; shell completion works."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, run_module

yaml = pytest.importorskip("yaml")


def _entry_argv(entry: str) -> list[str]:
    words = shlex.split(entry)
    assert words[0] == "fp8launch"
    return words[1:]


def _copy_specs(tmp_path):
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    return sorted(f"specs/{p.name}" for p in (tmp_path / "specs").glob("*.toml"))


def test_precommit_check_hook_passes_clean_and_fails_on_drift(tmp_path):
    hooks = {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"fp8launch-check", "fp8launch-plan"}
    check = hooks["fp8launch-check"]
    assert check["language"] == "python" and check["pass_filenames"] is True
    specs = _copy_specs(tmp_path)
    argv = _entry_argv(check["entry"]) + ["--out", "specs/generated", *specs]
    r = run_module(*argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    spec = tmp_path / "specs" / "cpu-smoke.toml"
    spec.write_text(spec.read_text().replace("steps = 30", "steps = 31"))
    r = run_module(*argv, cwd=tmp_path)
    assert r.returncode == 1
    assert "would update specs/generated/cpu-smoke/plan.json" in r.stderr
    assert '+    "steps": 31,' in r.stdout
    # the regenerate hook rewrites it, after which the check passes again
    r = run_module(*_entry_argv(hooks["fp8launch-plan"]["entry"]), "--out", "specs/generated", *specs, cwd=tmp_path)
    assert r.returncode == 0
    assert run_module(*argv, cwd=tmp_path).returncode == 0


def test_github_actions_example_runs_the_check(tmp_path):
    workflow = yaml.safe_load((REPO / "examples" / "ci" / "fp8launch-configs.yml").read_text())
    steps = workflow["jobs"]["check-generated-configs"]["steps"]
    runs = [s["run"] for s in steps if "run" in s]
    assert runs[0].startswith('pip install "git+https://github.com/') and "@<commit>" in runs[0]  # run for real: tests/test_install.py
    _copy_specs(tmp_path)
    cmd = runs[1].replace("fp8launch", f"{shlex.quote(sys.executable)} -m launcher", 1)
    r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"up to date: {len(list((REPO / 'specs').glob('*.toml')))} specs checked." in r.stderr


def test_shell_completion_uses_clicks_mechanism(tmp_path):
    exe = shutil.which("fp8launch", path=os.path.dirname(sys.executable))
    assert exe, "the console script is installed with the package"
    script = subprocess.run([exe], env={**os.environ, "_FP8LAUNCH_COMPLETE": "bash_source"}, capture_output=True, text=True)
    assert "complete -o nosort -F _fp8launch_completion fp8launch" in script.stdout
    words = subprocess.run([exe], env={**os.environ, "_FP8LAUNCH_COMPLETE": "bash_complete",
                                       "COMP_WORDS": "fp8launch pl", "COMP_CWORD": "1"},
                           capture_output=True, text=True)
    assert "plain,plan" in words.stdout.splitlines()
    opts = subprocess.run([exe], env={**os.environ, "_FP8LAUNCH_COMPLETE": "bash_complete",
                                      "COMP_WORDS": "fp8launch plan --ch", "COMP_CWORD": "2"},
                          capture_output=True, text=True)
    assert "plain,--check" in opts.stdout.splitlines()


def test_toml_schema_directive_for_editors_is_accepted(cli, spec):
    path = spec('#:schema ./fp8launch.schema.json\nversion = 1\nname = "e"\n')
    assert cli("plan", path).exit_code == 0


@pytest.mark.xdist_group("support_matrix_generation")  # the worker that generates the matrices for test_support_matrix.py
def test_ci_script_checks_beside_the_test_command_run_clean():
    """Every command .ci/run runs besides `make` (the linter before the tests, the drift checks after) passes on
    this tree: a lint finding, a moved module or a renamed flag fails here, in the fast suite, not after 20 minutes of CI."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    checks = [
        line for line in lines
        if line and not line.startswith(("#", "set ", "cd ", "export ", "make "))
    ]
    assert checks, "no checks found beside `make test` in .ci/run"
    phases = [shlex.split(line)[1] for line in checks if line.startswith(".ci/phase ")]
    assert phases == ["lint", "plan-check", "matrix-check"]
    assert lines.index(".ci/phase lint .venv/bin/ruff check --no-cache .") < lines.index("make test")
    bindir = os.path.dirname(sys.executable)
    for line in checks:
        argv = [w.replace(".venv/bin/", bindir + "/") for w in shlex.split(line)]
        argv = [str(p) for a in argv for p in (sorted(REPO.glob(a)) if "*" in a else [a])]
        if argv[3:5] == ["-m", "tools.support_matrix"]:  # .ci/phase NAME PYTHON -m MODULE ARGS
            # in this process, as `python -m` runs it (its module, its main, its flags), so that the matrices this worker
            # generated for tests/test_support_matrix.py (~12 s, cached per process) are not generated again
            from tools import support_matrix

            assert argv[2] == sys.executable and support_matrix.main(argv[5:]) == 0, line
            continue
        env = {k: v for k, v in os.environ.items() if k != "CI_TIMES"}  # CI's own phase record is not this test's to write
        r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
        assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"
