"""What `fp8launch run` checks in the launching process before it starts any: torch-free, so that a
run that cannot work stops at once with one line (exit 3) instead of after every worker has
imported torch and torchrun has printed its failure table.

- the packages the plan imports are importable (`importlib.util.find_spec`, nothing imported);
- launch.device = "cuda" finds a GPU on this machine (device files, the driver's /proc entries,
  or `nvidia-smi -L`), when torchrun starts the processes here (not under SLURM: the job's nodes
  are not the machine that submits it);
- the run-stage rules that need only the installed packages: an MS-AMP that cannot run next to them
  (MSAMP-STACK), NVMe offload without libaio (DS-NVME-AIO);
- a CPU run whose ranks all run here fits this machine's available memory by the plan's own estimate
  (MEMORY-EXCEEDS-HOST);
- train.output_dir can be created and written;
- the rendezvous port is not held by another program (launcher/commands/rendezvous.py), for a torchrun started here.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from typing import Mapping

from launcher.commands import rendezvous
from launcher.commands.doctor import packages_needed
from launcher.errors import EnvironmentProblem, with_fix
from launcher.planning.plan import Plan
from launcher.planning.rules import RULES_BY_ID, Facts
from launcher.planning.rules import check as check_rules
from launcher.planning.stack import importable, msamp_problem


def check(plan: Plan, *, local: bool, gpu_here: bool | None = None, environ: Mapping[str, str] | None = None,
          launch_env: Mapping[str, str] | None = None) -> None:
    """Raise EnvironmentProblem (exit 3) for the first thing that keeps `plan` from running here.
    `local`: the training processes use this Python environment (torchrun, or slurm.sbatch run inside an
    allocation); `gpu_here` (default: `local`): they run on this machine, so its GPUs are theirs
    (not so for slurm.sbatch from an salloc shell, which may sit on a login node), and its memory.
    `launch_env`: the variables torchrun.sh starts with (NODE_RANK, RDZV_ENDPOINT from the command line), for a
    torchrun started here: its rendezvous port is checked."""
    environ = os.environ if environ is None else environ
    check_output_dir(plan.train.output_dir)
    if not local:
        return
    for package in ["torch", *packages_needed(plan)]:
        if not importable(package):
            facts = Facts(plan=plan, missing_package=package)
            rule = RULES_BY_ID["BACKEND-MISSING"]
            raise EnvironmentProblem(with_fix(rule.detail(facts), rule.fix_of(facts)), rule="BACKEND-MISSING")
    here = local if gpu_here is None else gpu_here
    facts = Facts(plan=plan, msamp_stack=msamp_problem(plan.distributed.strategy), libaio=libaio_present(environ),
                  host_memory=host_memory(plan, environ) if here else None)
    for finding in check_rules(facts, "run"):
        if finding.is_error:
            raise EnvironmentProblem(finding.text, rule=finding.rule.id)
    if plan.launch.device == "cuda" and here and not gpu_present(environ):
        raise EnvironmentProblem('launch.device = "cuda" but this machine shows no GPU (no /dev/nvidia*, no /proc/driver/nvidia/gpus, '
                                 'no GPU in `nvidia-smi -L`, or CUDA_VISIBLE_DEVICES hides them); fix: run on a GPU machine, '
                                 'or set launch.device = "cpu" (or "auto")')
    if launch_env is not None:
        rendezvous.check(plan, launch_env, environ)


def host_memory(plan: Plan, environ: Mapping[str, str], meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable of this machine, in bytes, for a CPU run whose ranks all run here (one node); None otherwise, or
    where the kernel does not say."""
    cpu = plan.launch.device == "cpu" or (plan.launch.device == "auto" and not gpu_present(environ))
    if not cpu or plan.distributed.nodes != 1:
        return None
    try:
        with open(meminfo, encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


LIBRARY_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib/*-linux-gnu", "/lib", "/lib64", "/lib/*-linux-gnu",
                "/usr/local/lib", "/usr/local/lib64")


def libaio_present(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the linker can find libaio.so (the development library: DeepSpeed JIT-builds its async_io
    op, behind NVMe offload, with -laio; the runtime libaio.so.1 alone does not link)."""
    environ = os.environ if environ is None else environ
    extra = [d for var in ("LIBRARY_PATH", "LD_LIBRARY_PATH") for d in environ.get(var, "").split(os.pathsep) if d]
    return any(glob.glob(os.path.join(d, "libaio.so")) for d in (*extra, *LIBRARY_DIRS))


def gpu_present(environ: Mapping[str, str], root: str = "/") -> bool:
    """Whether a CUDA (or ROCm) GPU is visible here, without torch. `root` stands for / in tests."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    at = lambda path: os.path.join(root, path)  # noqa: E731
    if glob.glob(at("dev/nvidia[0-9]*")) or glob.glob(at("proc/driver/nvidia/gpus/*")) or os.path.exists(at("dev/kfd")):
        return True
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and any(line.startswith("GPU ") for line in listed.stdout.splitlines())


def check_output_dir(output_dir: str) -> None:
    """train.output_dir exists as a writable folder, or can be created (its nearest existing parent is one)."""
    path = os.path.abspath(output_dir)
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise EnvironmentProblem(f"train.output_dir = {output_dir!r} cannot be created: {existing} is a file, not a folder; "
                                 "fix: set train.output_dir to a folder you can write")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise EnvironmentProblem(f"train.output_dir = {output_dir!r} is not writable here ({existing} is not); "
                                 "fix: set train.output_dir to a folder you can write")
