"""Plan -> the Kubernetes manifest `kubectl apply -f` takes whole: a ConfigMap holding the plan files
the entrypoint reads, and the job that runs it, as a Kubeflow Trainer v2 TrainJob
(trainer.kubeflow.org/v1alpha1, with a ClusterTrainingRuntime such as `torch-distributed`) or a
training-operator v1 PyTorchJob (kubeflow.org/v1). Built as data and written by launcher.targets.yaml_text,
never by pasting strings. Torch-free.

Both operators start every node's container with torchrun's settings in PET_* variables
(PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT), which torchrun
reads as the defaults of its options, so the command is `torchrun --no-python fp8launch-train --plan ...`.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass

from launcher import ENTRYPOINT, __version__
from launcher.planning.plan import Plan
from launcher.targets.yaml_text import dump_all

MANIFEST_FILE = {"trainjob": "trainjob.yaml", "pytorchjob": "pytorchjob.yaml"}
ENGINE_FILES = ("fsdp2.json", "deepspeed.json")
"""The engine configs next to plan.json that the entrypoint reads (launcher/train/engines)."""
MAX_NAME = 40
"""Job names stay short: pods, services and hostnames add suffixes (`-node-0-0`, `-worker-12`) and must stay <= 63."""
MANAGER = "fp8launch"
"""The TrainJob runtimePatches entry this tool owns."""
PYTORCHJOB_PORT = 23456
"""training-operator's default port for the master (PyTorchJobDefaultPort, named pytorchjob-port)."""
PLAN_FALLBACK = ".fp8launch/plan"
"""Where the plan is mounted (under workdir) when the plan folder is not a relative path inside the project."""


@dataclass(frozen=True, slots=True)
class JobRef:
    """How kubectl finds the job a manifest creates, and its pods."""

    api: str
    name: str
    namespace: str

    @property
    def resource(self) -> str:
        return "trainjobs.trainer.kubeflow.org" if self.api == "trainjob" else "pytorchjobs.kubeflow.org"

    @property
    def pod_selector(self) -> str:
        key = "jobset.sigs.k8s.io/jobset-name" if self.api == "trainjob" else "training.kubeflow.org/job-name"
        return f"{key}={self.name}"

    @property
    def container(self) -> str:
        return "node" if self.api == "trainjob" else "pytorch"


def manifest_file(plan: Plan) -> str:
    return MANIFEST_FILE[plan.launch.kubernetes.api]


def job_name(spec_name: str) -> str:
    """The spec name as an RFC 1035 label (what both operators require of a job name): `.` and `_`
    become `-`, a leading digit gets `job-` in front, and a long name is cut with a hash of the whole
    so that two long names stay different."""
    name = re.sub(r"[^a-z0-9-]", "-", spec_name.lower())
    if not name[:1].isalpha():
        name = "job-" + name
    if len(name) > MAX_NAME:
        name = name[: MAX_NAME - 9] + "-" + hashlib.sha256(spec_name.encode()).hexdigest()[:8]
    return name.rstrip("-") or "job"


def job_ref(plan: Plan) -> JobRef:
    k = plan.launch.kubernetes
    return JobRef(api=k.api, name=job_name(plan.name), namespace=k.namespace)


def gpus_per_node(plan: Plan) -> int:
    """nvidia.com/gpu per node: the spec's value, else one per process; none on a CPU plan."""
    if plan.launch.device == "cpu":
        return 0
    return plan.launch.kubernetes.gpus_per_node or plan.distributed.procs_per_node


def literal(text: str) -> str:
    """`text` as kubelet passes it on: kubelet expands `$(VAR)` in command, args and env values, and
    reads `$$` as `$`, so doubling every `$` makes a value arrive exactly as written."""
    return text.replace("$", "$$")


def in_workdir(workdir: str, path: str) -> str:
    """A container path: absolute paths as they are, relative ones under workdir."""
    return posixpath.normpath(posixpath.join(workdir, path.replace("\\", "/")))


def plan_mount(plan: Plan, plan_dir: str) -> str:
    """Where the ConfigMap's files appear in the container: the plan folder at the same place
    relative to workdir (so plan.json's spec_dir still points at the spec's folder in an image that
    holds the project), or a fixed folder when the plan folder is not inside the project."""
    rel = posixpath.normpath(plan_dir.replace("\\", "/"))
    if rel.startswith("/") or rel == ".." or rel.startswith("../") or re.match(r"^[A-Za-z]:", rel):
        rel = PLAN_FALLBACK
    return in_workdir(plan.launch.kubernetes.workdir, rel)


def torchrun_args(plan: Plan, plan_dir: str) -> list[str]:
    return ["torchrun", "--max-restarts", str(plan.launch.max_restarts),
            "--no-python", ENTRYPOINT, "--plan", literal(plan_mount(plan, plan_dir) + "/plan.json")]


