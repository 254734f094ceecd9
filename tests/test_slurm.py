"""`fp8launch run` against a live two-node SLURM cluster (tests/slurm_cluster.py starts it on this
machine: slurmctld + slurmd n1 + slurmd n2 on loopback, 1 CPU each).

Every job trains FSDP2 + torchao float8 (tensorwise, float8 all-gather) on the builtin debug Llama
on CPU, one process per node, so world size 2 means both nodes took part. The fp8launch under
test is the venv's, called by its path with a PATH that does NOT hold the venv's bin folder, as
`make smoke` and CI call it: the job must still find the venv's torchrun and python.

Timing on this 2-core machine: cluster start-up ~1.5 s (plus ~20 s for the apt install on a
fresh machine); each training job ~20-25 s, most of it importing torch and joining the rendezvous.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.errors import EXIT_PREEMPTED
from slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401  (the session fixture)
from tests.support import free_port

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.xdist_group("slurm")]  # one cluster, one worker

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
FP8LAUNCH = str(VENV_BIN / "fp8launch")
NAME = "slurm-cpu"
FP8_LAYERS, LINEARS = 27, 29  # llama-debug: every Linear but the first (layers.0.attention.wq) and the lm head
JOB_TIMEOUT_S = 180


def write_spec(folder: Path, *, nodes: int = 2, steps: int = 6, extra: str = "") -> Path:
    """FSDP2 + torchao FP8 on CPU, one process per node, under SLURM."""
    path = folder / "spec.toml"
    path.write_text(f"""\
version = 1
name = "{NAME}"

[precision]
mode = "fp8"
backend = "torchao"

[precision.torchao]
recipe = "tensorwise"
fsdp_float8_all_gather = true
skip_small = false  # llama-debug's GEMMs are all 'small' for torchao's H100 heuristic

[distributed]
strategy = "fsdp2"
nodes = {nodes}
procs_per_node = 1

[launch]
launcher = "slurm"
device = "cpu"
rdzv_endpoint = "localhost:{free_port()}"
env = {{ OMP_NUM_THREADS = "1" }}

[launch.slurm]
time = "00:10:00"

