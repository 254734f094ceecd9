"""Specs built from the schema itself, for the hostile tests: every field a spec holds, walked from
launcher/planning/read.py's `schema()` (map values such as launch.env's and array items included), so a key added later
is covered without a line here; a spec that sets one field with its containers made valid around it; and hypothesis
strategies of spec documents, hostile and plausible, for property tests.

    for f in string_fields():                      # Field(path=("launch", "env", MAP_KEY), node={"type": "string"})
        spec = put(base(), f.path, "$(touch PWNED)")
    @given(documents())                            # dicts a TOML / JSON spec parses to
"""

from __future__ import annotations

import copy
import json
import string
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from launcher.planning.read import schema

ITEM = 0
"""The path part of an array's item."""
MAP_KEY = "FP8_FIELD"
"""The path part of a map's value (launch.env.FP8_FIELD)."""


@dataclass(frozen=True)
class Field:
    path: tuple
    node: dict

    @property
    def dotted(self) -> str:
        """As read.py's messages name it: $.launch.env.FP8_FIELD, $.precision.rules[0].match."""
        return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.path)

    @property
    def is_free_string(self) -> bool:
        """A string the user writes (not an enum's choice)."""
        return self.node.get("type") == "string" and "enum" not in self.node


def fields(node: dict | None = None, path: tuple = ()) -> list[Field]:
    """Every leaf of the schema: a key whose value is not a table of known keys, an array's items, a map's values, each
    table alternative of a oneOf (log.wandb = true or a table)."""
    node = schema() if node is None else node
    out: list[Field] = []
    for key, sub in node.get("properties", {}).items():
        if key == "$schema":
            out.append(Field(path + (key,), sub))
            continue
        tables = [alt for alt in sub.get("oneOf", []) if alt.get("type") == "object" and "properties" in alt]
        if sub.get("type") == "object" and "properties" in sub:
            out += fields(sub, path + (key,))
        elif isinstance(sub.get("additionalProperties"), dict):
            out.append(Field(path + (key, MAP_KEY), sub["additionalProperties"]))
        elif sub.get("type") == "array" and isinstance(sub.get("items"), dict):
            items = sub["items"]
            out += fields(items, path + (key, ITEM)) if "properties" in items else [Field(path + (key, ITEM), items)]
        else:
            out.append(Field(path + (key,), sub))
        for alt in tables:
            out += fields(alt, path + (key,))
    return out


def string_fields() -> list[Field]:
    return [f for f in fields() if f.is_free_string]


def base(**sections: dict) -> dict:
    """The smallest spec that plans, with `sections` merged in (e.g. launch={"launcher": "slurm"})."""
    spec: dict = {"version": 1, "name": "inj"}
    for key, value in sections.items():
        spec[key] = copy.deepcopy(value)
    return spec


def _node_at(path: tuple) -> dict:
    node = schema()
    for part in path:
        if isinstance(part, int):
            node = node["items"]
        elif part == MAP_KEY and isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            sub = node.get("properties", {}).get(part)
            if sub is None:  # a oneOf's table
                sub = next(alt["properties"][part] for alt in node.get("oneOf", []) if part in alt.get("properties", {}))
            node = sub
    return node


def sample(node: dict, keep: str | None = None) -> Any:
    """A small valid value of `node`; for a table, its required keys, choosing the oneOf alternative that holds `keep`
    (so that setting `keep` afterwards leaves it valid: a rule's `recipe`, not its `mode`)."""
    if "enum" in node:
        return node["enum"][0]
    if "default" in node and node["default"] not in ("", [], {}):
        return copy.deepcopy(node["default"])
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        required = list(node.get("required", []))
        alternatives = [alt.get("required", []) for alt in node.get("oneOf", [])]
        if alternatives:
            required += next((a for a in alternatives if keep in a), alternatives[0])
        return {k: sample(node["properties"][k]) for k in required if k != keep}
    if kind == "integer":
        return max(node.get("minimum", 1), 1)
    if kind == "number":
        return 0.5
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    return "x"


