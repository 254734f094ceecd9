"""No spec value can execute in a generated script. The scripts run for real, with torchrun,
srun, scontrol and hostname replaced by recorders on PATH that write down exactly what they got."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from launcher.commands.plan import plan_one

NASTY = [
    "$(touch PWNED-subst)",
    "`touch PWNED-backtick`",
    "a; touch PWNED-semicolon",
    "it's \"quoted\" \\ back",
    "line1\nline2 $(touch PWNED-newline)",
    "${HOME} $PATH * ?",
    "| touch PWNED-pipe &",
]

RECORDER = """#!/usr/bin/env python3
import json, os, sys
name = os.path.basename(sys.argv[0])
if name == "srun" and "hostname" in sys.argv:
    print("127.0.0.1"); sys.exit(0)
if name == "scontrol":
    print("node1\\nnode2"); sys.exit(0)
with open(os.environ["RECORD"], "a") as f:
    env = {k: os.environ.get(k) for k in os.environ.get("WATCH", "").split(",") if k}
    f.write(json.dumps({"cmd": name, "argv": sys.argv[1:], "env": env}) + "\\n")
"""


@pytest.fixture
def recorders(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("torchrun", "srun", "scontrol", "python", "python3"):
        path = bin_dir / name
        path.write_text(RECORDER.replace("#!/usr/bin/env python3", f"#!{os.path.realpath(__import__('sys').executable)}"))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _spec(tmp_path, launcher: str) -> str:
    env = {f"V{i}": v for i, v in enumerate(NASTY)}
    text = "\n".join([
        "version = 1",
        'name = "inj"',
        "[launch]",
        f'launcher = "{launcher}"',
        "env = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + "}",
        "[launch.slurm]",
        f"extra_sbatch = {json.dumps(['--comment=$(touch PWNED-sbatch)', '--begin=now;touch PWNED-x'])}",
        "[train]",
        f"output_dir = {json.dumps('runs/$(touch PWNED-outdir) `x` ; y')}",
        f"data = {json.dumps('text:/tmp/$(touch PWNED-data).txt')}",
    ])
    if launcher == "torchrun":
        text = text.replace("[launch.slurm]\n", "").replace(text.splitlines()[6] + "\n", "")
    path = tmp_path / "spec.toml"
    path.write_text(text + "\n")
    return str(path)


def _run(script, tmp_path, recorders, extra_env=None):
    record = tmp_path / "record.jsonl"
    env = {"PATH": f"{recorders}:/usr/bin:/bin", "RECORD": str(record), "WATCH": ",".join(f"V{i}" for i in range(len(NASTY))),
           "HOME": str(tmp_path), **(extra_env or {})}
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


def _no_pwned(tmp_path):
    found = [p for p in os.listdir(tmp_path) if p.startswith("PWNED")]
    assert found == []


def test_torchrun_script_passes_values_through_verbatim(tmp_path, recorders):
    planned = plan_one(_spec(tmp_path, "torchrun"), str(tmp_path / "gen"))
    folder = tmp_path / "gen" / "inj"
    folder.mkdir(parents=True)
    (folder / "torchrun.sh").write_text(planned.files["torchrun.sh"])
    calls = _run(folder / "torchrun.sh", tmp_path, recorders)
    _no_pwned(tmp_path)
    assert len(calls) == 1 and calls[0]["cmd"] == "torchrun"
    assert calls[0]["env"] == {f"V{i}": v for i, v in enumerate(NASTY)}
    assert calls[0]["argv"] == ["--nnodes", "1", "--nproc-per-node", "8", "--standalone", "--max-restarts", "0",
                                "--no-python", "fp8launch-train", "--plan", f"{folder}/plan.json"]


def test_torchrun_script_takes_node_rank_and_endpoint_from_env_as_data(tmp_path, recorders):
    planned = plan_one(_spec(tmp_path, "torchrun"), str(tmp_path / "gen"))
    folder = tmp_path / "gen" / "inj"
    folder.mkdir(parents=True)
    (folder / "torchrun.sh").write_text(planned.files["torchrun.sh"])
    calls = _run(folder / "torchrun.sh", tmp_path, recorders, {"NODE_RANK": "1; touch PWNED-rank", "RDZV_ENDPOINT": "$(touch PWNED-ep):1"})
    _no_pwned(tmp_path)
    argv = calls[0]["argv"]
    assert argv[argv.index("--node-rank") + 1] == "1; touch PWNED-rank"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "$(touch PWNED-ep):1"


def test_slurm_script_passes_values_through_verbatim(tmp_path, recorders):
    plan_dir = "gen dir/$(touch PWNED-plandir)"
    planned = plan_one(_spec(tmp_path, "slurm"), plan_dir)
    script = tmp_path / "job.sbatch"
    script.write_text(planned.files["slurm.sbatch"])
    calls = _run(script, tmp_path, recorders, {"SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "77"})
    _no_pwned(tmp_path)
    assert [c["cmd"] for c in calls] == ["srun"]
    assert calls[0]["env"] == {f"V{i}": v for i, v in enumerate(NASTY)}
    argv = calls[0]["argv"]
    assert argv[:4] == ["--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "torchrun"]
    assert argv[argv.index("--rdzv-endpoint") + 1] == "127.0.0.1:29500"
    assert argv[argv.index("--rdzv-id") + 1] == "77"
    assert argv[-1] == f"{plan_dir}/inj/plan.json"
    sbatch_lines = [line for line in planned.files["slurm.sbatch"].splitlines() if line.startswith("#SBATCH")]
    assert '#SBATCH --output="runs/$(touch PWNED-outdir) `x` ; y/slurm-%j.out"' in sbatch_lines


def test_slurm_script_refuses_a_job_of_another_node_count_before_starting_anything(tmp_path, recorders):
    # plan.json fixes the world size: `sbatch --nodes=2` of a 1-node plan would fail later in every rank.
    script = tmp_path / "job.sbatch"
    script.write_text(plan_one(_spec(tmp_path, "slurm"), "gen").files["slurm.sbatch"])
    env = {"PATH": f"{recorders}:/usr/bin:/bin", "RECORD": str(tmp_path / "record.jsonl"), "SLURM_NNODES": "2; touch PWNED-nnodes",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "77"}
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 3
    assert r.stderr == ("error: this plan is for 1 node(s) but the job has 2; touch PWNED-nnodes; "
                        "fix: plan for 2; touch PWNED-nnodes nodes: fp8launch run SPEC --nodes 2; touch PWNED-nnodes\n")
    assert not (tmp_path / "record.jsonl").exists()
    _no_pwned(tmp_path)


FAILING_SRUN = """#!/usr/bin/env bash
if [[ " $* " == *" hostname "* ]]; then echo 127.0.0.1; exit 0; fi
echo "$FP8LAUNCH_EXIT_FILE" > "$RECORD"
echo 2 > "$FP8LAUNCH_EXIT_FILE"          # what the entrypoint of a failing rank writes
exit 143                                   # srun: the other node's task was stopped with SIGTERM
"""


def test_slurm_job_exits_with_the_code_the_training_reported(tmp_path, recorders):
    (recorders / "srun").write_text(FAILING_SRUN)
    script = tmp_path / "job.sbatch"
    script.write_text(plan_one(_spec(tmp_path, "slurm"), "gen").files["slurm.sbatch"])
    (tmp_path / "runs" / "$(touch PWNED-outdir) `x` ; y").mkdir(parents=True)  # the log folder sbatch writes into
    env = {"PATH": f"{recorders}:/usr/bin:/bin", "RECORD": str(tmp_path / "record.txt"), "SLURM_NNODES": "1",
           "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "77"}
    r = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    exit_file = (tmp_path / "record.txt").read_text().strip()
    assert exit_file == f"{tmp_path}/runs/$(touch PWNED-outdir) `x` ; y/.exit-code-77"
    assert not os.path.exists(exit_file)  # read, then removed
    _no_pwned(tmp_path)


def test_line_breaks_cannot_add_sbatch_options(cli, spec):
    path = spec('version = 1\nname = "s"\n[launch]\nlauncher = "slurm"\n[launch.slurm]\n'
                'extra_sbatch = ["--x\\n#SBATCH --uid=0"]\npartition = "a\\nb"\n')
    r = cli("plan", path)
    assert r.exit_code == 2
    assert (f'{path}:6: error: $.launch.slurm.extra_sbatch[0]: "--x\\n#SBATCH --uid=0" has the wrong form: '
            'One sbatch option on one line') in r.stderr
    assert f'{path}:7: error: $.launch.slurm.partition: "a\\nb" has the wrong form: Partition' in r.stderr


@pytest.mark.parametrize("name", ["../x", "a/b", "A", "x y", ".hidden", "$(id)", "a" * 65])
def test_names_that_could_escape_the_folder_are_refused(cli, spec, tmp_path, name):
    r = cli("plan", spec(f"version = 1\nname = {json.dumps(name)}\n"), "--out", "out")
    assert r.exit_code == 2 and "$.name" in r.stderr
    assert not (tmp_path / "out").exists()
