"""launch.launcher = "kubernetes": the manifests `plan` writes (validated against the vendored Kubeflow
CRDs, their CEL rules and the webhooks' checks, see tests/k8s_validate.py), hostile values, and
`fp8launch run` against a recording stand-in for kubectl (tests/fake_kubectl.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_module
from k8s_validate import job_problems, manifest_problems
from launcher.commands import kubectl
from launcher.commands.plan import plan_one
from launcher.targets.kubernetes import JobRef, job_name
from launcher.targets.yaml_text import dump_all

SPECS = sorted(str(p.relative_to(REPO)) for p in (REPO / "specs").glob("*.toml"))
K8S_SPEC = """
version = 1
name = "{name}"
[distributed]
strategy = "{strategy}"
nodes = {nodes}
procs_per_node = {procs}
[launch]
launcher = "kubernetes"
device = "{device}"
max_restarts = {restarts}
[launch.kubernetes]
api = "{api}"
image = "ghcr.io/acme/fp8launch:1"
namespace = "ml"
volume_claim = "runs-rwx"
"""


def k8s_spec(spec, api="trainjob", name="big-run", nodes=4, procs=8, device="cuda", restarts=0, strategy="fsdp2", extra=""):
    return spec(K8S_SPEC.format(api=api, name=name, nodes=nodes, procs=procs, device=device, restarts=restarts, strategy=strategy) + extra)


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def planned(path: str, out: str = "gen", overrides=()):
    p = plan_one(path, out, list(overrides))
    name = next(n for n in p.files if n.endswith(".yaml"))
    return p, name, docs_of(p.files[name])


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """kubelet's $(VAR) expansion of command, args and env values (a port of Kubernetes'
    third_party/forked/golang/expansion Expand): `$$` is `$`, `$(NAME)` is NAME's value when defined."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(" and ")" in text[i + 2:]:
                end = text.index(")", i + 2)
                name = text[i + 2:end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


# --- the manifests validate against the vendored CRDs -------------------------------------------

@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
@pytest.mark.parametrize("spec_path", SPECS)
def test_every_committed_spec_as_a_kubernetes_job_validates(spec_path, api):
    overrides = ["launch.launcher=kubernetes", f"launch.kubernetes.api={api}", "launch.kubernetes.image=reg.example/fp8:1",
                 "launch.kubernetes.volume_claim=shared"]
    _, name, _ = planned(str(REPO / spec_path), "specs/generated", overrides)
    assert name == f"{api}.yaml"
    assert manifest_problems(plan_one(str(REPO / spec_path), "specs/generated", overrides).files[name]) == []


def test_committed_kubernetes_manifests_validate():
    manifests = sorted((REPO / "specs" / "generated").glob("*/*job.yaml"))
    assert [m.parent.name for m in manifests] == ["llama3-8b-torchao-k8s"]
    for m in manifests:
        assert manifest_problems(m.read_text("utf-8")) == [], m


@pytest.mark.parametrize("restarts", [0, 3])
def test_four_nodes_of_eight_gpus_as_a_trainjob(spec, restarts):
    p, name, (cm, job) = planned(k8s_spec(spec, restarts=restarts))
    assert name == "trainjob.yaml" and job_problems(job) == []
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]) == (
        "trainer.kubeflow.org/v1alpha1", "TrainJob", "big-run", "ml")
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 8}}
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
    assert trainer["command"] == ["env", "-C", "/workspace", "torchrun", "--max-restarts", str(restarts),
                                  "--no-python", "fp8launch-train", "--plan", "/workspace/gen/big-run/plan.json"]
    env = {e["name"]: e["value"] for e in trainer.get("env", [])}
    assert env == ({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if restarts else {})
    [rjob] = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rjob["template"]["spec"]["template"]["spec"]
    assert rjob["name"] == "node" and pod["containers"][0]["name"] == "node"  # the torch-distributed runtime's names
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts == {"fp8launch-output": "/workspace/runs/big-run", "fp8launch-plan": "/workspace/gen/big-run"}
    assert {v["name"]: v.get("persistentVolumeClaim", v.get("configMap")) for v in pod["volumes"]} == {
        "fp8launch-output": {"claimName": "runs-rwx"}, "fp8launch-plan": {"name": "big-run-plan"}}
    # the ConfigMap carries exactly the files the entrypoint reads, byte for byte
    assert cm["metadata"]["name"] == "big-run-plan" and cm["metadata"]["namespace"] == "ml"
    assert cm["data"] == {"plan.json": p.files["plan.json"], "fsdp2.json": p.files["fsdp2.json"]}


@pytest.mark.parametrize("restarts", [0, 3])
def test_four_nodes_of_eight_gpus_as_a_pytorchjob(spec, restarts):
    p, name, (cm, job) = planned(k8s_spec(spec, api="pytorchjob", restarts=restarts, extra='[launch.env]\nNCCL_DEBUG = "INFO"\n'))
    assert name == "pytorchjob.yaml" and job_problems(job) == []
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    spec_ = job["spec"]
    assert spec_["nprocPerNode"] == "8"
    assert spec_["runPolicy"]["backoffLimit"] == restarts
    replicas = spec_["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Master": 1, "Worker": 3}
    for r in replicas.values():
        assert r["restartPolicy"] == ("OnFailure" if restarts else "Never")
        [c] = r["template"]["spec"]["containers"]
        assert c["name"] == "pytorch" and c["image"] == "ghcr.io/acme/fp8launch:1" and c["workingDir"] == "/workspace"
        assert c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
        assert c["command"][:3] == ["torchrun", "--max-restarts", str(restarts)]
        assert {e["name"]: e["value"] for e in c["env"]}["NCCL_DEBUG"] == "INFO"
        assert {m["mountPath"] for m in c["volumeMounts"]} == {"/workspace/runs/big-run", "/workspace/gen/big-run"}
    assert set(cm["data"]) == {"plan.json", "fsdp2.json"}


def test_one_node_pytorchjob_has_only_a_master_and_cpu_plans_ask_for_no_gpu(spec):
    _, _, (_, job) = planned(k8s_spec(spec, api="pytorchjob", nodes=1, procs=2, device="cpu"))
    assert job_problems(job) == []
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert "resources" not in job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    _, _, (_, tj) = planned(k8s_spec(spec, nodes=1, procs=2, device="cpu"))
    assert "resourcesPerNode" not in tj["spec"]["trainer"]


def test_gpus_per_node_overrides_procs_per_node(spec):
    _, _, (_, job) = planned(k8s_spec(spec, extra="gpus_per_node = 8\n", procs=4))
    assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8


def test_deepspeed_config_travels_in_the_configmap(spec):
    p, _, (cm, job) = planned(k8s_spec(spec, api="pytorchjob", strategy="deepspeed"))
    assert cm["data"]["deepspeed.json"] == p.files["deepspeed.json"] and "fsdp2.json" not in cm["data"]
    assert job_problems(job) == []


def test_the_manifest_validation_catches_what_the_api_server_refuses(spec):
    """The checks are not vacuous: each broken twin of a valid job is refused for its reason."""
    _, _, (_, tj) = planned(k8s_spec(spec))
    _, _, (_, pj) = planned(k8s_spec(spec, api="pytorchjob"))
    broken = []
    t = json.loads(json.dumps(tj))
    t["spec"]["trainer"]["numProcPerNode"] = 0
    broken.append((t, "CEL self >= 1"))
    t = json.loads(json.dumps(tj))
    t["metadata"]["name"] = "1-run"
    broken.append((t, "CEL self.metadata.name.matches"))
    t = json.loads(json.dumps(tj))
    t["spec"]["trainer"]["numNodes"] = "4"
    broken.append((t, "is not of type 'integer'"))
    t = json.loads(json.dumps(tj))
    t["spec"]["trainer"]["workingDir"] = "/x"
    broken.append((t, "'workingDir' was unexpected"))
    t = json.loads(json.dumps(tj))
    t["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "1"}]
    broken.append((t, "reserved"))
    p = json.loads(json.dumps(pj))
    p["spec"]["nprocPerNode"] = 8
    broken.append((p, "is not of type 'string'"))
    p = json.loads(json.dumps(pj))
    p["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    broken.append((p, "Master replicas must be 1"))
    p = json.loads(json.dumps(pj))
    p["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "x"
    broken.append((p, "no container named pytorch"))
    for doc, reason in broken:
        problems = job_problems(doc)
        assert any(reason in pr for pr in problems), (reason, problems)


# --- names, determinism, paths ------------------------------------------------------------------

def test_job_names_are_rfc1035_labels():
    assert job_name("llama3_8b.k8s") == "llama3-8b-k8s"
    assert job_name("8b-run") == "job-8b-run"
    long_a, long_b = "a" * 60 + "-x", "a" * 60 + "-y"
    assert len(job_name(long_a)) == 40 and job_name(long_a) != job_name(long_b)
    assert job_name(long_a) == job_name(long_a)  # deterministic
    assert job_name("a" * 31 + "_" + "b" * 20)[31] == "-"


def test_dotted_name_validates(spec):
    _, _, docs = planned(k8s_spec(spec, name="7b_v2.run"))
    assert docs[1]["metadata"]["name"] == "job-7b-v2-run" and job_problems(docs[1]) == []


def test_manifest_is_the_same_from_any_folder_and_holds_no_machine_path(spec, tmp_path, monkeypatch):
    path = k8s_spec(spec)
    monkeypatch.chdir(tmp_path)
    first = plan_one(path, "gen").files["trainjob.yaml"]
    assert first == plan_one(path, "gen").files["trainjob.yaml"]
    absolute = plan_one(path, str(tmp_path / "gen")).files["trainjob.yaml"]
    for text in (first, absolute):
        assert str(tmp_path) not in text and os.path.expanduser("~") not in text
    assert absolute == first  # an absolute --out is made relative to the project root like every generated path


# --- hostile values cannot change the structure -------------------------------------------------

HOSTILE = [
    "x\nkind: Secret",
    "$(rm -rf /)",
    "a\"b'c",
    "key: value # comment",
    "- item\n---\napiVersion: v1",
    "{flow: [1, 2]}",
    "\ttab and trailing space ",
    "yes",
    "$$(PET_MASTER_ADDR) and $(PET_MASTER_ADDR) and $",
    "unicode \u2028 \U0001F600 \x00",
]


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_arrive_verbatim(spec, tmp_path, api, value):
    from launcher.planning.plan import resolve
    from launcher.planning.read import SpecSource
    from launcher.targets.render import render

    source = SpecSource(path=str(tmp_path / "s.toml"), sha256="0", data={
        "version": 1, "name": "hostile", "launch": {"launcher": "kubernetes", "env": {"EVIL": value},
                                                     "kubernetes": {"api": api, "image": value, "volume_claim": value}},
        "train": {"output_dir": "out/" + value.replace("\n", " ").replace("\t", " ").replace("\x00", "")}})
    # not validate(source): a spec refuses control characters (tests/test_security.py); the emitter carries them anyway
    plan = resolve(source)
    text = render(plan, plan_dir="gen/hostile")[f"{api}.yaml"]
    cm, job = docs_of(text)  # still exactly two documents
    assert cm["kind"] == "ConfigMap" and job["kind"] == ("TrainJob" if api == "trainjob" else "PyTorchJob")
    assert json.loads(cm["data"]["plan.json"])["launch"]["env"]["EVIL"] == value
    if api == "trainjob":
        container = job["spec"]["trainer"]
        runtime = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        volumes = runtime["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"]
    else:
        container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        volumes = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"]
    assert container["image"] == value
    [evil] = [e for e in container["env"] if e["name"] == "EVIL"]
    pet = {"PET_MASTER_ADDR": "node-0"}
    assert kubelet_expand(evil["value"], pet) == value  # what the process sees, after kubelet's $(VAR) expansion
    assert [kubelet_expand(a, pet) for a in container["command"]][-1] == "/workspace/gen/hostile/plan.json"
    assert {v["name"]: v.get("persistentVolumeClaim") for v in volumes}["fp8launch-output"] == {"claimName": value}


def test_workdir_and_output_dir_with_dollar_signs_reach_the_process_verbatim(spec):
    path = k8s_spec(spec, extra='workdir = "/w$(X)"\n[train]\noutput_dir = "o$(PET_MASTER_ADDR)/{name}"\n')
    _, _, (_, job) = planned(path)
    command = [kubelet_expand(a, {"X": "bad", "PET_MASTER_ADDR": "bad"}) for a in job["spec"]["trainer"]["command"]]
    assert command[2] == "/w$(X)" and command[-1] == "/w$(X)/gen/big-run/plan.json"
    runtime = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    pod = runtime["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == "/w$(X)/o$(PET_MASTER_ADDR)/big-run"  # mountPath is not expanded


def test_yaml_emitter_round_trips_everything_it_writes():
    doc = {"a": [{"b": {}}, [], [1, [2, "x\n"]]], "on": True, "null": None, "t": "l1\nl2\n", "n": -3, "k: v": "#"}
    assert docs_of(dump_all([doc, {"z": "two\n\n"}])) == [doc, {"z": "two\n\n"}]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_reads_the_manifest_as_pyyaml_does(tmp_path):
    """kubectl parses YAML with Go's yaml library; `kubectl kustomize` does so without a cluster."""
    from launcher.planning.plan import resolve
    from launcher.planning.read import SpecSource
    from launcher.targets.render import render

    for api in ("trainjob", "pytorchjob"):
        source = SpecSource(path="s.toml", sha256="0", data={"version": 1, "name": "k", "launch": {
            "launcher": "kubernetes", "env": {"A": HOSTILE[0], "B": HOSTILE[4], "C": HOSTILE[9]},
            "kubernetes": {"api": api, "image": HOSTILE[3], "volume_claim": "c"}}})  # not validated: see above
        (tmp_path / "job.yaml").write_text(render(resolve(source), plan_dir="gen/k")[f"{api}.yaml"], encoding="utf-8")
        (tmp_path / "kustomization.yaml").write_text("resources:\n- job.yaml\n", encoding="utf-8")
        out = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        key = lambda d: d["kind"]  # noqa: E731
        assert sorted(docs_of(out.stdout), key=key) == sorted(docs_of((tmp_path / "job.yaml").read_text("utf-8")), key=key)


# --- plan on the command line -------------------------------------------------------------------

def test_plan_writes_the_manifest_and_a_bad_spec_writes_nothing(cli, spec, tmp_path):
    path = k8s_spec(spec, api="pytorchjob")
    r = cli("plan", "--out", "gen", path)
    assert r.exit_code == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "gen" / "big-run")) == [".fp8launch-files.json", "fsdp2.json", "plan.json", "pytorchjob.yaml",
                                                             "torchrun.sh"]
    no_image_text = Path(path).read_text().replace('image = "ghcr.io/acme/fp8launch:1"', 'image = ""').replace("big-run", "other")
    no_image = spec(no_image_text, "b.toml")
    r = cli("plan", "--out", "gen", no_image)
    assert r.exit_code == 2 and "error[K8S-IMAGE-MISSING]" in r.stderr and "launch.kubernetes.image" in r.stderr
    assert not (tmp_path / "gen" / "other").exists()


def test_plan_of_a_kubernetes_spec_imports_neither_torch_nor_yaml(tmp_path):
    code = ("import sys; from launcher.commands.plan import plan_one; plan_one(sys.argv[1], sys.argv[2]); "
            "print(sorted(m for m in ('torch', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "specs" / "llama3-8b-torchao-k8s.toml"), str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- run with kubectl (a recording stand-in) ----------------------------------------------------

@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch):
    """Put the recording kubectl first on an otherwise kubectl-free PATH; return its folder."""
    folder = tmp_path / "kubectl-state"
    bindir = tmp_path / "bin"
    folder.mkdir()
    bindir.mkdir()
    exe = bindir / "kubectl"
    fake = str(Path(__file__).parent / "fake_kubectl.py")
    exe.write_text(f"#!{sys.executable}\nimport runpy; runpy.run_path({fake!r}, run_name='__main__')\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}/bin")
    monkeypatch.setenv("FAKE_KUBECTL_DIR", str(folder))
    monkeypatch.setenv(kubectl.POLL_ENV, "0")

    class State:
        dir = folder

        def calls(self):
            path = folder / "calls.jsonl"
            return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

        def statuses(self, *conditions):
            objs = [{"status": {"conditions": [{"type": c, "status": "True"} for c in cs]}} for cs in conditions]
            (folder / "statuses.json").write_text(json.dumps(objs))

    return State()


def pods(*codes, container="node"):
    return json.dumps({"items": [{"metadata": {"name": f"p-{i}"}, "status": {"containerStatuses": [
        {"name": container, "state": {"terminated": {"exitCode": c}}}]}} for i, c in enumerate(codes)]})


def test_run_applies_the_manifest(cli, spec, fake_kubectl, tmp_path):
    r = cli("run", k8s_spec(spec, nodes=1, procs=2, device="cpu"))
    assert r.exit_code == 0, r.stderr
    assert fake_kubectl.calls() == [["apply", "-f", os.path.join("runs", "big-run", "plan", "trainjob.yaml")]]
    assert "applied trainjob big-run in namespace ml" in r.stdout
    applied = (fake_kubectl.dir / "applied.yaml").read_text()
    assert applied == (tmp_path / "runs" / "big-run" / "plan" / "trainjob.yaml").read_text()
    assert manifest_problems(applied) == []
    assert docs_of(applied)[1]["spec"]["trainer"]["command"][-1] == "/workspace/runs/big-run/plan/plan.json"


def test_run_wait_follows_until_complete(cli, spec, fake_kubectl):
    fake_kubectl.statuses(["Created"], [], ["Created", "Complete"])
    r = cli("run", "--wait", k8s_spec(spec))
    assert r.exit_code == 0, r.stderr
    gets = [c for c in fake_kubectl.calls() if c[0] == "get"]
    assert gets == [["get", "trainjobs.trainer.kubeflow.org", "big-run", "--namespace", "ml", "--output", "json"]] * 3


def test_run_wait_returns_the_failed_training_exit_code(cli, spec, fake_kubectl):
    fake_kubectl.statuses([], ["Failed"])
    (fake_kubectl.dir / "pods.json").write_text(pods(0, 4, 1))
    r = cli("run", "--wait", k8s_spec(spec))
    assert r.exit_code == 4
    assert ["get", "pods", "--namespace", "ml", "--selector", "jobset.sigs.k8s.io/jobset-name=big-run",
            "--output", "json"] in fake_kubectl.calls()


def test_run_wait_pytorchjob_failed_without_pods_is_1(cli, spec, fake_kubectl):
    fake_kubectl.statuses(["Running"], ["Running", "Failed"])
    r = cli("run", "--wait", k8s_spec(spec, api="pytorchjob"))
    assert r.exit_code == 1
    assert ["get", "pods", "--namespace", "ml", "--selector", "training.kubeflow.org/job-name=big-run",
            "--output", "json"] in fake_kubectl.calls()
    fake_kubectl.statuses(["Succeeded"])
    assert cli("run", "--wait", k8s_spec(spec, api="pytorchjob")).exit_code == 0


def test_failed_apply_is_the_exit_code_and_nothing_is_followed(cli, spec, fake_kubectl):
    (fake_kubectl.dir / "apply_rc").write_text("1")
    r = cli("run", "--wait", k8s_spec(spec))
    assert r.exit_code == 1 and [c[0] for c in fake_kubectl.calls()] == ["apply"]


def test_dry_run_prints_the_command_and_runs_nothing(cli, spec, fake_kubectl):
    r = cli("run", "--dry-run", "--wait", k8s_spec(spec))
    assert r.exit_code == 0
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "kubectl apply -f " + os.path.join("runs", "big-run", "plan", "trainjob.yaml")
    assert lines[1].startswith("kubectl get trainjobs.trainer.kubeflow.org big-run --namespace ml --output json")
    assert fake_kubectl.calls() == []


def test_missing_kubectl_exits_3_saying_what_to_install(cli, spec, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    r = cli("run", k8s_spec(spec))
    assert r.exit_code == 3
    assert "kubectl is not on PATH" in r.stderr and "install kubectl" in r.stderr


def test_node_rank_does_not_apply(cli, spec, fake_kubectl):
    r = cli("run", "--node-rank", "1", k8s_spec(spec))
    assert r.exit_code == 2 and "do not apply with launch.launcher = \"kubernetes\"" in r.stderr
    assert fake_kubectl.calls() == []


def test_run_from_a_subprocess_exits_with_the_job_code(spec, fake_kubectl, tmp_path):
    fake_kubectl.statuses(["Failed"])
    (fake_kubectl.dir / "pods.json").write_text(pods(75))
    r = run_module("run", "--wait", k8s_spec(spec), cwd=tmp_path)
    assert r.returncode == 75, r.stderr
    assert "Traceback" not in r.stderr


def test_state_and_exit_code_read_the_apis_fields():
    assert kubectl.state({"status": {"conditions": [{"type": "Complete", "status": "False"}]}}, "trainjob") == "running"
    assert kubectl.state({"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}, "pytorchjob") == "succeeded"
    assert kubectl.state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}, "pytorchjob") == "running"
    restarted = {"items": [{"metadata": {"name": "a"}, "status": {"containerStatuses": [
        {"name": "sidecar", "state": {"terminated": {"exitCode": 9}}},
        {"name": "pytorch", "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 4}}}]}}]}
    assert kubectl.exit_code(restarted, "pytorch") == 4
    assert kubectl.exit_code({"items": []}, "node") == 1
    ref = JobRef(api="pytorchjob", name="x", namespace="n")
    assert (ref.resource, ref.container) == ("pytorchjobs.kubeflow.org", "pytorch")


def test_follow_gives_up_after_repeated_kubectl_failures(fake_kubectl):
    (fake_kubectl.dir / "statuses.json").write_text("not json")  # every `get` fails
    from launcher.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="failed 6 times in a row"):
        kubectl.follow(JobRef(api="trainjob", name="x", namespace="n"), dict(os.environ), sleep=lambda s: None)