def put(spec: dict, path: tuple, value: Any) -> dict:
    """`spec` (changed in place and returned) with `value` at `path`: tables made (or a scalar in the way replaced) on
    the way, an array's first item made from its schema (its required keys, in the oneOf that holds the key set)."""
    node = spec
    for i, part in enumerate(path[:-1]):
        if isinstance(part, int):
            continue  # the step before went into the item
        if isinstance(path[i + 1], int):
            items = node.get(part)
            if not isinstance(items, list):
                items = node[part] = []
            if i + 2 == len(path):
                items[:1] = [value]
                return spec
            if not items or not isinstance(items[0], dict):
                items[:1] = [sample(_node_at(path[: i + 2]), keep=path[i + 2])]
            node = items[0]
        else:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
    node[path[-1]] = value
    return spec


# --- hypothesis strategies ----------------------------------------------------------------------------------------

HOSTILE_TEXT = ["$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "a\nb", "a\rb", "a\0b", "\u2028", "\x1b[31m", "it's",
                '"quoted"', "\\", "--x\" --uid=0 \"", "#", "hetjob", "${HOME}", "*", " ", "", "..", "../../etc", "/dev/zero",
                "x" * 300, "builtin:llama-debug?layers=99999999999999", "hf:/nonexistent", "localhost:99999"]
"""Strings a careless or hostile user writes."""

HOSTILE_NUMBERS = [0, -1, 1, 2, 3, 7, 8, 4096, 4097, 65536, 2**31 - 1, 2**31, 2**53, 2**63 - 1, 2**63, 10**30, -10**30,
                   0.5, 1e-300, 1e308, -1e308, float("nan"), float("inf"), float("-inf")]
"""Numbers at and past every bound the schema and the plan know."""


def hostile_values() -> st.SearchStrategy:
    return st.one_of(st.sampled_from(HOSTILE_TEXT), st.sampled_from(HOSTILE_NUMBERS), st.booleans(), st.none(),
                     st.text(string.printable, max_size=20), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                     st.lists(st.sampled_from(HOSTILE_TEXT + [1, 0.5]), max_size=3),
                     st.dictionaries(st.sampled_from(["a", "A_B", "x y", "\n"]), st.sampled_from(HOSTILE_TEXT), max_size=2))


def field_values(field: Field) -> st.SearchStrategy:
    """Values for `field`: mostly of its own kind (so that planning goes past the schema), its enum's, hostile ones."""
    node = field.node
    own: list[st.SearchStrategy] = []
    if "enum" in node:
        own.append(st.sampled_from(node["enum"]))
    kind = node.get("type")
    if kind == "integer":
        low = node.get("minimum", 0)
        own.append(st.integers(low, low + 16))
        own.append(st.sampled_from([v for v in HOSTILE_NUMBERS if isinstance(v, int)]))
    elif kind == "number":
        own.append(st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1))
    elif kind == "boolean":
        own.append(st.booleans())
    elif kind == "string":
        own.append(st.sampled_from(HOSTILE_TEXT))
        if "default" in node:
            own.append(st.just(node["default"]))
    return st.one_of(*own, hostile_values()) if own else hostile_values()


@st.composite
def documents(draw, max_fields: int = 6) -> dict:
    """A spec document: `version` and `name` (usually valid), then up to `max_fields` fields of the schema each with a
    value of its kind or a hostile one, sometimes an unknown key or a section replaced by a scalar."""
    spec: dict = {}
    if draw(st.integers(0, 9)):
        spec["version"] = 1 if draw(st.integers(0, 5)) else draw(hostile_values())
    if draw(st.integers(0, 9)):
        spec["name"] = "prop" if draw(st.integers(0, 3)) else draw(st.sampled_from(HOSTILE_TEXT))
    every = fields()
    for _ in range(draw(st.integers(0, max_fields))):
        field = draw(st.sampled_from(every))
        put(spec, field.path, draw(field_values(field)))
    if not draw(st.integers(0, 7)):
        spec[draw(st.sampled_from(["unknown", "trian", "precision"]))] = draw(hostile_values())
    return spec


def toml_or_json(spec: dict) -> tuple[str, str]:
    """(suffix, text) of `spec` written as JSON (allow_nan: Python's NaN / Infinity, which a reader must refuse)."""
    return ".json", json.dumps(spec, allow_nan=True)
