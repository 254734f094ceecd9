"""A real two-node SLURM cluster on this one machine, for the tests in test_slurm.py.

The session fixture `slurm_cluster` does nothing, and skips the tests saying why, unless the
environment variable FP8LAUNCH_TEST_SLURM is 1 (`.ci/run` sets it): it installs system packages and
writes /etc/munge/munge.key, which a developer's `pytest` must not do unasked. When asked, it:
  1. installs Debian's `slurmctld slurmd slurm-client munge` when a binary is missing (as root;
     `apt-get update` first when the package lists do not know them) - skips the tests, saying
     why, only when they cannot be installed (not root, no apt, no network);
  2. creates /etc/munge/munge.key (mode 400, owner munge) when missing and starts munged when
     `munge -n | unmunge` fails;
  3. writes slurm.conf into a temporary folder: slurmctld and two slurmd daemons, n1 and n2, on
     127.0.0.1 with free ports, state/spool/log/pid files all in that folder;
  4. starts `slurmctld -D -f CONF`, `slurmd -D -f CONF -N n1` and `... -N n2` in the foreground
     as child processes (so their PIDs are known), and waits until `sinfo` shows both idle;
  5. at the end cancels the jobs still in this cluster, stops every daemon it started by PID
     (munged too, when it started it) and removes the folder. It never kills by name.

Start-up on a 2-core machine: 17-20 s for `apt-get update` + install on a machine without the
packages (once per machine), then 1-1.5 s until both nodes are idle. The tests talk to this cluster only:
`cluster.env` has SLURM_CONF set and the inherited SLURM_* variables (of an allocation the developer may be in)
removed.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUEST_ENV = "FP8LAUNCH_TEST_SLURM"
"""Set to 1 to let the fixture install and start a cluster (as root); otherwise the SLURM tests skip."""

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "salloc", "scancel", "scontrol", "sinfo", "squeue", "munged", "munge", "unmunge")
NODES = ("n1", "n2")
MUNGE_KEY = Path("/etc/munge/munge.key")
START_TIMEOUT_S = 60


@dataclass
class SlurmCluster:
    """What a test needs to use the cluster: its folder, config and environment, and helpers."""

    root: Path
    """The temporary folder holding slurm.conf, state, spool, logs and pid files."""
    conf: Path
    env: dict[str, str]
    """os.environ with SLURM_CONF pointing here and no inherited SLURM_*/SBATCH_*/SALLOC_* variables."""
    nodes: tuple[str, ...] = NODES
    startup_s: float = 0.0
    """Seconds from writing slurm.conf to both nodes idle (without the package install)."""
    install_s: float = 0.0
    """Seconds the apt install took (0 when the packages were already there)."""
    processes: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a command (sbatch, scontrol, ...) against this cluster, capturing text output."""
        kw.setdefault("env", self.env)
        result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kw)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def job(self, job_id: str) -> dict[str, str]:
        """The job as a dict: JobState, ExitCode ("2:0" = exit 2, signal 0), NodeList, ... from `scontrol show job`
        while slurmctld holds it, then (MinJobAge after it ended) from the job-completion log."""
        result = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if result.returncode == 0:
            return dict(re.findall(r"(\w+)=(\S*)", result.stdout))
        for record in self.completed_jobs():
            if record.get("JobId") == str(job_id):
                return record
        raise AssertionError(f"no job {job_id}: {result.stderr.strip()}")

    def wait_until_ended(self, job_id: str, timeout: float = 120) -> dict[str, str]:
        """Poll until the job left the PENDING/RUNNING/COMPLETING states; return its `job()` record."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {info.get('JobState')} after {timeout} s")
            time.sleep(0.5)

    def wait_until_running(self, job_id: str, timeout: float = 60) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") == "RUNNING":
                return info
            if info.get("JobState") not in ("PENDING", "CONFIGURING") or time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {info.get('JobState')}, expected RUNNING")
            time.sleep(0.2)

    def completed_jobs(self) -> list[dict[str, str]]:
        """The job-completion log (jobcomp/filetxt): one dict per ended job, with JobId, JobState, ExitCode, NodeList."""
        path = self.root / "jobcomp.log"
        if not path.exists():
            return []
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in path.read_text().splitlines() if line.strip()]

    def logs(self) -> str:
        """The daemons' logs, for an assertion message when something went wrong."""
        parts = []
        for path in sorted((self.root / "log").glob("*.log")):
            parts.append(f"==> {path.name} <==\n" + "\n".join(path.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)


def _bin(name: str) -> str | None:
    """The absolute path of a SLURM/munge binary (the daemons live in /usr/sbin, not on every PATH)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def _missing_binaries() -> list[str]:
    return [b for b in BINARIES if _bin(b) is None]


def _install() -> float:
    """apt-get install the packages when a binary is missing; return the seconds it took. Skip if impossible."""
    if not _missing_binaries():
        return 0.0
    if os.geteuid() != 0:
        pytest.skip(f"SLURM is not installed ({', '.join(_missing_binaries())} missing) and installing it needs root")
    if shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and there is no apt-get to install it with")
    t0 = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:  # a fresh machine has no package lists yet
        update = subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env)
        result = subprocess.run(cmd, capture_output=True, text=True, env=env) if update.returncode == 0 else update
    if result.returncode != 0 or _missing_binaries():
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-5:])
        pytest.skip(f"cannot install {' '.join(PACKAGES)} with apt-get (exit {result.returncode}):\n{tail}")
    return time.monotonic() - t0


def _munge_works(env: dict[str, str]) -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, env=env, timeout=10)
        if cred.returncode != 0:
            return False
        return subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, env=env, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _start_munge(env: dict[str, str]) -> subprocess.Popen | None:
    """Make sure munged answers; return the munged we started, or None when one was already running."""
    if _munge_works(env):
        return None
    munge = pwd.getpwnam("munge")
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        MUNGE_KEY.write_bytes(os.urandom(1024))
    os.chown(MUNGE_KEY, munge.pw_uid, munge.pw_gid)
    os.chmod(MUNGE_KEY, 0o400)
    for folder in (Path("/run/munge"), Path("/var/lib/munge"), Path("/var/log/munge")):
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, munge.pw_uid, munge.pw_gid)
    # --foreground keeps it our child (its PID is ours to stop); --force takes over a stale socket.
    proc = subprocess.Popen([_bin("munged"), "--foreground", "--force"], user=munge.pw_uid, group=munge.pw_gid,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 15
    while not _munge_works(env):
        if proc.poll() is not None:
            pytest.fail(f"munged exited {proc.returncode}: {proc.stderr.read().decode(errors='replace')}")
        if time.monotonic() > deadline:
            _stop(proc)
            pytest.fail("munged started but `munge -n | unmunge` still fails after 15 s")
        time.sleep(0.1)
    return proc


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _slurm_conf(root: Path, host: str, ports: list[int]) -> str:
    """Both nodes are this machine. slurmd accepts CPUs/RealMemory at or below what it finds (2 cores and
    24 GiB here: it logs "Node configuration differs from hardware" and serves); above, the node is drained."""
    ctld_port, *node_ports = ports
    nodes = "\n".join(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=1000 State=UNKNOWN"
                      for name, port in zip(NODES, node_ports))
    return f"""\
# A two-node cluster on loopback, written by tests/slurm_cluster.py.
ClusterName=fp8launch-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
# sbatch --wait polls every 2 s while 2 < MinJobAge/2, else 8 then 32 s: a short age keeps it prompt.
MinJobAge=4
KillWait=5
InactiveLimit=0
{nodes}
PartitionName=test Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _clean_env(conf: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not (k.startswith("SLURM_") or k.startswith("SBATCH_") or k.startswith("SALLOC_"))}
    env["SLURM_CONF"] = str(conf)
    return env


def _stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _nodes_idle(cluster: SlurmCluster) -> bool:
    out = cluster.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False, timeout=10).stdout
    states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
    return all(states.get(n) == "idle" for n in NODES)


