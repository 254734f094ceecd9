"""The Plan's types say what the schema says: every field whose schema key has an enum is a `Literal` of exactly
the enum's values, and every enum of the schema has such a field (issue 29)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from conftest import REPO
from launcher.planning.plan import Plan, resolve
from launcher.planning.read import read_spec, schema, validate
from support import plan_from

SCHEMA_ENUMS_WITHOUT_A_FIELD: dict[str, str] = {
    # A schema key with an enum that no Plan field carries, with the reason. Empty: every enum is a Literal field.
}


def _unwrap_optional(hint):
    """X for `X | None`, else the hint."""
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return hint


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(_hints(cls))


def literal_fields(cls=Plan, prefix: str = "") -> dict[str, tuple]:
    """Dotted key -> the Literal's values, for every Literal-typed field under `cls` (dataclasses and TypedDicts,
    recursively). An array's items are `key[]`: precision.rules[].mode, precision.te.swap[]."""
    out: dict[str, tuple] = {}
    hints = _hints(cls)
    for name in _field_names(cls):
        key, hint = prefix + name, _unwrap_optional(hints[name])
        if typing.get_origin(hint) is tuple:
            key, hint = key + "[]", _unwrap_optional(typing.get_args(hint)[0])
        if typing.get_origin(hint) is typing.Literal:
            out[key] = typing.get_args(hint)
        elif dataclasses.is_dataclass(hint) or typing.is_typeddict(hint):
            out |= literal_fields(hint, key + ".")
    return out


def schema_enums(node: dict | None = None, prefix: str = "") -> dict[str, list]:
    """Dotted key -> enum, for every property of the schema with one (array items as `key[]`; the alternatives of
    a oneOf, such as log.wandb's table, under the same key)."""
    node = schema() if node is None else node
    out: dict[str, list] = {}
    if "enum" in node:
        out[prefix] = node["enum"]
    for key, sub in node.get("properties", {}).items():
        out |= schema_enums(sub, f"{prefix}.{key}" if prefix else key)
    if isinstance(node.get("items"), dict):
        out |= schema_enums(node["items"], prefix + "[]")
    for alternative in node.get("oneOf", []):
        out |= schema_enums(alternative, prefix)
    return out


FIELDS, ENUMS = literal_fields(), schema_enums()


def test_the_walks_find_the_enums_they_should():
    # The walks themselves: nested configs, array items of dataclasses and of Literals, a TypedDict, an int enum.
    for key in ("precision.mode", "precision.te.recipe", "precision.rules[].mode", "precision.schedule[].mode",
                "precision.schedule[].rules[].mode", "precision.te.swap[]", "distributed.deepspeed.zero_stage",
                "log.wandb.mode"):
        assert key in FIELDS and key in ENUMS, key
    assert len(ENUMS) >= 30


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_a_literal_field_has_exactly_its_schema_enum(key):
    assert key in ENUMS, f"{key}: a Literal field whose schema key has no enum"
    assert set(FIELDS[key]) == set(ENUMS[key]), key
    assert len(FIELDS[key]) == len(ENUMS[key]), f"{key}: a value twice"


def test_every_schema_enum_is_a_literal_field():
    assert set(SCHEMA_ENUMS_WITHOUT_A_FIELD) <= set(ENUMS), "an exception names no enum of the schema"
    missing = set(ENUMS) - set(FIELDS) - set(SCHEMA_ENUMS_WITHOUT_A_FIELD)
    assert not missing, f"type these Plan fields as Literal[...] of the schema's enum (launcher/planning/plan.py): {sorted(missing)}"


def _value_at(obj, key: str):
    """The values at dotted `key` of a Plan (a list: array items spread)."""
    values = [obj]
    for part in key.split("."):
        items = part.endswith("[]")
        part = part.removesuffix("[]")
        values = [v[part] if isinstance(v, dict) else getattr(v, part) for v in values]
        if items:
            values = [x for v in values if v is not None for x in v]
    return [v for v in values if v is not None]


@pytest.mark.parametrize("spec", ["defaults", *sorted(p.name for p in (REPO / "specs").glob("*.toml"))])
def test_the_plans_values_are_members_of_their_literals(spec):
    # Resolved plans (the defaults, the shipped specs) hold only values their Literal types allow, of the same Python
    # type (zero_stage an int even where a spec writes 2.0).
    if spec == "defaults":
        plan = plan_from({"distributed": {"deepspeed": {"zero_stage": 2.0}}})
        assert type(plan.distributed.deepspeed.zero_stage) is int
    else:
        source = read_spec(str(REPO / "specs" / spec))
        validate(source)
        plan = resolve(source)
    for key, allowed in FIELDS.items():
        for value in _value_at(plan, key):
            assert value in allowed and type(value) in {type(a) for a in allowed}, (key, value)