[train]
model = "builtin:llama-debug"
seq_len = 64
micro_batch_size = 2
steps = {steps}
log_every = 1
{extra}""")
    return path


@pytest.fixture
def env(slurm_cluster: SlurmCluster) -> dict[str, str]:  # noqa: F811 - the session fixture imported above
    """The cluster's environment with the venv's bin taken off PATH (fp8launch is called by its path)."""
    path = [p for p in slurm_cluster.env["PATH"].split(os.pathsep) if p and Path(p).resolve() != VENV_BIN.resolve()]
    return {**slurm_cluster.env, "PATH": os.pathsep.join(path or ["/usr/bin", "/bin"])}


def fp8launch(env: dict[str, str], cwd: Path, *args: str, prefix: tuple[str, ...] = (),
              timeout: float = JOB_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, FP8LAUNCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def job_id_of(result: subprocess.CompletedProcess) -> str:
    """The job id `run` printed: "submitted batch job ID; log: OUTPUT_DIR/slurm-ID.out"."""
    found = re.search(rf"^submitted batch job (\d+); log: runs/{NAME}/slurm-\1\.out$", result.stdout, re.M)
    assert found, f"no job id printed:\n{result.stdout}\n{result.stderr}"
    return found.group(1)


def records(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def step_launches(cluster: SlurmCluster, job_id: str) -> dict[str, set[str]]:
    """For each node, the step ids of `job_id` its slurmd launched tasks of (from the slurmd logs)."""
    out = {}
    for node in cluster.nodes:
        text = (cluster.root / "log" / f"slurmd-{node}.log").read_text(errors="replace")
        out[node] = set(re.findall(rf"launch task StepId={job_id}\.(\d+) ", text))
    return out


def assert_trained_on_both_nodes(cluster: SlurmCluster, job_id: str, output_dir: Path, steps: int) -> None:
    recs = records(output_dir)
    start = [r for r in recs if r["event"] == "start"]
    assert len(start) == 1, recs
    assert start[0]["world_size"] == 2 and start[0]["strategy"] == "fsdp2" and start[0]["device"] == "cpu"
    assert (start[0]["backend"], start[0]["recipe"]) == ("torchao", "tensorwise")
    assert (start[0]["fp8_layers"], start[0]["total_linear"]) == (FP8_LAYERS, LINEARS)
    assert "float8 all-gather" in start[0]["precision"]
    stepped = [r for r in recs if r["event"] == "step"]
    assert [r["step"] for r in stepped] == list(range(1, steps + 1))
    assert all(r["world_size"] == 2 and r["loss"] > 0 for r in stepped)
    assert recs[-1]["event"] == "end" and recs[-1]["steps_run"] == steps
    # Both slurmd daemons launched a task of the same step: the srun that runs one torchrun agent per node.
    launches = step_launches(cluster, job_id)
    assert launches["n1"] & launches["n2"], launches


def test_sbatch_wait_trains_fp8_fsdp2_across_two_nodes(slurm_cluster, env, tmp_path):  # noqa: F811 - the session fixture imported above
    spec = write_spec(tmp_path)
    t0 = time.monotonic()
    r = fp8launch(env, tmp_path, "run", str(spec), "--wait")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{slurm_cluster.logs()}"
    job_id = job_id_of(r)
    job = slurm_cluster.job(job_id)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0"
    assert job["NodeList"] == "n[1-2]"
    output_dir = tmp_path / "runs" / NAME
    assert_trained_on_both_nodes(slurm_cluster, job_id, output_dir, steps=6)
    log = (output_dir / f"slurm-{job_id}.out").read_text()
    assert f"{FP8_LAYERS} of {LINEARS} Linear layers in FP8" in log and "step 6/6" in log
    assert elapsed < 120, f"a 6-step job took {elapsed:.0f} s"


def test_failing_job_returns_its_exit_code_through_wait(slurm_cluster, env, tmp_path):  # noqa: F811 - the session fixture imported above
    spec = write_spec(tmp_path)
    r = fp8launch(env, tmp_path, "run", str(spec), "--wait", "--set", "train.model=py:nonexistent_module_xyz:build")
    job_id = job_id_of(r)
    job = slurm_cluster.job(job_id)
    assert job["JobState"] == "FAILED", job
    # The entrypoint exits 2 for a plan that names something unusable. torchrun exits 1 and srun 143
    # (it stopped the other node's task); slurm.sbatch makes the job exit with the entrypoint's code,
    # SLURM records it, and `run --wait` passes it on.
    assert job["ExitCode"] == "2:0", job
    assert r.returncode == 2, f"run exited {r.returncode}, job {job['ExitCode']}\n{r.stderr}"
    err = (tmp_path / "runs" / NAME / f"slurm-{job_id}.err").read_text()
    assert "nonexistent_module_xyz" in err
    assert records(tmp_path / "runs" / NAME) == []


HANG_GUARD_S = 300
"""How long a job may take to reach its first step, or to end after the signal, before the test calls it hung: not a speed
check. The whole test took 79 s on an AMD EPYC host of this machine kind whose `import torch` is 2.4x slower than the
AMX Xeon's (2026-11-27); the guard was 90 s."""

SIGTERM_STEPS = 30
"""Long enough (~20 s of steps) that the signal, sent after the first step, lands mid-run; short
enough that the resumed run finishes the rest quickly."""


