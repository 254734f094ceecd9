"""Read a spec file into plain data, apply --set overrides, and validate it against the schema.

Every problem is collected and reported together, each located as `FILE:LINE: error: $.path: ...`.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import os
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

from launcher.errors import InputError, Problem, SpecError
from launcher.planning.backends import BACKENDS
from launcher.planning.models import parse_builtin
from launcher.planning.sourcemap import Path, json_lines, locate, toml_lines
from launcher.planning.suggest import closest, did_you_mean

MAX_SPEC_BYTES = 1 << 20  # a precision spec is a few KiB; anything this large is a mistake


SCHEMA_FILE = "schema.json"
"""The JSON Schema of spec version 1, in this package (launcher/planning/schema.json)."""


def schema_text() -> str:
    return resources.files("launcher.planning").joinpath(SCHEMA_FILE).read_text("utf-8")


def schema() -> dict:
    """The JSON Schema of spec version 1, shipped inside the package, with precision.backend's enum taken from the
    backend records: the built-in ones schema.json names, and any registered since (launcher/planning/backends.py)."""
    return _schema(tuple(BACKENDS))


@cache
def _schema(backends: tuple[str, ...]) -> dict:
    data = json.loads(schema_text())
    data["properties"]["precision"]["properties"]["backend"]["enum"] = list(backends)
    return data


@dataclass(frozen=True, slots=True)
class SpecSource:
    """A spec as read from disk: its data, where each key was written, and its bytes' digest."""

    path: str
    data: dict
    sha256: str
    lines: dict[Path, int] = field(default_factory=dict)
    overridden: dict[Path, str] = field(default_factory=dict)  # path -> the --set text that set it

    def line(self, path: Path) -> int | None:
        return None if path in self.overridden else locate(self.lines, path)


def read_spec(path: str) -> SpecSource:
    """Read a TOML or JSON spec; raise SpecError with a located message if it cannot be read."""
    import hashlib

    def fail(message: str, line: int | None = None) -> SpecError:
        return SpecError([Problem(path, message, line=line)])

    if not os.path.exists(path):
        raise fail("no such file; give the path of a .toml or .json spec")
    if os.path.isdir(path):
        raise fail("is a directory; give the path of a .toml or .json spec file")
    size = os.path.getsize(path)
    if size > MAX_SPEC_BYTES:
        raise fail(f"is {size} bytes; a spec is at most {MAX_SPEC_BYTES} bytes (is this the right file?)")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise fail(f"cannot be read: {e.strerror}") from None
    if not raw.strip():
        raise fail("is empty; a spec needs at least `version = 1` and `name = \"...\"`")
    if b"\0" in raw:
        raise fail("is a binary file, not a TOML or JSON spec")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise fail(f"is not UTF-8 text (byte {e.start}); save the spec as UTF-8") from None

    is_json = path.lower().endswith(".json") or (not path.lower().endswith(".toml") and text.lstrip().startswith("{"))
    if is_json:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise fail(f"invalid JSON: {e.msg} (column {e.colno})", e.lineno) from None
        lines = json_lines(text)
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            line = getattr(e, "lineno", None) or _line_from_toml_message(str(e))
            hint = " (JSON specs need a .json suffix)" if text.lstrip().startswith("{") else ""
            raise fail(f"invalid TOML: {str(e).split(' (at')[0]}{hint}", line) from None
        lines = toml_lines(text)
    if not isinstance(data, dict):
        raise fail("the top level must be a table/object of keys")
    return SpecSource(path=path, data=_normalize(data), sha256=hashlib.sha256(raw).hexdigest(), lines=lines)


def _line_from_toml_message(message: str) -> int | None:
    import re

    m = re.search(r"line (\d+)", message)
    return int(m.group(1)) if m else None


def _normalize(value: Any) -> Any:
    """TOML -> JSON-compatible values (TOML times such as `time = 04:00:00` become strings)."""
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, (_dt.date, _dt.time, _dt.datetime)):
        return value.isoformat()
    return value


