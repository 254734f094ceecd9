"""Validate generated Kubernetes manifests the way the API server would on create, without a cluster:
the vendored CRDs' openAPIV3Schema (tests/k8s_crds, strict about unknown fields as kubectl's
server-side field validation is), their CEL rules (x-kubernetes-validations) evaluated by hand, the
object-meta rules every object obeys, and the operators' admission webhooks' checks that the schema
does not express."""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parent / "k8s_crds"
CRD_FILES = {("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
             ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml"}
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
RESERVED_PET = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}

# Every CEL rule of the vendored CRDs, as Python. A rule missing here fails the validation: a newer
# CRD brought a rule this test has not learnt yet. `self == oldSelf` (immutable fields) holds on create.
CEL = {
    "self == oldSelf": lambda value, root: True,
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": lambda value, root: bool(DNS1035_LABEL.search(root["metadata"]["name"])),
    "size(self.metadata.name) <= 63": lambda value, root: len(root["metadata"]["name"]) <= 63,
    "self >= 1": lambda value, root: value >= 1,
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')":
        lambda value, root: value == "" or bool(re.search(r"^[A-Za-z][A-Za-z0-9+.-]*://.+$", value)),
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']":
        lambda value, root: value in ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"),
    "has(self.lastUpdatedTime)": lambda value, root: "lastUpdatedTime" in value,
}


@cache
def crd_schema(api_version: str, kind: str) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = next(d for d in yaml.load_all((CRDS / CRD_FILES[(api_version, kind)]).read_text("utf-8"), Loader=loader) if d)
    version = api_version.split("/")[1]
    [v] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert crd["spec"]["group"] == api_version.split("/")[0] and crd["spec"]["names"]["kind"] == kind
    return v["schema"]["openAPIV3Schema"]


def strict(schema: dict) -> dict:
    """The schema with unknown fields rejected wherever the CRD lists the fields (the API server
    would prune them silently, or refuse them under kubectl's strict field validation)."""
    schema = copy.deepcopy(schema)

    def visit(node):
        if isinstance(node, dict):
            if (node.get("type") == "object" and "properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(schema)
    return schema


def cel_rules_applied(schema: dict, value, root: dict, path: str = "$") -> list[tuple[str, str, bool]]:
    """(path, rule, holds) for every x-kubernetes-validations rule at a node the object has."""
    out = []
    for rule in schema.get("x-kubernetes-validations", []):
        check = CEL.get(rule["rule"])
        if check is None:
            raise AssertionError(f"{path}: CEL rule {rule['rule']!r} is new to this test: add it to CEL in {__file__}")
        out.append((path, rule["rule"], check(value, root)))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, item in value.items():
            sub = props.get(key) or (schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None)
            if sub:
                out += cel_rules_applied(sub, item, root, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += cel_rules_applied(schema["items"], item, root, f"{path}[{i}]")
    return out


def meta_problems(doc: dict, name_pattern: re.Pattern) -> list[str]:
    meta, problems = doc.get("metadata", {}), []
    if not (name_pattern.match(meta.get("name", "")) and len(meta["name"]) <= 63):
        problems.append(f"metadata.name {meta.get('name')!r} is not a valid name")
    if not DNS1123_LABEL.match(meta.get("namespace", "")):
        problems.append(f"metadata.namespace {meta.get('namespace')!r} is not a DNS-1123 label")
    for key, value in meta.get("labels", {}).items():
        prefix, _, name = key.rpartition("/")
        if (prefix and not DNS1123_SUBDOMAIN.match(prefix)) or not (LABEL_NAME.match(name) and len(name) <= 63):
            problems.append(f"label key {key!r} is invalid")
        if not isinstance(value, str) or len(value) > 63 or (value and not LABEL_NAME.match(value)):
            problems.append(f"label value {value!r} is invalid")
    return problems


def configmap_problems(doc: dict) -> list[str]:
    problems = []
    if doc.get("apiVersion") != "v1" or doc.get("kind") != "ConfigMap":
        problems.append("not a v1 ConfigMap")
    if set(doc) - {"apiVersion", "kind", "metadata", "data", "binaryData", "immutable"}:
        problems.append(f"unknown fields {sorted(set(doc) - {'apiVersion', 'kind', 'metadata', 'data'})}")
    data = doc.get("data", {})
    for key, value in data.items():
        if not (CONFIGMAP_KEY.match(key) and len(key) <= 253):
            problems.append(f"data key {key!r} is invalid")
        if not isinstance(value, str):
            problems.append(f"data[{key!r}] is not a string")
    if sum(len(k) + len(v.encode()) for k, v in data.items() if isinstance(v, str)) > 1024 * 1024:
        problems.append("data exceeds the 1 MiB ConfigMap limit")
    return problems + meta_problems(doc, DNS1123_SUBDOMAIN)


def webhook_problems(doc: dict) -> list[str]:
    """What the operators' admission webhooks check beyond the schema (trainer pkg/webhooks and
    runtime/framework/plugins/torch; training-operator v1.9 pkg/webhooks/pytorch)."""
    problems = []
    if doc["kind"] == "TrainJob":
        trainer = doc["spec"].get("trainer", {})
        reserved = sorted(RESERVED_PET & {e["name"] for e in trainer.get("env", [])})
        if reserved:
            problems.append(f"trainer.env sets reserved {reserved}")
        if not doc["spec"]["runtimeRef"].get("name"):
            problems.append("runtimeRef.name is empty")
    else:
        specs = doc["spec"]["pytorchReplicaSpecs"]
        if set(specs) - {"Master", "Worker"}:
            problems.append(f"replica types {sorted(specs)}")
        if specs.get("Master", {}).get("replicas") != 1:
            problems.append("Master replicas must be 1")
        if "Worker" in specs and specs["Worker"].get("replicas", 1) < 1:
            problems.append("Worker replicas must be at least 1")
        for rtype, rspec in specs.items():
            containers = rspec["template"]["spec"]["containers"]
            if not any(c["name"] == "pytorch" for c in containers):
                problems.append(f"{rtype} has no container named pytorch")
            if any(not c.get("image") for c in containers):
                problems.append(f"{rtype} has a container without an image")
    return problems


@cache
def _validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(strict(crd_schema(api_version, kind)))


def job_problems(doc: dict) -> list[str]:
    """Everything the API server (schema, CEL, metadata) and the webhook would refuse, as text."""
    schema = crd_schema(doc["apiVersion"], doc["kind"])
    validator = _validator(doc["apiVersion"], doc["kind"])
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    problems += [f"{path}: CEL {rule} does not hold" for path, rule, holds in cel_rules_applied(schema, doc, doc) if not holds]
    return problems + meta_problems(doc, DNS1035_LABEL) + webhook_problems(doc)


def manifest_problems(text: str) -> list[str]:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if len(docs) != 2 or docs[0].get("kind") != "ConfigMap":
        return [f"expected a ConfigMap and a job, found {[d.get('kind') for d in docs]}"]
    return configmap_problems(docs[0]) + job_problems(docs[1])
