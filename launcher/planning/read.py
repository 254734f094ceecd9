"""Read a spec file into plain data, apply --set overrides, and validate it against the schema.

Every problem is collected and reported together, each located as `FILE:LINE: error: $.path: ...`.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import jsonschema.validators

from launcher.errors import InputError, Problem, SpecError
from launcher.planning import bounded
from launcher.planning.backends import BACKENDS
from launcher.planning.models import parse_builtin
from launcher.planning.sourcemap import Path, json_duplicates, json_lines, locate, toml_lines
from launcher.planning.suggest import closest, did_you_mean

MAX_SPEC_BYTES = 1 << 20  # a precision spec is a few KiB; anything this large is a mistake
MAX_DEPTH = 16
"""Tables and arrays nest at most this deep in a spec (the schema's deepest key, precision.schedule[].rules[].match,
is 5 deep): deeper is refused before anything recursive reads it."""
MAX_INT = 2**63 - 1
"""An integer anywhere in a spec is at most this in magnitude: TOML's own range, and what every engine reads."""
MAX_RANKS = 2**31 - 1
"""The most processes a job may have, and so the bound of each parallel degree: torch.distributed's ranks and world
size are C ints."""


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
    try:
        raw = bounded.read_bytes(path, MAX_SPEC_BYTES)
    except bounded.Unreadable as e:
        if e.size is not None:
            raise fail(f"is {e.size} bytes; a spec is at most {MAX_SPEC_BYTES} bytes (is this the right file?)") from None
        raise fail(f"{e.strerror}; give the path of a .toml or .json spec file") from None
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
    try:
        data = _parse(text, is_json, fail)
    except RecursionError:
        raise fail(f"nests tables or arrays deeper than Python reads; a spec is at most {MAX_DEPTH} levels deep") from None
    if not isinstance(data, dict):
        raise fail("the top level must be a table/object of keys")
    deep = bounded.too_deep(data, MAX_DEPTH)
    if deep is not None:
        raise fail(f"{dotted(deep[:MAX_DEPTH])}: nested more than {MAX_DEPTH} levels deep; a spec's tables are a few levels deep")
    lines = json_lines(text) if is_json else toml_lines(text)
    return SpecSource(path=path, data=_normalize(data), sha256=hashlib.sha256(raw).hexdigest(), lines=lines)


def _parse(text: str, is_json: bool, fail) -> Any:
    """The data of a spec's text; `fail(message, line)` makes the error of a text that does not parse."""
    if is_json:
        try:
            return json.loads(text, object_pairs_hook=bounded.unique_keys)
        except bounded.DuplicateKey as e:
            where = json_duplicates(text)
            path, line = where[0] if where else ((e.key,), None)
            raise fail(f"{dotted(path)}: written twice in one object (the first on line {locate(json_lines(text), path)}); JSON "
                       "readers keep only the last, DeepSpeed refuses it; fix: keep one", line) from None
        except json.JSONDecodeError as e:
            raise fail(f"invalid JSON: {e.msg} (column {e.colno})", e.lineno) from None
        except ValueError:  # Python reads no integer of more than 4300 digits
            raise fail("invalid JSON: a number of more than 4300 digits") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", None) or _line_from_toml_message(str(e))
        hint = " (JSON specs need a .json suffix)" if text.lstrip().startswith("{") else ""
        raise fail(f"invalid TOML: {str(e).split(' (at')[0]}{hint}", line) from None
    except ValueError:  # Python reads no integer of more than 4300 digits
        raise fail("invalid TOML: a number of more than 4300 digits") from None


def _line_from_toml_message(message: str) -> int | None:
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
        raise SpecError([Problem("--set", f"'{one_line(text)}' is not KEY=VALUE with a dotted key, e.g. --set train.steps=10")])
    if (char := control_character(text)) is not None:
        raise SpecError([Problem("--set", f"'{one_line(text)}' holds {char}; {ONE_LINE}")])
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    except (RecursionError, ValueError):  # arrays nested past Python's stack, an integer of more than 4300 digits
        raise SpecError([Problem("--set", f"{key}: the value is nested more than {MAX_DEPTH} levels deep or has more than "
                                          "4300 digits; fix: give a value a spec can hold")]) from None
    return tuple(key.split(".")), _normalize(value)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What no string of a spec holds: control characters (C0, DEL, C1: line breaks, tabs, NUL, escapes), Unicode's line
and paragraph separators (line breaks to YAML and to editors), and the bidirectional overrides that make a line read
otherwise than it runs. Every string of a spec is one line of a generated file, a command word or a path."""

_CHARACTER_NAMES = {"\n": "a newline (\\n)", "\r": "a carriage return (\\r)", "\t": "a tab (\\t)", "\0": "a NUL character (\\0)",
                    "\x1b": "an escape character (\\x1b)"}

ONE_LINE = "names, paths and commands are one line of printable characters; fix: remove it"


def control_character(text: str) -> str | None:
    """The first character of `text` that no string of a spec may hold, in words ("a newline (\\n)"), or None."""
    m = _CONTROL.search(text)
    if m is None:
        return None
    c = m.group()
    return _CHARACTER_NAMES.get(c, f"a control character (U+{ord(c):04X})")


def one_line(text: str, keep: int = 120) -> str:
    """`text` on one line, for a message: control characters escaped, and cut after `keep` characters."""
    shown = _CONTROL.sub(lambda m: json.dumps(m.group())[1:-1] if m.group() in "\n\r\t" else f"\\u{ord(m.group()):04x}", text)
    return shown if len(shown) <= keep else f"{shown[:keep]}... ({len(text)} characters)"


def _show(value: Any) -> str:
    """A value as a message shows it: JSON, on one line, cut short."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        digits = str(abs(value))
        return f"{'-' if value < 0 else ''}{digits[:4]}... ({len(digits)} digits)"
    return one_line(json.dumps(value, ensure_ascii=False), 80)


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


