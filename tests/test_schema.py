"""The schema covers SPEC.md, documents every key, rejects unknown keys everywhere, and matches the Plan types."""

from __future__ import annotations

import json
import re

from conftest import REPO
from launcher.planning.plan import plan_field_paths
from launcher.planning.read import defaults, schema


def _objects(node, path=()):
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            yield path, node
        for key, sub in node.get("properties", {}).items():
            yield from _objects(sub, path + (key,))


def test_every_object_rejects_unknown_keys_and_every_key_is_described():
    for path, node in _objects(schema()):
        assert node["additionalProperties"] is False, path
        for key, sub in node["properties"].items():
            assert sub.get("description"), path + (key,)


def test_schema_has_every_key_of_spec_md_with_its_default():
    text = (REPO.parent / "shared" / "design" / "SPEC.md").read_text() if (REPO.parent / "shared").exists() else None
    d = defaults()
    expected = {
        ("precision", "mode"): "bf16", ("precision", "backend"): "torchao", ("precision", "torchao", "recipe"): "tensorwise",
        ("precision", "te", "recipe"): "delayed", ("precision", "te", "amax_history_len"): 1024,
        ("precision", "msamp", "opt_level"): "O2", ("distributed", "strategy"): "fsdp2", ("distributed", "procs_per_node"): 8,
        ("distributed", "deepspeed", "zero_stage"): 2, ("distributed", "deepspeed", "reduce_bucket_size"): 500000000,
        ("launch", "rdzv_endpoint"): "localhost:29500", ("launch", "slurm", "time"): "04:00:00",
        ("train", "model"): "builtin:llama-debug", ("train", "seq_len"): 2048, ("train", "lr"): 3e-4,
        ("train", "output_dir"): "runs/{name}", ("train", "resume"): "auto", ("train", "keep_checkpoints"): 2,
        ("precision", "te", "swap"): ["linear", "layernorm", "rmsnorm"], ("compile", "mode"): "default",
    }
    for path, value in expected.items():
        node = d
        for p in path:
            node = node[p]
        assert node == value, path
    if text:  # every `key = ` written in SPEC.md's example exists in the schema at that table
        table, keys = (), set()
        for line in text.split("```toml")[1].split("```")[0].splitlines():
            if m := re.match(r"^\[([a-z0-9_.]+)\]", line):
                table = tuple(m.group(1).split("."))
            elif m := re.match(r"^([a-z_0-9]+)\s*=", line):
                keys.add(table + (m.group(1),))
        props = _all(schema())
        assert keys and keys <= props, keys - props


def _all(node, prefix=()):
    out = set()
    for k, sub in node.get("properties", {}).items():
        out.add(prefix + (k,))
        out |= _all(sub, prefix + (k,))
    return out


def test_plan_types_match_the_schema():
    schema_paths = {p for p in _all(schema()) if p != ("$schema",) and not (p[:2] == ("launch", "env") and len(p) > 2)}
    assert plan_field_paths() == schema_paths


def test_schema_command_prints_the_shipped_schema(cli):
    r = cli("schema")
    assert r.exit_code == 0
    assert json.loads(r.stdout) == schema()


def test_schema_line_in_json_specs_is_accepted(cli, spec):
    path = spec(json.dumps({"$schema": "https://fp8launch.dev/schema/spec-v1.json", "version": 1, "name": "s"}), name="s.json")
    assert cli("plan", path).exit_code == 0


def test_docs_spec_reference_is_generated_from_the_schema(cli):
    r = cli("schema", "--format", "markdown")
    assert r.exit_code == 0
    assert (REPO / "docs" / "spec-reference.md").read_text() == r.stdout
    assert ("| `recipe` | \"tensorwise\" \\| \"rowwise\" \\| \"rowwise_with_gw_hp\" \\| \"mxfp8\" \\| \"nvfp4\" | "
            "`\"tensorwise\"` |") in r.stdout


def test_readme_lists_every_rule():
    from launcher.planning.rules import RULES

    readme = (REPO / "README.md").read_text()
    assert all(f"| {r.id} | {r.severity if r.stage == 'plan' else r.severity + ' at run'} |" in readme for r in RULES)


def test_every_integer_key_is_bounded_and_the_bounds_are_the_planners():
    """Integers are bounded where the schema says so (editors show it): block and stage counts by the most blocks a model
    may have, ranks and degrees by torch.distributed's C ints, slurm.signal_seconds by sbatch's uint16, the rest by 64 bits."""
    from launcher.planning.models import MAX_LAYERS
    from launcher.planning.read import MAX_INT, MAX_RANKS
    from tests.hostile.specs import fields

    maxima = {f.dotted: f.node.get("maximum") for f in fields() if f.node.get("type") == "integer"}
    assert None not in maxima.values(), [k for k, v in maxima.items() if v is None]
    assert {k for k, v in maxima.items() if v == MAX_LAYERS} == {
        "$.precision.keep_first_blocks", "$.precision.keep_last_blocks", "$.precision.schedule[0].keep_last_blocks",
        "$.distributed.pipeline_parallel", "$.distributed.pipeline.layers_per_stage[0]", "$.distributed.pipeline.stages_per_rank"}
    assert {k for k, v in maxima.items() if v == MAX_RANKS} == {
        "$.distributed.nodes", "$.distributed.procs_per_node", "$.distributed.tensor_parallel", "$.distributed.expert_parallel",
        "$.distributed.context_parallel", "$.launch.slurm.gpus_per_node", "$.launch.slurm.cpus_per_task"}
    assert maxima["$.launch.slurm.signal_seconds"] == 65535
    assert set(maxima.values()) == {MAX_LAYERS, MAX_RANKS, 65535, MAX_INT}
    assert schema()["properties"]["distributed"]["properties"]["pipeline"]["properties"]["layers_per_stage"]["maxItems"] == MAX_LAYERS