def test_scancel_signal_term_reaches_the_training(slurm_cluster, env, tmp_path):  # noqa: F811 - the session fixture imported above
    spec = write_spec(tmp_path, steps=SIGTERM_STEPS)
    r = fp8launch(env, tmp_path, "run", str(spec))
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    job_id = job_id_of(r)
    output_dir = tmp_path / "runs" / NAME
    deadline = time.monotonic() + HANG_GUARD_S
    while not any(rec["event"] == "step" for rec in records(output_dir)):  # training, not still importing torch
        assert time.monotonic() < deadline, f"no step after {HANG_GUARD_S} s: {slurm_cluster.job(job_id)}"
        assert slurm_cluster.job(job_id)["JobState"] in ("PENDING", "RUNNING"), (output_dir / f"slurm-{job_id}.err").read_text()[-3000:]
        time.sleep(0.3)
    slurm_cluster.run("scancel", "--signal=TERM", job_id)  # what #SBATCH --signal=TERM@N does before the time limit
    job = slurm_cluster.wait_until_ended(job_id, timeout=HANG_GUARD_S)
    last_step = max(rec["step"] for rec in records(output_dir) if rec["event"] == "step")
    assert last_step < SIGTERM_STEPS, "the job ran to the end: the signal did not stop it"
    assert not any(rec["event"] == "end" for rec in records(output_dir))
    err = (output_dir / f"slurm-{job_id}.err").read_text()
    assert err.count("got signal: 15") == 2, err[-3000:]  # both torchrun agents, one per node, got it
    # The entrypoint checkpoints at the step boundary and every rank exits 75 (EXIT_PREEMPTED); slurm.sbatch
    # makes the job exit with the entrypoint's code, so SLURM records 75, not srun's 143 or torchrun's 1.
    assert job["ExitCode"] == f"{EXIT_PREEMPTED}:0", job
    r = fp8launch(env, tmp_path, "run", str(spec), "--wait")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    recs = records(output_dir)
    starts = [i for i, rec in enumerate(recs) if rec["event"] == "start"]
    assert len(starts) == 2, recs
    resumed_from = recs[starts[1]]["start_step"]
    assert resumed_from >= last_step, (resumed_from, last_step)  # nothing trained before the signal is lost
    assert [rec["step"] for rec in recs[starts[1]:] if rec["event"] == "step"] == list(range(resumed_from + 1, SIGTERM_STEPS + 1))
    assert recs[-1]["event"] == "end" and recs[-1]["final_step"] == SIGTERM_STEPS


def test_inside_salloc_run_uses_srun_and_torchrun_itself(slurm_cluster, env, tmp_path):  # noqa: F811 - the session fixture imported above
    spec = write_spec(tmp_path)
    r = fp8launch(env, tmp_path, "run", str(spec), prefix=("salloc", "--nodes=2", "--job-name=alloc"))
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{slurm_cluster.logs()}"
    job_id = re.search(r"Granted job allocation (\d+)", r.stderr).group(1)
    assert slurm_cluster.job(job_id)["JobName"] == "alloc"
    # No batch job was submitted from inside the allocation: no job came after it.
    known = slurm_cluster.run("squeue", "--noheader", "--states=all", "--format=%i").stdout.split()
    known += [j["JobId"] for j in slurm_cluster.completed_jobs()]
    assert max(int(j) for j in known) == int(job_id), known
    assert_trained_on_both_nodes(slurm_cluster, job_id, tmp_path / "runs" / NAME, steps=6)


def test_nodes_option_overrides_the_spec_for_sbatch(slurm_cluster, env, tmp_path):  # noqa: F811 - the session fixture imported above
    spec = write_spec(tmp_path, nodes=1)
    r = fp8launch(env, tmp_path, "run", str(spec), "--nodes", "2", "--wait")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{slurm_cluster.logs()}"
    job_id = job_id_of(r)
    job = slurm_cluster.job(job_id)
    assert job["NumNodes"] == "2" and job["NodeList"] == "n[1-2]", job
    assert_trained_on_both_nodes(slurm_cluster, job_id, tmp_path / "runs" / NAME, steps=6)


def test_sbatch_of_a_plan_for_another_node_count_fails_at_once(slurm_cluster, env, tmp_path):  # noqa: F811 - the session fixture imported above
    spec = write_spec(tmp_path, nodes=1)
    subprocess.run([FP8LAUNCH, "plan", str(spec), "--out", "gen"], cwd=tmp_path, env=env, check=True, capture_output=True)
    (tmp_path / "runs" / NAME).mkdir(parents=True)  # sbatch opens --output there
    t0 = time.monotonic()
    r = slurm_cluster.run("sbatch", "--parsable", "--wait", "--nodes=2", f"gen/{NAME}/slurm.sbatch", cwd=tmp_path, check=False)
    assert r.returncode == 3, f"{r.stdout}\n{r.stderr}"
    job_id = r.stdout.strip().split(";")[0]
    assert slurm_cluster.job(job_id)["ExitCode"] == "3:0"
    err = (tmp_path / "runs" / NAME / f"slurm-{job_id}.err").read_text()
    assert err == "error: this plan is for 1 node(s) but the job has 2; fix: plan for 2 nodes: fp8launch run SPEC --nodes 2\n"
    assert step_launches(slurm_cluster, job_id) == {"n1": set(), "n2": set()}  # no srun, no torchrun
    assert time.monotonic() - t0 < 15
