"""`fp8launch run` without training: the plan folder it writes, the exact commands --dry-run
prints (torchrun, srun, sbatch), and the sbatch/srun paths driven through fake SLURM commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.commands.run import Command, _reported_code, launch_command, plan_for_run

VENV_BIN = str(Path(sys.executable).parent)

SPEC = """
version = 1
name = "t"
[distributed]
strategy = "fsdp2"
procs_per_node = 2
[launch]
device = "cpu"
[train]
seq_len = 32
steps = 2
"""

SLURM_SPEC = SPEC + """
[launch.slurm]
time = "00:05:00"
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in ("NODE_RANK", "RDZV_ENDPOINT", "SLURM_JOB_ID", "FP8LAUNCH_PLAN_DIR"):
        monkeypatch.delenv(key, raising=False)


def _plan_json(tmp_path: Path, name: str = "t") -> dict:
    return json.loads((tmp_path / "runs" / name / "plan" / "plan.json").read_text())


def test_dry_run_prints_the_exact_torchrun_command_and_writes_the_plan(cli, spec, tmp_path):
    path = spec(SPEC)
    r = cli("run", path, "--dry-run")
    assert r.exit_code == 0, r.stderr
    plan_json = tmp_path / "runs" / "t" / "plan" / "plan.json"
    assert r.stdout == (f"torchrun --nnodes 1 --nproc-per-node 2 --standalone --max-restarts 0 "
                        f"--no-python fp8launch-train --plan {plan_json}\n")
    assert sorted(os.listdir(plan_json.parent)) == [".fp8launch-files.json", "fsdp2.json", "plan.json", "torchrun.sh"]
    # spec_dir is relative to the plan folder and leads back to the spec's folder.
    assert (plan_json.parent / _plan_json(tmp_path)["spec_dir"]).resolve() == tmp_path.resolve()


def test_dry_run_of_one_node_of_several(cli, spec, tmp_path):
    r = cli("run", spec(SPEC), "--dry-run", "--nodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.1.2.3:29400")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == (
        "torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 10.1.2.3:29400 --rdzv-id t "
        f"--node-rank 1 --max-restarts 0 --no-python fp8launch-train --plan {tmp_path / 'runs/t/plan/plan.json'}\n"
    )
    assert _plan_json(tmp_path)["derived"]["world_size"] == 4


def test_node_rank_and_endpoint_come_from_the_environment_when_not_given(cli, spec, monkeypatch):
    monkeypatch.setenv("NODE_RANK", "3")
    monkeypatch.setenv("RDZV_ENDPOINT", "head:1234")
    r = cli("run", spec(SPEC), "--dry-run", "--nodes", "4")
    assert r.exit_code == 0, r.stderr
    assert "--nnodes 4 " in r.stdout and "--rdzv-endpoint head:1234 " in r.stdout and "--node-rank 3 " in r.stdout


def test_options_win_over_the_environment(cli, spec, monkeypatch):
    monkeypatch.setenv("NODE_RANK", "3")
    r = cli("run", spec(SPEC), "--dry-run", "--nodes", "4", "--node-rank", "0", "--rdzv-endpoint", "h:1")
    assert "--node-rank 0 " in r.stdout and "--rdzv-endpoint h:1 " in r.stdout


@pytest.mark.parametrize("args, message", [
    (("--nodes", "2", "--node-rank", "2"), "--node-rank 2 is not below the number of nodes (2)"),
    (("--rdzv-endpoint", "nohost"), "is not HOST:PORT"),
    (("--rdzv-endpoint", "h:99999"), "is not HOST:PORT"),
])
def test_bad_node_options_are_usage_errors(cli, spec, args, message, tmp_path):
    r = cli("run", spec(SPEC), "--dry-run", *args)
    assert r.exit_code == 2 and message in r.stderr
    assert not (tmp_path / "runs").exists()  # nothing planned into place when the command is refused


def test_a_bad_spec_exits_2_without_traceback_and_writes_nothing(cli, spec, tmp_path):
    r = cli("run", spec(SPEC.replace('strategy = "fsdp2"', 'strategy = "fsdp3"')), "--dry-run")
    assert r.exit_code == 2 and 'did you mean "fsdp2"' in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


