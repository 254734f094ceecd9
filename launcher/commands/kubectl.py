"""`fp8launch run` on Kubernetes: apply the generated manifest with kubectl and, with --wait, follow
the job until it ends. Torch-free; every cluster call is a kubectl command line, nothing else.

The job's end comes from its conditions (TrainJob: Complete / Failed; PyTorchJob: Succeeded /
Failed). Neither job API carries the training's exit code, the Pod API does: a failed job's code
is the first non-zero `terminated.exitCode` of its training containers (pods in name order, so
node 0 first); 1 when no pod reports one (deleted, never started).
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Callable, Mapping

from launcher.errors import EnvironmentProblem
from launcher.targets.kubernetes import JobRef

POLL_ENV = "FP8LAUNCH_KUBECTL_POLL_S"
"""Seconds between status queries with --wait (default 10)."""
DONE = {"trainjob": ("Complete", "Failed"), "pytorchjob": ("Succeeded", "Failed")}
GET_FAILURES = 6
"""Consecutive failed `kubectl get` calls (API server away, job deleted) before giving up."""
INSTALL = ("kubectl is not on PATH: launch.launcher = \"kubernetes\" applies the manifest with it; "
           "fix: install kubectl (https://kubernetes.io/docs/tasks/tools/) with a kubeconfig for your cluster, "
           "or apply the generated file from a machine that has it")


def get_argv(ref: JobRef) -> tuple[str, ...]:
    return ("kubectl", "get", ref.resource, ref.name, "--namespace", ref.namespace, "--output", "json")


def pods_argv(ref: JobRef) -> tuple[str, ...]:
    return ("kubectl", "get", "pods", "--namespace", ref.namespace, "--selector", ref.pod_selector, "--output", "json")


def state(job: dict, api: str) -> str:
    """running | succeeded | failed, from the job object's status.conditions."""
    done_ok, done_failed = DONE[api]
    true = {c.get("type") for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    if done_failed in true:
        return "failed"
    if done_ok in true:
        return "succeeded"
    return "running"


def exit_code(pods: dict, container: str) -> int:
    """The first non-zero exit code of the training containers (current or last terminated state)."""
    for pod in sorted(pods.get("items") or [], key=lambda p: p.get("metadata", {}).get("name", "")):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != container:
                continue
            for which in ("state", "lastState"):
                code = ((status.get(which) or {}).get("terminated") or {}).get("exitCode")
                if isinstance(code, int) and code != 0:
                    return code
    return 1


def _json(argv: tuple[str, ...], env: Mapping[str, str]) -> dict | None:
    result = subprocess.run(argv, env=dict(env), capture_output=True, text=True)
    if result.returncode != 0:
        return None
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        return None


def follow(ref: JobRef, env: Mapping[str, str], *, sleep: Callable[[float], None] = time.sleep,
           on_state: Callable[[str], None] = lambda s: None) -> int:
    """Poll the job until it ends; return 0, or the failed training's exit code (1 when unknown)."""
    poll = float(env.get(POLL_ENV, "10"))
    failures, last = 0, None
    while True:
        job = _json(get_argv(ref), env)
        if job is None:
            failures += 1
            if failures >= GET_FAILURES:
                raise EnvironmentProblem(f"`{' '.join(get_argv(ref))}` failed {failures} times in a row; "
                                         f"the job may still run: check it with kubectl")
        else:
            failures = 0
            now = state(job, ref.api)
            if now != last:
                on_state(now)
                last = now
            if now == "succeeded":
                return 0
            if now == "failed":
                pods = _json(pods_argv(ref), env)
                return exit_code(pods or {}, ref.container)
        sleep(poll)


def stop_hint(ref: JobRef) -> str:
    return f"kubectl delete {ref.resource} {ref.name} --namespace {ref.namespace}"


def apply(argv: tuple[str, ...], env: Mapping[str, str]) -> int:
    """`kubectl apply -f FILE`; its own output (created / configured / errors) goes to the terminal."""
    return subprocess.run(argv, env=dict(env)).returncode


def status_hint(ref: JobRef) -> str:
    return f"kubectl get {ref.resource} {ref.name} --namespace {ref.namespace}"