def _teardown(cluster: SlurmCluster) -> None:
    """Cancel what still runs here (so no slurmstepd outlives its slurmd), then stop our daemons, newest first."""
    try:
        cluster.run("scancel", "--full", "--signal=KILL", "--partition=test", check=False, timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and cluster.run("squeue", "--noheader", check=False, timeout=10).stdout.strip():
            time.sleep(0.5)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for proc in reversed(cluster.processes):
        _stop(proc)


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.environ.get(REQUEST_ENV) != "1":
        pytest.skip(f"{REQUEST_ENV} is not 1: these tests install SLURM and munge (as root) and start a two-node cluster "
                    f"only when asked; run them with {REQUEST_ENV}=1 (.ci/run sets it)")
    install_s = _install()
    root = Path(tempfile.mkdtemp(prefix="fp8launch-slurm-"))
    conf = root / "slurm.conf"
    cluster = SlurmCluster(root=root, conf=conf, env=_clean_env(conf), install_s=install_s)
    try:
        t0 = time.monotonic()
        munged = _start_munge(cluster.env)
        if munged is not None:
            cluster.processes.append(munged)
        for sub in ("state", "run", "log", *(f"spool/{n}" for n in NODES)):
            (root / sub).mkdir(parents=True)
        host = socket.gethostname().split(".")[0]
        conf.write_text(_slurm_conf(root, host, _free_ports(1 + len(NODES))))
        daemons = {"slurmctld": [_bin("slurmctld"), "-D", "-i", "-f", str(conf)],
                   **{f"slurmd-{n}": [_bin("slurmd"), "-D", "-f", str(conf), "-N", n] for n in NODES}}
        for name, argv in daemons.items():
            log = open(root / "log" / f"{name}.stderr.log", "w")
            cluster.processes.append(subprocess.Popen(argv, env=cluster.env, stdout=log, stderr=subprocess.STDOUT,
                                                      stdin=subprocess.DEVNULL, start_new_session=True))
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _nodes_idle(cluster):
            dead = [p.args for p in cluster.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                pytest.fail(f"SLURM did not come up ({'exited: ' + str(dead) if dead else 'nodes not idle after 60 s'}):\n{cluster.logs()}")
            time.sleep(0.2)
        cluster.startup_s = time.monotonic() - t0
        yield cluster
    finally:
        _teardown(cluster)
        shutil.rmtree(root, ignore_errors=True)