def test_slurm_outside_an_allocation_submits_with_sbatch(cli, spec, tmp_path):
    path = spec(SLURM_SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"'))
    folder = tmp_path / "runs" / "t" / "plan"
    r = cli("run", path, "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == f"FP8LAUNCH_PLAN_DIR={folder} sbatch --parsable runs/t/plan/slurm.sbatch\n"
    r = cli("run", path, "--dry-run", "--wait", "--nodes", "2")
    assert r.stdout == f"FP8LAUNCH_PLAN_DIR={folder} sbatch --parsable --wait runs/t/plan/slurm.sbatch\n"
    assert "#SBATCH --nodes=2" in (folder / "slurm.sbatch").read_text()


def test_slurm_inside_an_allocation_runs_the_script_srun_line(cli, spec, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    r = cli("run", spec(SLURM_SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"')), "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == f"FP8LAUNCH_PLAN_DIR={tmp_path / 'runs/t/plan'} bash runs/t/plan/slurm.sbatch\n"
    command = launch_command(plan_for_run("spec.toml"), environ={"SLURM_JOB_ID": "77", "PATH": "/usr/bin"})
    assert command.kind == "slurm.sbatch" and command.argv == ("bash", os.path.join("runs", "t", "plan", "slurm.sbatch"))


def test_slurm_refuses_node_rank_and_endpoint(cli, spec):
    r = cli("run", spec(SLURM_SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"')), "--dry-run", "--node-rank", "0")
    assert r.exit_code == 2 and "do not apply with launch.launcher" in r.stderr


def test_commands_put_this_python_first_on_path(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    planned = plan_for_run(spec(SPEC))
    command = launch_command(planned, node_rank=0, environ={"PATH": "/usr/bin"})
    assert command.kind == "torchrun" and command.argv == (os.path.join("runs", "t", "plan", "torchrun.sh"),)
    assert command.env == {"PATH": VENV_BIN + os.pathsep + "/usr/bin", "NODE_RANK": "0"}
    assert command.text() == "NODE_RANK=0 runs/t/plan/torchrun.sh"


def test_command_text_quotes_words():
    c = Command(kind="sbatch", argv=("sbatch", "a b/slurm.sbatch"), env={"FP8LAUNCH_PLAN_DIR": "/x y", "PATH": "/p"})
    assert c.text() == "FP8LAUNCH_PLAN_DIR='/x y' sbatch 'a b/slurm.sbatch'"


def test_exit_code_comes_from_the_exit_file_when_torchrun_failed(tmp_path):
    exit_file = tmp_path / "code"
    assert _reported_code(str(exit_file), 1) == 1  # no file: torchrun's own code
    exit_file.write_text("3\n")
    assert _reported_code(str(exit_file), 1) == 3
    assert _reported_code(str(exit_file), 0) == 0


def _fake_bin(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + textwrap.dedent(body))
    path.chmod(0o755)


def _fp8launch(tmp_path: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(VENV_BIN, "fp8launch"), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_sbatch_is_called_with_the_plan_dir_and_its_job_id_is_printed(spec, tmp_path):
    path = spec(SLURM_SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"'))
    fake = tmp_path / "bin"
    _fake_bin(fake, "sbatch", f"""\
        printf '%s\\n' "$@" > {tmp_path}/sbatch.args
        printf '%s\\n' "$FP8LAUNCH_PLAN_DIR" "$PATH" > {tmp_path}/sbatch.env
        echo "4242;cluster"
        [[ "$*" == *--wait* ]] && exit 7
        exit 0
        """)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    r = _fp8launch(tmp_path, "run", path, env=env)
    assert r.returncode == 0, r.stderr
    assert "submitted batch job 4242; log: runs/t/slurm-4242.out" in r.stdout
    assert (tmp_path / "sbatch.args").read_text().split() == ["--parsable", "runs/t/plan/slurm.sbatch"]
    plan_dir, job_path = (tmp_path / "sbatch.env").read_text().splitlines()
    assert plan_dir == str(tmp_path / "runs" / "t" / "plan")
    assert job_path.split(":")[0] == VENV_BIN  # the job finds this environment's torchrun and python
    assert (tmp_path / "runs" / "t").is_dir()  # sbatch writes its --output log there: it must exist
    r = _fp8launch(tmp_path, "run", path, "--wait", env=env)
    assert r.returncode == 7 and "4242" in r.stdout  # --wait: the job's exit code
    assert (tmp_path / "sbatch.args").read_text().split() == ["--parsable", "--wait", "runs/t/plan/slurm.sbatch"]


def test_inside_an_allocation_the_script_runs_srun_torchrun(spec, tmp_path):
    """Fake scontrol/srun stand in for SLURM; the generated script's srun line is what runs."""
    path = spec(SLURM_SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"'))
    fake = tmp_path / "bin"
    _fake_bin(fake, "scontrol", "printf 'n1\\nn2\\n'\n")
    _fake_bin(fake, "srun", f"""\
        if [[ "$*" == *hostname* ]]; then echo 10.0.0.5; exit 0; fi
        printf '%s\\n' "$@" > {tmp_path}/srun.args
        exit 5
        """)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "9", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1"}
    r = _fp8launch(tmp_path, "run", path, env=env)
    assert r.returncode == 5, r.stderr  # the step's exit code comes back
    args = (tmp_path / "srun.args").read_text().split()
    assert args[:args.index("torchrun")] == ["--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    torchrun = args[args.index("torchrun"):]
    assert torchrun[torchrun.index("--rdzv-endpoint") + 1] == "10.0.0.5:29500"
    assert torchrun[torchrun.index("--nproc-per-node") + 1] == "2"
    assert torchrun[-3:] == ["fp8launch-train", "--plan", f"{tmp_path}/runs/t/plan/plan.json"]


def test_missing_sbatch_is_an_environment_problem(spec, tmp_path):
    path = spec(SLURM_SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"'))
    r = _fp8launch(tmp_path, "run", path, env={"PATH": "/nonexistent", "HOME": str(tmp_path)})
    assert r.returncode == 3 and "sbatch is not on PATH" in r.stderr and "Traceback" not in r.stderr


def test_launch_and_cli_stay_torch_free():
    code = "import sys, launcher.cli, launcher.commands.run; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_ctrl_c_while_waiting_for_a_batch_job_says_the_job_keeps_running(spec, tmp_path):
    path = spec(SLURM_SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"'))
    fake = tmp_path / "bin"
    _fake_bin(fake, "sbatch", """\
        echo "5150"
        exec sleep 30   # SIGINT stops it wherever it lands (bash would wait for a sleep that missed it)
        """)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    child = subprocess.Popen([os.path.join(VENV_BIN, "fp8launch"), "run", path, "--wait"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert "submitted batch job 5150" in child.stdout.readline()
    os.killpg(child.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130
    assert "interrupted while waiting; batch job 5150 keeps running; `scancel 5150` stops it" in err
    assert "Traceback" not in err


# A Ctrl-C at each point of `run --wait`'s life with sbatch, sent deterministically (by the fake sbatch to
# its parent, or by the callback that prints the job id): each ends as Interrupted (exit 130), whatever
# sbatch's own exit code, and the job id is named once sbatch printed it.
SIGINT_AT = {
    "before sbatch printed the job id": ("kill -INT $PPID; sleep 0.2; exit 1", None, "(not submitted)"),
    "while the job id is being printed": ("echo 5150; sleep 1; exit 0", "callback", "5150"),
    "while waiting, then sbatch exits 0": ("echo 5150; sleep 0.2; kill -INT $PPID; exit 0", None, "5150"),
    "while waiting, sbatch keeps going": ("echo 5150; sleep 0.2; kill -INT $PPID; sleep 30; exit 0", None, "5150"),
}


@pytest.mark.parametrize("when", SIGINT_AT)
def test_ctrl_c_at_any_point_of_waiting_for_sbatch_is_interrupted(tmp_path, when, monkeypatch):
    from launcher.commands import run
    from launcher.commands.run import Interrupted, _sbatch

    monkeypatch.setattr(run, "SBATCH_GRACE_S", 0.5)  # a sbatch that outlives the Ctrl-C is left after this

    body, sender, job = SIGINT_AT[when]
    _fake_bin(tmp_path, "sbatch", body + "\n")
    seen = []

    def on_job_id(job_id):
        seen.append(job_id)
        if sender == "callback":
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as e:
        _sbatch(Command(kind="sbatch", argv=(str(tmp_path / "sbatch"),)), os.environ, on_job_id)
    assert e.value.exit_code == 130 and f"batch job {job} keeps running" in str(e.value)
    assert seen == ([] if job == "(not submitted)" else [job])
    assert signal.getsignal(signal.SIGINT) is before  # pytest's own Ctrl-C handling is back


def test_without_ctrl_c_run_wait_exits_with_sbatchs_code(tmp_path):
    from launcher.commands.run import _sbatch

    _fake_bin(tmp_path, "sbatch", "echo '5150;cluster'; exit 7\n")
    seen = []
    assert _sbatch(Command(kind="sbatch", argv=(str(tmp_path / "sbatch"),)), os.environ, seen.append) == 7
    assert seen == ["5150"]


def test_ctrl_c_reads_as_interrupted_even_when_sbatch_ignores_it_and_exits_0(spec, tmp_path):
    """The failure a race once produced: sbatch outlived the Ctrl-C and exited 0, and so did `run --wait`."""
    path = spec(SLURM_SPEC.replace('device = "cpu"', 'device = "cpu"\nlauncher = "slurm"'))
    fake = tmp_path / "bin"
    _fake_bin(fake, "sbatch", """\
        trap '' INT    # ignored here and in the sleep it starts
        echo "5150"
        sleep 1
        exit 0
        """)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    child = subprocess.Popen([os.path.join(VENV_BIN, "fp8launch"), "run", path, "--wait"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert "submitted batch job 5150" in child.stdout.readline()
    os.killpg(child.pid, signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "batch job 5150 keeps running" in err and "Traceback" not in err