def _full_pattern(validator: Any, pattern: str, instance: Any, schema_node: dict):
    """`pattern` as the schema's dialect (ECMAScript regular expressions) reads its anchored patterns: `$` is the end of
    the string. Python's re.search lets `$` match before a final newline, so "abc\\n" matched a name's pattern."""
    if validator.is_type(instance, "string") and not re.fullmatch(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _full_pattern})
"""The schema's validator: draft 2020-12, with each `pattern` matched against the whole string."""


def _value_problems(source: SpecSource) -> list[Problem]:
    """What no spec may hold, wherever it is written (a known key or not): a string or key with a control character, a
    number that is NaN or infinite, an integer beyond 64 bits, tables nested too deep (which --set can add)."""
    problems: list[Problem] = []

    def problem(path: Path, message: str) -> None:
        origin = source.overridden.get(tuple(str(p) for p in path))
        suffix = f" (from --set {one_line(origin)})" if origin else ""
        problems.append(Problem(source.path, message + suffix, path=dotted(path), line=source.line(tuple(str(p) for p in path))))

    deep = bounded.too_deep(source.data, MAX_DEPTH)
    if deep is not None:
        problem(deep[:MAX_DEPTH], f"nested more than {MAX_DEPTH} levels deep; a spec's tables are a few levels deep")
        return problems
    stack: list[tuple[Path, Any]] = [((), source.data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, sub in value.items():
                if (char := control_character(key)) is not None:
                    problem(path + (key,), f"the key holds {char}; {ONE_LINE}")
                else:
                    stack.append((path + (key,), sub))
        elif isinstance(value, list):
            stack.extend((path + (i,), sub) for i, sub in enumerate(value))
        elif isinstance(value, str) and (char := control_character(value)) is not None:
            problem(path, f"holds {char}; {ONE_LINE}")
        elif isinstance(value, float) and not math.isfinite(value):
            problem(path, f"{value} is not a number a spec can hold (NaN or infinite); fix: write a finite number")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            problem(path, f"{_show(value)} is beyond a 64-bit integer (at most {MAX_INT}); fix: write a smaller number")
    return problems


def validate(source: SpecSource) -> None:
    """Raise SpecError listing every schema violation of `source`, sorted by line. Values no spec may hold (control
    characters, NaN, infinities, huge integers, deep nesting) are reported first and alone: the schema's messages would
    echo them."""
    problems = _value_problems(source)
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.path))
        raise SpecError(problems)
    validator = Validator(schema())
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
    """`$.a.b[0]`; a key with a character a message cannot show as it is, quoted: `$.launch.env["A\\nB"]`."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f"[{json.dumps(p)}]" if _CONTROL.search(p) else f".{p}"
                         for p in path)


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
        return [problem(f"unknown key '{one_line(key, 80)}'{_did_you_mean_key(key, known, path)}", path + (key,))
                for key in error.instance if key not in known]
    if kind == "enum":
        options = ", ".join(json.dumps(v) for v in error.validator_value)
        hint = _did_you_mean(error.instance, error.validator_value)
        return [problem(f"{_show(error.instance)} is not one of {options}{hint}")]
    if kind == "const":
        return [problem(f"must be {json.dumps(error.validator_value)}, got {_show(error.instance)}")]
    if kind == "type":
        expected = error.validator_value
        return [problem(f"expected {_type_name(expected)}, got {_type_name_of(error.instance)} {_show(error.instance)}")]
    if kind == "required":
        missing = error.message.split("'")[1]
        example = {"version": "version = 1", "name": 'name = "my-job"'}.get(missing, f"{missing} = ...")
        return [problem(f"missing required key '{missing}'; add `{example}`")]
    if kind == "pattern":
        desc = schema_node.get("description", "")
        value = _show(error.instance)
        return [problem(f"{value} has the wrong form: {desc}" if desc else f"{value} does not match {schema_node['pattern']}")]
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minLength", "uniqueItems", "propertyNames"):
        return [problem(_bound_message(kind, error))]
    return [problem(one_line(error.message, 200))]


def _bound_message(kind: str, error: jsonschema.ValidationError) -> str:
    v = error.validator_value
    return {
        "minimum": f"must be >= {v}, got {_show(error.instance)}",
        "exclusiveMinimum": f"must be > {v}, got {_show(error.instance)}",
        "maximum": f"must be <= {v}, got {_show(error.instance)}",
        "exclusiveMaximum": f"must be < {v}, got {_show(error.instance)}",
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
