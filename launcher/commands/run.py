"""What `fp8launch run` does, torch-free: plan into `<train.output_dir>/plan/`, then start the
generated launch script and return the training's exit code.

- launch.launcher = "torchrun": runs `<plan>/torchrun.sh` (this node's torchrun agent), with
  NODE_RANK / RDZV_ENDPOINT from --node-rank / --rdzv-endpoint when given (else inherited).
- launch.launcher = "slurm", inside an allocation (SLURM_JOB_ID set): runs the generated
  `slurm.sbatch` with bash, whose `srun ... torchrun ...` line starts one agent per node.
- launch.launcher = "slurm", outside one: `sbatch --parsable [--wait] <plan>/slurm.sbatch`;
  the job id is reported as soon as sbatch prints it; with --wait, sbatch's exit code is the job's.
- launch.launcher = "kubernetes": `kubectl apply -f <plan>/trainjob.yaml` (or pytorchjob.yaml), the
  manifest that holds the plan files and the job; with --wait, follows the job until it ends
  (launcher/commands/kubectl.py) and returns its exit code.

Every command runs with this Python's bin folder first on PATH, so `torchrun` and `python`
are the ones of the environment fp8launch is installed in.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from launcher.commands import failure, kubectl
from launcher.commands.plan import Planned, plan_one
from launcher.errors import ERROR_LINE_FILE_ENV, EXIT_FILE_ENV, EXIT_INTERRUPTED, EnvironmentProblem, LauncherError, UsageError
from launcher.planning.install import INSTALL
from launcher.targets.files import Change, make_folder, write
from launcher.targets.kubernetes import JobRef, job_ref, manifest_file
from launcher.targets.runlock import RunLock, hold, stop_with_this_process

PLAN_SUBDIR = "plan"
LOGS_SUBDIR = "logs"
LOG_DIR_ENV = "FP8LAUNCH_LOG_DIR"
"""torchrun.sh adds `--log-dir $FP8LAUNCH_LOG_DIR --tee 3` when set: every rank's output also goes to a file."""
RANK_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
RANK_PREFIX = "[fp8launch-rank${rank}]:"
"""What torchrun puts before each line a worker writes (its tee), so that `execute` can tell the
workers' lines (shown) from torchrun's own (its traceback and failure table: to the log only)."""
WORKER_LINE = re.compile(r"\[fp8launch-rank(\d+)\]:(.*)", re.DOTALL)
TRACEBACK = re.compile(r"(\[rank\d+\]: ?)?Traceback \(most recent call last\):")
INTERRUPTED_LINE = re.compile(r"(\[rank \d+\] )?(interrupted: .*)")
"""The line a worker prints after a Ctrl-C (launcher/train/main.py): where the run stopped, what continues it."""
DISPLAY_HIDDEN = ("PATH", EXIT_FILE_ENV)
"""Variables set for the child but left out of the printed command (machine-specific noise)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Command:
    """One command to start, and the variables it gets on top of the current environment."""

    kind: str
    """torchrun (torchrun.sh) | slurm.sbatch (the script run with bash inside an allocation: its srun starts
    one torchrun per node) | sbatch (the script submitted) | kubectl (the manifest applied)"""
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    logs: str | None = None
    """torchrun: the folder for torchrun's own log (torchrun.log) and each rank's output files."""
    job: JobRef | None = None
    """kubectl: the job the manifest creates."""
    wait: bool = False
    """kubectl: follow the job until it ends."""

    def text(self) -> str:
        """The command as a shell line, with its variables (PATH left out)."""
        assigns = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()) if k not in DISPLAY_HIDDEN]
        return " ".join(assigns + [shlex.join(self.argv)])


def plan_for_run(spec: str, overrides: list[str] = (), strict: bool = False) -> Planned:
    """Plan `spec` for a run: validated and rule-checked like `fp8launch plan`, rendered for
    the folder `<train.output_dir>/plan/` (relative paths stay relative to the current directory)."""
    return plan_one(spec, out_dir=".", overrides=list(overrides), strict=strict,
                    folder_of=lambda plan: os.path.join(plan.train.output_dir, PLAN_SUBDIR))


def write_plan(planned: Planned, force: bool = False) -> list[Change]:
    """Write the plan folder (atomically; stale files fp8launch wrote removed, every other file left alone;
    `force`: overwrite files of the plan's names that fp8launch did not write)."""
    return write(planned.folder, planned.files, force=force, option="train.output_dir")


def _path_env(environ: Mapping[str, str]) -> str:
    return os.path.dirname(sys.executable) + os.pathsep + environ.get("PATH", os.defpath)


def _check_endpoint(endpoint: str) -> None:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--rdzv-endpoint {endpoint!r} is not HOST:PORT (e.g. node0:29500)")


def claim(planned: Planned, command: Command, environ: Mapping[str, str] | None = None) -> RunLock:
    """`run`'s hold on train.output_dir, taken before anything is written there: EnvironmentProblem (exit 3) at once
    where another run holds it. A torchrun agent of node rank > 0 takes none: node rank 0's launcher holds it for the
    job (the workers are told so, see launcher/targets/runlock.py)."""
    environ = os.environ if environ is None else environ
    if command.kind == "torchrun" and command.env.get("NODE_RANK", environ.get("NODE_RANK", "0")).strip() not in ("", "0"):
        return RunLock(planned.plan.train.output_dir, peer=True)
    return hold(planned.plan.train.output_dir, make=lambda folder: make_folder(folder, "train.output_dir"))


def launch_command(planned: Planned, *, node_rank: int | None = None, rdzv_endpoint: str | None = None,
                   wait: bool = False, environ: Mapping[str, str] | None = None) -> Command:
    """The command that starts the planned run from here, given the environment (SLURM_JOB_ID...)."""
    environ = os.environ if environ is None else environ
    plan, folder = planned.plan, planned.folder
    env = {"PATH": _path_env(environ)}
    if plan.launch.launcher == "kubernetes":
        if node_rank is not None or rdzv_endpoint is not None:
            raise UsageError("--node-rank and --rdzv-endpoint do not apply with launch.launcher = \"kubernetes\": "
                             "the operator places the nodes and gives each its rank; drop them")
        return Command(kind="kubectl", argv=("kubectl", "apply", "-f", os.path.join(folder, manifest_file(plan))),
                       env=env, job=job_ref(plan), wait=wait)
    if plan.launch.launcher == "slurm":
        if node_rank is not None or rdzv_endpoint is not None:
            raise UsageError("--node-rank and --rdzv-endpoint do not apply with launch.launcher = \"slurm\": "
                             "SLURM places the nodes and the script finds the head node itself; drop them")
        env["FP8LAUNCH_PLAN_DIR"] = os.path.abspath(folder)
        script = os.path.join(folder, "slurm.sbatch")
        if environ.get("SLURM_JOB_ID"):
            return Command(kind="slurm.sbatch", argv=("bash", script), env=env)
        return Command(kind="sbatch", argv=("sbatch", "--parsable", *(("--wait",) if wait else ()), script), env=env)
    nodes = plan.distributed.nodes
    if node_rank is not None:
        if node_rank >= nodes:
            raise UsageError(f"--node-rank {node_rank} is not below the number of nodes ({nodes}); node ranks are 0..{nodes - 1}")
        env["NODE_RANK"] = str(node_rank)
    if rdzv_endpoint is not None:
        _check_endpoint(rdzv_endpoint)
        env["RDZV_ENDPOINT"] = rdzv_endpoint
    return Command(kind="torchrun", argv=(os.path.join(folder, "torchrun.sh"),), env=env,
                   logs=os.path.join(plan.train.output_dir, LOGS_SUBDIR))


def profiled(command: Command, plan, steps: int, warmup: int = 2) -> Command:
    """`command` asking the training to profile `steps` steps after `warmup` (rank 0 writes profile.json beside
    metrics.jsonl). torchrun and SLURM pass the environment on; a Kubernetes job does not."""
    if command.kind == "kubectl":
        raise UsageError("--profile needs the training's environment, which a Kubernetes manifest does not take from here; "
                         "fix: profile with launch.launcher = \"torchrun\" on one node (`--set launch.launcher=torchrun`)")
    if warmup < 2:
        raise UsageError("--profile needs 2 warm-up steps before the profiled ones: the first compiles and warms the allocator up, "
                         "the second is the profiler's own start-up; fix: --warmup 2")
    last = warmup + steps
    if last > plan.train.steps:
        raise UsageError(f"--profile {steps} records steps {warmup + 1}..{last} after {warmup} warm-up steps, past train.steps = "
                         f"{plan.train.steps}; fix: --set train.steps={last}, or a smaller --profile")
    from launcher.profiling import PROFILE_ENV, PROFILE_WARMUP_ENV

    # Inductor's C++ kernels carry their names into the trace only with this (CPU; no effect on GPU kernels)
    env = {PROFILE_ENV: str(steps), PROFILE_WARMUP_ENV: str(warmup), "TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE": "1"}
    return dataclasses.replace(command, env={**command.env, **env})


def describe(command: Command, environ: Mapping[str, str] | None = None) -> str:
    """What --dry-run prints: the exact command(s). For torchrun, the generated script says
    itself which torchrun line it would exec (its FP8LAUNCH_DRY_RUN mode)."""
    if command.kind == "kubectl" and command.wait:
        return command.text() + "\n" + shlex.join(kubectl.get_argv(command.job)) + "  # repeated until the job ends"
    if command.kind != "torchrun":
        return command.text()
    env = {**(os.environ if environ is None else environ), **command.env, "FP8LAUNCH_DRY_RUN": "1"}
    result = subprocess.run(command.argv, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise EnvironmentProblem(f"{command.argv[0]} --dry-run failed (exit {result.returncode}): {result.stderr.strip()}")
    return result.stdout.strip()


def execute(command: Command, *, on_job_id: Callable[[str], None] = lambda job: None,
            environ: Mapping[str, str] | None = None, log: str | None = None,
            out: Callable[[str], None] | None = None, err: Callable[[str], None] | None = None, lock: RunLock | None = None) -> int:
    """Start `command`, wait for it, and return the training's exit code. With `log`, the
    training's stdout and stderr go to that file instead of the terminal (torchrun only).

    A torchrun command with `logs` (and no `log`) shows its workers' lines through `out`/`err`
    and writes everything, torchrun's own report of a failure included, to `logs`/torchrun.log
    (and each rank's output to its own file there): a worker that stops with a code of ours has
    printed its one-line error, and that stays the last thing on the terminal.

    `lock` (the run's hold on its folder, `claim`): torchrun (or slurm.sbatch) keeps it while it lives and its rank-0
    worker joins it; a job submitted to run elsewhere (sbatch, kubectl) takes it where it runs, so it is let go here.
    A Ctrl-C while torchrun runs raises RunInterrupted with the one line the run's rank 0 printed."""
    env = {**(os.environ if environ is None else environ), **command.env}
    _require(command, env)
    fds = ()
    if lock is not None and command.kind in ("sbatch", "kubectl"):
        lock.release()
    elif lock is not None:
        env, fds = {**env, **lock.env}, lock.fds
    if command.kind == "sbatch":
        return _sbatch(command, env, on_job_id)
    if command.kind == "kubectl":
        return _kubectl(command, env, on_job_id)
    with tempfile.TemporaryDirectory(prefix="fp8launch-") as tmp:
        exit_file = os.path.join(tmp, "exit-code")
        env = {**env, EXIT_FILE_ENV: exit_file}
        if command.kind == "torchrun" and command.logs and log is None:
            logs = os.path.abspath(command.logs)
            line_file = os.path.join(tmp, "error-line")
            env.update({LOG_DIR_ENV: logs, RANK_PREFIX_ENV: RANK_PREFIX, ERROR_LINE_FILE_ENV: line_file})
            shown = _run_shown(command.argv, env, logs, out or _stdout, err or _stderr, fds)
            if shown.interrupted is not None:
                raise RunInterrupted(shown.interrupted)
            return failure.told(_reported_code(exit_file, shown.code), shown, torchrun_sh=command.argv[0], logs=command.logs,
                                launch_env=command.env, environ=environ, line_file=line_file, err=err or _stderr)
        code = _run(command.argv, env, log, fds)
        return _reported_code(exit_file, code)


def _stdout(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def _stderr(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()


@dataclass
class _Shown:
    code: int = 0
    worker_lines: int = 0
    agent_lines: list[str] = field(default_factory=list)
    crashed: int | None = None
    """The rank whose traceback is shown; a traceback of another rank goes to the log only."""
    hidden: set[int] = field(default_factory=set)
    interrupted: str | None = None
    """After a Ctrl-C: the line that says where the run stopped (a worker's, else one of ours); nothing else is shown."""
    held: failure.Held = field(default_factory=failure.Held)
    """A failing rank's traceback and error line, shown once the run's end says whether they are the cause (failure.told)."""
    log_error: OSError | None = None
    """Why torchrun.log could not be written (a full disk): the lines are still shown."""


def _run_shown(argv: tuple[str, ...], env: Mapping[str, str], logs: str,
               out: Callable[[str], None], err: Callable[[str], None], fds: tuple[int, ...] = ()) -> _Shown:
    """Run torchrun with its workers' lines (tagged by RANK_PREFIX) shown on out/err, untagged,
    and every line, torchrun's own included, in `logs`/torchrun.log."""
    os.makedirs(logs, exist_ok=True)
    held = failure.Held(restarts=failure.plan_facts(argv[0]).get("max_restarts") or 0)
    shown, lock, before = _Shown(held=held), threading.Lock(), len(INTERRUPTS)
    with open(os.path.join(logs, "torchrun.log"), "w", encoding="utf-8") as full:
        child = subprocess.Popen(argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, errors="replace", bufsize=1, pass_fds=fds, preexec_fn=stop_with_this_process())

        def pump(pipe, echo):
            for line in pipe:
                with lock:
                    if shown.log_error is None:
                        try:
                            full.write(line)
                            full.flush()
                        except OSError as e:  # a full disk: go on showing the lines (and draining the pipe)
                            shown.log_error = e
                    match = WORKER_LINE.match(line)
                    if not match:
                        shown.agent_lines.append(line)
                        shown.held.agent(line, echo)
                        continue
                    rank, text = int(match.group(1)), match.group(2)
                    shown.worker_lines += 1
                    if len(INTERRUPTS) > before:  # Ctrl-C: what the ranks print on their way out stays in the log
                        said = INTERRUPTED_LINE.match(text)
                        if said and shown.interrupted is None:
                            shown.interrupted = said.group(2).strip()
                        continue
                    if TRACEBACK.match(text):  # one crash shown: the others are its consequences (peers gone)
                        shown.crashed = rank if shown.crashed is None else shown.crashed
                        if shown.crashed != rank:
                            shown.hidden.add(rank)
                    if rank not in shown.hidden:
                        shown.held.line(rank, _untagged(rank, text), echo)

        pumps = [threading.Thread(target=pump, args=(child.stdout, out), daemon=True),
                 threading.Thread(target=pump, args=(child.stderr, err), daemon=True)]
        for t in pumps:
            t.start()
        shown.code = _wait(child)
        for t in pumps:
            t.join()
    if len(INTERRUPTS) > before and shown.interrupted is None:
        shown.interrupted = f"interrupted: Ctrl-C; torchrun and its workers stopped; full logs: {logs}/"
    return shown


def _untagged(rank: int, text: str) -> str:
    """A worker's line as it wrote it; rank N > 0 named once in front (its error lines already are)."""
    if rank == 0 or text.startswith((f"[rank {rank}] ", f"[rank{rank}]:")):
        return text
    return f"[rank {rank}] {text}"


def _require(command: Command, env: Mapping[str, str]) -> None:
    needed = {"torchrun": "torchrun", "slurm.sbatch": "srun", "sbatch": "sbatch", "kubectl": "kubectl"}[command.kind]
    if shutil.which(needed, path=env.get("PATH")) is None:
        if needed == "kubectl":
            raise EnvironmentProblem(kubectl.INSTALL)
        if needed == "torchrun":
            raise EnvironmentProblem(f"torchrun is not on PATH; fix: install torch in this environment: {INSTALL['torch']}")
        raise EnvironmentProblem(f"{needed} is not on PATH: launch.launcher = \"slurm\" needs SLURM's client commands; "
                                 "fix: run on a SLURM login node, or set launch.launcher = \"torchrun\"")


def _reported_code(exit_file: str, code: int) -> int:
    """torchrun exits 1 whatever its workers' codes; the entrypoint leaves its real one in the exit file."""
    if code == 0:
        return 0
    try:
        with open(exit_file, encoding="utf-8") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return code


def _run(argv: tuple[str, ...], env: Mapping[str, str], log: str | None = None, fds: tuple[int, ...] = ()) -> int:
    """Run a child in the foreground. SIGTERM/SIGHUP are passed on to it; Ctrl-C reaches it
    directly (same process group), so this process only waits for it to finish. It gets a SIGTERM
    when this process dies (kill -9 included), as it would from us."""
    out = open(log, "w", encoding="utf-8") if log else None  # noqa: SIM115 (closed below)
    try:
        return _wait(subprocess.Popen(argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT if out else None, pass_fds=fds,
                                      preexec_fn=stop_with_this_process()))
    finally:
        if out:
            out.close()


INTERRUPTS: list[int] = []
"""SIGINTs that arrived while a child ran. Ctrl-C reaches the child directly (same process group); a
caller that starts several children in turn (`tune`) reads this to stop after the current one."""


def _wait(child: subprocess.Popen) -> int:
    forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda signum, frame: INTERRUPTS.append(signum))
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


SBATCH_GRACE_S = 5.0
"""After a Ctrl-C, how long `run --wait` waits for sbatch (which got the same SIGINT) to exit before it
leaves it: the job keeps running either way."""


def _sbatch(command: Command, env: Mapping[str, str], on_job_id: Callable[[str], None]) -> int:
    """sbatch --parsable prints `JOBID[;CLUSTER]` first; with --wait it then blocks until the job ends.

    A Ctrl-C is recorded by a handler, not raised where it happens to land: whatever sbatch does with
    its own copy of the SIGINT (exit, or finish), the run ends with EXIT_INTERRUPTED, never with
    sbatch's 0 (a CI step would take the job as done)."""
    interrupts: list[float] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupts.append(time.monotonic()))
    try:
        child = subprocess.Popen(command.argv, env=dict(env), stdout=subprocess.PIPE, text=True)
        first = child.stdout.readline().strip()  # a recording handler lets the read resume after EINTR (PEP 475)
        job = first.split(";")[0] if first else ""
        if job:
            on_job_id(job)
        while True:  # --parsable prints nothing more on stdout; errors go to stderr, inherited
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if interrupts and time.monotonic() - interrupts[0] > SBATCH_GRACE_S:
                    code = None
                    break
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupts:
        raise Interrupted(f"interrupted while waiting; batch job {job or '(not submitted)'} keeps running"
                          + (f"; `scancel {job}` stops it" if job else ""))
    return code


def _kubectl(command: Command, env: Mapping[str, str], on_job_id: Callable[[str], None]) -> int:
    """kubectl apply; then, with --wait, the job's end and exit code (see launcher/commands/kubectl.py)."""
    code = kubectl.apply(command.argv, env)
    if code != 0:
        return code
    ref = command.job
    on_job_id(ref.name)
    if not command.wait:
        return 0
    try:
        return kubectl.follow(ref, env)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while waiting; {ref.api} {ref.name} keeps running; "
                          f"`{kubectl.stop_hint(ref)}` stops it") from None


class Interrupted(LauncherError):
    """Ctrl-C while `run --wait` waits for a batch job: the job is not ours to stop."""

    exit_code = EXIT_INTERRUPTED


class RunInterrupted(LauncherError):
    """Ctrl-C while torchrun runs here: every rank stopped; the message is the run's own line ("interrupted: ...")."""

    exit_code = EXIT_INTERRUPTED
    label = None


def announce(planned: Planned, command: Command, job_id: str) -> str:
    """The line `run` prints once the job is submitted (SLURM) or applied (Kubernetes)."""
    if command.kind == "kubectl":
        ref = command.job
        return f"applied {ref.api} {ref.name} in namespace {ref.namespace}; status: {kubectl.status_hint(ref)}"
    return f"submitted batch job {job_id}; log: {job_log(planned, job_id)}"


def job_log(planned: Planned, job_id: str) -> str:
    """Where slurm.sbatch sends the job's stdout (#SBATCH --output)."""
    return os.path.join(planned.plan.train.output_dir, f"slurm-{job_id}.out")