def parse_override(text: str) -> tuple[Path, Any]:
    """`a.b.c=VALUE` -> (("a","b","c"), value). VALUE is a TOML value where it parses, else a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise SpecError([Problem("--set", f"'{text}' is not KEY=VALUE with a dotted key, e.g. --set train.steps=10")])
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return tuple(key.split(".")), _normalize(value)


def _schema_type(path: Path) -> Any:
    """The JSON Schema `type` of the key at `path` (through `additionalProperties` for maps such as launch.env), or None."""
    node: Any = schema()
    for part in path:
        props = node.get("properties", {}) if isinstance(node, dict) else {}
        node = props.get(part, node.get("additionalProperties") if isinstance(node, dict) else None)
        if not isinstance(node, dict):
            return None
    return node.get("type")


def apply_overrides(source: SpecSource, overrides: list[str]) -> SpecSource:
    """A copy of `source` with each `--set KEY=VALUE` applied (last one wins). Where the schema wants a string
    (launch.env values, names, paths), VALUE is taken as written: `--set launch.env.OMP_NUM_THREADS=1` sets "1"."""
    data = json.loads(json.dumps(source.data))
    overridden = dict(source.overridden)
    problems = []
    for text in overrides:
        path, value = parse_override(text)
        if not isinstance(value, str) and not isinstance(value, (list, dict)) and _schema_type(path) == "string":
            value = text.partition("=")[2].strip()
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(Problem("--set", f"{'.'.join(path[: i + 1])} is not a table, so {'.'.join(path)} cannot be set",
                                        path="$." + ".".join(path)))
                break
            node = child
        else:
            node[path[-1]] = value
            overridden[path] = text
    if problems:
        raise SpecError(problems)
    return SpecSource(source.path, data, source.sha256, source.lines, overridden)


def validate(source: SpecSource) -> None:
    """Raise SpecError listing every schema violation of `source`, sorted by line."""
    validator = jsonschema.Draft202012Validator(schema())
    problems: list[Problem] = []
    for error in validator.iter_errors(source.data):
        problems.extend(_problems(source, error))
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.path))
        raise SpecError(_dedupe(problems))


def check_builtin_model(source: SpecSource) -> None:
    """A builtin model name is known without torch: catch a typo at plan time, with did-you-mean."""
    model = source.data.get("train", {}).get("model", "")
    if model.startswith("builtin:"):
        try:
            parse_builtin(model)
        except InputError as e:
            line = source.line(("train", "model"))
            raise SpecError([Problem(source.path, f"{e.detail}; fix: {e.fix}", path="$.train.model", line=line)]) from None


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if (p.path, p.message) not in seen:
            seen.add((p.path, p.message))
            out.append(p)
    return out


def dotted(path: Path) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _problems(source: SpecSource, error: jsonschema.ValidationError) -> list[Problem]:
    path: Path = tuple(error.absolute_path)

    def problem(message: str, at: Path = path) -> Problem:
        where = tuple(str(p) for p in at)
        origin = source.overridden.get(where)
        suffix = f" (from --set {origin})" if origin else ""
        return Problem(source.path, message + suffix, path=dotted(at), line=source.line(where))

    kind, schema_node = error.validator, error.schema
    if kind == "additionalProperties" and isinstance(error.instance, dict):
        known = list(schema_node.get("properties", {}))
        return [problem(f"unknown key '{key}'{_did_you_mean_key(key, known, path)}", path + (key,))
                for key in error.instance if key not in known]
    if kind == "enum":
        options = ", ".join(json.dumps(v) for v in error.validator_value)
        hint = _did_you_mean(error.instance, error.validator_value)
        return [problem(f"{json.dumps(error.instance)} is not one of {options}{hint}")]
    if kind == "const":
        return [problem(f"must be {json.dumps(error.validator_value)}, got {json.dumps(error.instance)}")]
    if kind == "type":
        expected = error.validator_value
        return [problem(f"expected {_type_name(expected)}, got {_type_name_of(error.instance)} {json.dumps(error.instance)}")]
    if kind == "required":
        missing = error.message.split("'")[1]
        example = {"version": "version = 1", "name": 'name = "my-job"'}.get(missing, f"{missing} = ...")
        return [problem(f"missing required key '{missing}'; add `{example}`")]
    if kind == "pattern":
        desc = schema_node.get("description", "")
        value = json.dumps(error.instance)
        return [problem(f"{value} has the wrong form: {desc}" if desc else f"{value} does not match {schema_node['pattern']}")]
    if kind in ("minimum", "exclusiveMinimum", "maximum", "minLength", "uniqueItems", "propertyNames"):
        return [problem(_bound_message(kind, error))]
    return [problem(error.message)]


def _bound_message(kind: str, error: jsonschema.ValidationError) -> str:
    v = error.validator_value
    return {
        "minimum": f"must be >= {v}, got {json.dumps(error.instance)}",
        "exclusiveMinimum": f"must be > {v}, got {json.dumps(error.instance)}",
        "maximum": f"must be <= {v}, got {json.dumps(error.instance)}",
        "minLength": "must not be empty",
        "uniqueItems": "has duplicate entries",
        "propertyNames": f"{error.message}; environment variable names are letters, digits and '_'",
    }[kind]


_TYPE_NAMES = {"boolean": "true or false", "integer": "an integer", "number": "a number", "string": "a string",
               "array": "an array", "object": "a table"}


def _type_name(expected: str | list) -> str:
    if isinstance(expected, list):
        return " or ".join(_TYPE_NAMES.get(t, t) for t in expected)
    return _TYPE_NAMES.get(expected, expected)


def _type_name_of(value: Any) -> str:
    for t, py in (("boolean", bool), ("integer", int), ("number", float), ("string", str), ("array", list), ("object", dict)):
        if isinstance(value, py):
            return {"object": "table", "array": "array", "boolean": "boolean"}.get(t, t)
    return type(value).__name__


# What people write for our enum values (other tools' spellings); checked before spelling distance.
ALIASES = {"gpu": "cuda", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
           "float8": "fp8", "fsdp": "fsdp2", "fully_shard": "fsdp2", "zero": "deepspeed", "transformer_engine": "te",
           "transformer-engine": "te", "ms-amp": "msamp", "ao": "torchao", "tensor": "tensorwise", "row": "rowwise"}


def _did_you_mean(value: Any, options: list) -> str:
    if not isinstance(value, str):
        return ""
    strs = [str(o) for o in options]
    alias = ALIASES.get(value.lower())
    if alias in strs and not any(o.lower() == value.lower() for o in strs):
        return f" (did you mean {json.dumps(alias)}?)"
    return did_you_mean(value, strs, show=json.dumps)


def _did_you_mean_key(key: str, siblings: list[str], parent: Path) -> str:
    match = closest(key, siblings)
    if match is not None:
        return f" (did you mean '{match}'?)"
    elsewhere = [p for p in _all_paths() if p[-1] == key and p[:-1] != parent]
    if elsewhere:
        return f" (did you mean '{'.'.join(elsewhere[0])}'? it belongs in [{'.'.join(elsewhere[0][:-1])}])"
    return f"; valid keys here: {', '.join(sorted(siblings))}"


@cache
def _all_paths() -> tuple[Path, ...]:
    """Every key path the schema defines."""
    out: list[Path] = []

    def walk(node: dict, prefix: Path) -> None:
        for k, sub in node.get("properties", {}).items():
            out.append(prefix + (k,))
            if isinstance(sub, dict):
                walk(sub, prefix + (k,))

    walk(schema(), ())
    return tuple(out)


@cache
def _defaults_text() -> str:
    return json.dumps(defaults(schema()))


def nested(flat: dict[str, Any]) -> dict:
    """A spec's tables from dotted keys: {"precision.torchao.recipe": "rowwise"} -> {"precision": {"torchao": {...}}}
    (each value copied, so the spec shares nothing with `flat`)."""
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return out


def choices(key: str) -> tuple:
    """The values the schema allows for a dotted key (its enum)."""
    node = schema()
    for part in key.split("."):
        node = node["properties"][part]
    return tuple(node["enum"])


def recipes(backend: str) -> tuple[str, ...]:
    """Every recipe of an FP8 backend, in the schema's order: the one list doctor, tune and the rules use (a registered
    backend without a table of its own: its default recipe)."""
    b = BACKENDS[backend]
    return choices(b.recipe_key) if b.recipe_key else (b.default_recipe,)


def settings(backend: str) -> tuple[str, ...]:
    """The keys of an FP8 backend's own table (precision.<section>), in the schema's order; none without one."""
    b = BACKENDS[backend]
    return tuple(schema()["properties"]["precision"]["properties"][b.section]["properties"]) if b.section else ()


def defaults(node: dict | None = None) -> dict:
    """The default value of every key, as a nested dict, from the schema's `default`s (a fresh copy each call)."""
    if node is None:
        return json.loads(_defaults_text())
    out = {}
    for key, sub in node.get("properties", {}).items():
        if sub.get("type") == "object" and "properties" in sub:
            out[key] = defaults(sub)
        elif "default" in sub:
            out[key] = sub["default"]
    return out
