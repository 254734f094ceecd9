"""An MS-AMP that is installed but cannot run next to the installed Transformer Engine / DeepSpeed is
named as such, with versions, by doctor, by run's preflight and by the entrypoint, never as "not
installed", where the spec asks for what only MS-AMP gives (its DeepSpeed integration); a spec its opt
level's native keys express is planned as them, saying why (launcher/planning/levels.py). The environment
is a real folder on sys.path: an `msamp` package whose import fails the
way MS-AMP 0.4's does (it imports transformer_engine_extensions) and its dist-info metadata."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO
from launcher.planning.stack import msamp_problem, release


def _env(versions: dict[str, str | None], present: set[str]):
    return (lambda module: versions.get(module)), (lambda module: module in present)


def test_nothing_to_say_without_msamp():
    version, found = _env({"deepspeed": "0.19.8"}, {"deepspeed"})
    assert msamp_problem("ddp", version=version, found=found) is None


def test_msamp_next_to_a_current_transformer_engine_names_both_versions():
    version, found = _env({"msamp": "0.4.0", "transformer_engine": "2.20.2", "deepspeed": "0.13.1"},
                          {"msamp", "transformer_engine", "deepspeed"})
    text = msamp_problem("ddp", version=version, found=found)
    assert text.startswith("MS-AMP 0.4.0 is installed but cannot run here: it imports transformer_engine_extensions "
                           "(Transformer Engine <= 1.7")
    assert "this environment has Transformer Engine 2.20.2" in text and "DeepSpeed" not in text


def test_msamp_deepspeed_integration_needs_deepspeed_0_13():
    version, found = _env({"msamp": "0.4.0", "transformer_engine": "1.7.0", "deepspeed": "0.19.8"},
                          {"msamp", "transformer_engine", "transformer_engine_extensions", "deepspeed"})
    assert msamp_problem("ddp", version=version, found=found) is None  # DDP never imports msamp.deepspeed
    text = msamp_problem("deepspeed", version=version, found=found)
    assert "imports AMP from deepspeed.runtime.engine (DeepSpeed <= 0.13; it pins 0.13.1)" in text
    assert text.endswith("this environment has DeepSpeed 0.19.8.")
    version, found = _env({"msamp": "0.4.0", "transformer_engine": "1.7.0", "deepspeed": "0.13.1"},
                          {"msamp", "transformer_engine", "transformer_engine_extensions", "deepspeed"})
    assert msamp_problem("deepspeed", version=version, found=found) is None  # the stack it supports


def test_release_numbers():
    assert release("0.19.8+cpu") == (0, 19, 8) and release("2.13.0") == (2, 13, 0) and release("1.7.0.dev0") == (1, 7, 0)


@pytest.fixture
def broken_msamp(tmp_path):
    """A site folder holding an `msamp` that fails to import as MS-AMP 0.4 does here, and its metadata."""
    site = tmp_path / "site"
    (site / "msamp").mkdir(parents=True)
    (site / "msamp" / "__init__.py").write_text("import transformer_engine_extensions  # as msamp/te/extension.py does\n")
    info = site / "MS_AMP-0.4.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: MS-AMP\nVersion: 0.4.0\n")
    return site


def _run(args, cwd, site):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_doctor_says_installed_but_cannot_run_with_versions(broken_msamp, tmp_path):
    r = _run(["doctor", "--format", "json"], tmp_path, broken_msamp)
    report = json.loads(r.stdout)
    assert report["machine"]["packages"]["msamp"] == "0.4.0"
    rows = {s["label"]: s for s in report["support"]}
    for level in ("O1", "O2"):  # under DDP: its native levels, which run on this CPU
        row = rows[f"fp8 msamp {level}"]
        assert row["supported"] and "its native levels: precision.backend = \"torchao\"" in row["note"], row
    o3 = rows["fp8 msamp O3"]  # through DeepSpeed, which the native levels cannot express: MS-AMP's, which cannot run here
    assert not o3["supported"] and "MSAMP-STACK" in o3["rules"] and "BACKEND-MISSING" not in o3["rules"]
    assert any("MS-AMP 0.4.0 is installed but cannot run here: it imports transformer_engine_extensions" in reason
               and "this environment has no Transformer Engine" in reason and "DeepSpeed 0.19" in reason for reason in o3["reasons"])


def test_plan_gives_a_ddp_spec_its_native_levels_and_says_why(broken_msamp, tmp_path):
    spec = tmp_path / "ms.toml"
    spec.write_text('version = 1\nname = "ms"\n[precision]\nmode = "fp8"\nbackend = "msamp"\n[distributed]\nstrategy = "ddp"\n'
                    '[train]\nmodel = "builtin:llama3-1b"\n')
    r = _run(["plan", str(spec), "--out", str(tmp_path / "gen")], tmp_path, broken_msamp)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("  MS-AMP "))
    assert line.endswith("planned as its native levels (precision.backend = \"torchao\", precision.grad_reduce = \"fp8\", "
                         "precision.master_weights = \"bf16\", precision.optimizer_states = \"fp8\"): the MS-AMP installed here "
                         "cannot run next to this stack (`fp8launch doctor` says why)"), line


def test_run_stops_before_torchrun_with_the_stack_problem(broken_msamp, tmp_path):
    spec = tmp_path / "ms.toml"
    spec.write_text(textwrap.dedent("""
        version = 1
        name = "ms"
        [precision]
        mode = "fp8"
        backend = "msamp"
        [distributed]
        strategy = "deepspeed"
        procs_per_node = 1
        [launch]
        device = "cuda"
    """))  # MS-AMP's DeepSpeed integration: what its native levels cannot express
    r = _run(["run", str(spec)], tmp_path, broken_msamp)
    assert r.returncode == 3, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error[MSAMP-STACK]: MS-AMP 0.4.0 is installed but cannot run here") and "ghcr.io/azure/msamp" in line
    assert "not importable" not in r.stderr and not (tmp_path / "runs" / "ms" / "logs").exists()


def test_the_entrypoint_reports_an_installed_msamp_that_fails_to_import(broken_msamp, tmp_path):
    code = textwrap.dedent("""
        import torch
        from launcher.errors import LauncherError
        from launcher.train.precision import apply_precision
        from tests.train._precision import TinyLlama, make_plan
        plan = make_plan(precision={"mode": "fp8", "backend": "msamp"}, distributed={"strategy": "deepspeed", "procs_per_node": 1})
        try:
            apply_precision(TinyLlama(), plan, torch.device("cpu"))
        except LauncherError as e:
            print(e.rule, e.exit_code, e)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken_msamp), str(REPO)])}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith("MSAMP-STACK 3 error[MSAMP-STACK]: MS-AMP 0.4.0 is installed but cannot run here"), r.stdout + r.stderr
