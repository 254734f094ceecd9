"""What the planning rules say of a spec the import holds in memory, planned as `fp8launch plan` plans it (validated,
resolved, rendered, predicted, checked), without writing it: the search behind every fix that moves a number
(planable.Nearest) asks the rules themselves whether a candidate value still fires them.

    ids = firing(spec, folder)             # {"TORCHAO-BLOCK-TOKENS", ...}: error and warning rule ids
    ids is None                            # the spec does not validate (a candidate out of the schema's bounds)
"""

from __future__ import annotations

import copy
import os

from launcher.errors import LauncherError
from launcher.planning.plan import resolve
from launcher.planning.predict import predict
from launcher.planning.read import SpecSource, check_builtin_model, validate
from launcher.planning.rules import Facts, check
from launcher.targets.render import render

from .draft import dig, put


def facts_of(spec: dict, folder: str) -> Facts | None:
    """The facts `fp8launch plan` checks its rules against, for `spec` (the spec's tables) planned in `folder`; None when
    it does not validate."""
    data = {"version": 1, "name": "imported", **copy.deepcopy(spec)}
    source = SpecSource(path=os.path.join(folder, "imported.toml"), data=data, sha256="")
    try:
        validate(source)
        check_builtin_model(source)
        plan = resolve(source)
        return Facts(plan=plan, rendered=render(plan), prediction=predict(plan, folder), spec_folder=folder)
    except LauncherError:
        return None


def firing(spec: dict, folder: str) -> dict[str, str] | None:
    """Rule id -> severity of every plan-stage rule that fires for `spec`; None when it does not validate."""
    facts = facts_of(spec, folder)
    if facts is None:
        return None
    return {f.rule.id: f.rule.severity for f in check(facts, stage="plan")}


WORLD = "(world size)"
"""A pseudo key: the world size, set as distributed.nodes x procs_per_node (whole nodes of 8 where they divide it)."""


def layout(world: int) -> tuple[int, int]:
    """(nodes, procs_per_node) for `world` processes: whole nodes of 8 where they divide it, else one node."""
    return (1, world) if world <= 8 or world % 8 else (world // 8, 8)


def value_of(spec: dict, key: str):
    if key == WORLD:
        d = spec.get("distributed", {})
        return d.get("nodes", 1) * d.get("procs_per_node", 8)
    return dig(spec, key)


def with_value(spec: dict, key: str, value) -> dict:
    """A copy of `spec` with dotted `key` (or WORLD) set to `value`."""
    out = copy.deepcopy(spec)
    if key == WORLD:
        nodes, procs = layout(value)
        out.setdefault("distributed", {}).update(nodes=nodes, procs_per_node=procs)
        return out
    put(out, key, value)
    return out


def flatten_spec(spec: dict, prefix: str = ""):
    """(dotted key, value) of every leaf of a spec's tables (a list is a leaf)."""
    for k, v in spec.items():
        if isinstance(v, dict):
            yield from flatten_spec(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v