def env_list(plan: Plan) -> list[dict]:
    env = dict(plan.launch.env)
    if plan.launch.max_restarts > 0:
        # As in torchrun.sh: a restarted worker group must not reuse the failed group's TCP store (pytorch#135712).
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return [{"name": k, "value": literal(v)} for k, v in sorted(env.items())]


def labels(plan: Plan) -> dict:
    return {"app.kubernetes.io/managed-by": "fp8launch", "fp8launch/spec": job_name(plan.name)}


def metadata(plan: Plan, name: str) -> dict:
    return {"name": name, "namespace": plan.launch.kubernetes.namespace, "labels": labels(plan)}


def config_map(plan: Plan, files: dict[str, str]) -> dict:
    data = {name: files[name] for name in ("plan.json", *ENGINE_FILES) if name in files}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(plan, job_name(plan.name) + "-plan"), "data": data}


def volumes(plan: Plan) -> list[dict]:
    out = [{"name": "fp8launch-plan", "configMap": {"name": job_name(plan.name) + "-plan"}}]
    if plan.launch.kubernetes.volume_claim:
        out.append({"name": "fp8launch-output", "persistentVolumeClaim": {"claimName": plan.launch.kubernetes.volume_claim}})
    return out


def volume_mounts(plan: Plan, plan_dir: str) -> list[dict]:
    out = []
    if plan.launch.kubernetes.volume_claim:
        out.append({"name": "fp8launch-output", "mountPath": in_workdir(plan.launch.kubernetes.workdir, plan.train.output_dir)})
    out.append({"name": "fp8launch-plan", "mountPath": plan_mount(plan, plan_dir), "readOnly": True})
    return out


def resources(plan: Plan) -> dict:
    gpus = gpus_per_node(plan)
    return {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}


def trainjob(plan: Plan, plan_dir: str) -> dict:
    """A TrainJob on the ClusterTrainingRuntime `runtime`. The trainer has no working-directory
    field, so the command enters workdir itself (`env -C`); volumes come as a runtime patch of the
    runtime's `node` job. Pod-level restarts are the runtime's JobSet failurePolicy, which a
    TrainJob cannot set: launch.max_restarts goes to torchrun (worker restarts inside the pod)."""
    k = plan.launch.kubernetes
    trainer = {
        "image": k.image,
        "command": ["env", "-C", literal(k.workdir), *torchrun_args(plan, plan_dir)],
        "env": env_list(plan),
        "numNodes": plan.distributed.nodes,
        "numProcPerNode": plan.distributed.procs_per_node,
    }
    if resources(plan):
        trainer["resourcesPerNode"] = resources(plan)
    if not trainer["env"]:
        del trainer["env"]
    pod = {"volumes": volumes(plan), "containers": [{"name": "node", "volumeMounts": volume_mounts(plan, plan_dir)}]}
    patch = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]}}}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": metadata(plan, job_name(plan.name)),
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": k.runtime},
            "trainer": trainer,
            "runtimePatches": [patch],
        },
    }


def pytorchjob(plan: Plan, plan_dir: str) -> dict:
    """A PyTorchJob: one Master (node rank 0) and nodes - 1 Workers with the same pod. Restarts:
    launch.max_restarts > 0 restarts a failed pod (restartPolicy OnFailure) up to that many times
    (runPolicy.backoffLimit), and torchrun restarts failed workers inside a pod as often."""
    k = plan.launch.kubernetes
    container = {
        "name": "pytorch",
        "image": k.image,
        "command": torchrun_args(plan, plan_dir),
        "workingDir": k.workdir,
        "env": env_list(plan),
        "ports": [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT}],
        "resources": resources(plan),
        "volumeMounts": volume_mounts(plan, plan_dir),
    }
    if not container["env"]:
        del container["env"]
    if not container["resources"]:
        del container["resources"]

    def replica(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "OnFailure" if plan.launch.max_restarts > 0 else "Never",
                "template": {"metadata": {"labels": labels(plan)}, "spec": {"containers": [container], "volumes": volumes(plan)}}}

    replicas = {"Master": replica(1)}
    if plan.distributed.nodes > 1:
        replicas["Worker"] = replica(plan.distributed.nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata(plan, job_name(plan.name)),
        "spec": {
            "nprocPerNode": str(plan.distributed.procs_per_node),
            "runPolicy": {"backoffLimit": plan.launch.max_restarts, "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": replicas,
        },
    }


def documents(plan: Plan, files: dict[str, str], plan_dir: str) -> list[dict]:
    job = trainjob if plan.launch.kubernetes.api == "trainjob" else pytorchjob
    return [config_map(plan, files), job(plan, plan_dir)]


def render_manifest(plan: Plan, files: dict[str, str], plan_dir: str) -> str:
    """The whole manifest file. `files` are the other rendered files (plan.json, the engine config)."""
    head = (f"# Generated by fp8launch {__version__} from spec {plan.name}: do not edit, change the spec and run `fp8launch plan`.\n"
            f"# Apply with `fp8launch run SPEC` (or `kubectl apply -f {manifest_file(plan)}`).\n")
    return head + dump_all(documents(plan, files, plan_dir))
