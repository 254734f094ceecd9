"""Real configs, broken as a careless or hostile user breaks them: the mutations the importer's property test
(tests/hostile/test_import_fuzz.py) and the long fuzz (benchmarks/fuzz_inputs.py) apply to tests/data/import's files.

A mutation works on the parsed config: it picks a place (a table or a leaf, anywhere in the tree) and sets it to a
hostile value, deletes it, adds an unknown key, or buries a value under deep nesting. The result is written back in a
format the importer reads (YAML, or JSON where it keeps the case's point: JSON keeps NaN and Infinity as written).
Both the property test (hypothesis draws the choices) and the benchmark (random.Random draws them) use `mutated`.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Callable

import yaml

from launcher.commands.importer import load

DATA = Path(__file__).resolve().parent.parent / "data" / "import"
SOURCES = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.suffix in (".yaml", ".toml", ".json")
                 and "expected" not in p.parts)

HOSTILE: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 3, 7, 2**31, 2**63, 10**30, -(10**30), 0.5, -0.0, 1e-320, 1e308, -1e308,
    math.inf, -math.inf, math.nan, "", " ", "0", "1e3", "-1", "true", "none", "auto", "fp8", "bf16", "fp16", "e4m3",
    "tensorwise", "deepspeed", "FSDP", "x" * 5000, "a\nb", "a\rb", "nul\x00byte", "`touch PWNED`", "$(touch PWNED)",
    "it's \"quoted\"", "../../etc/passwd", "/dev/zero", "ünïcødé", "🔥", [], [1], [None], ["a", "b"], [[[[]]]], {},
    {"a": 1}, {"": None}, {"nested": {"deeper": {"deepest": [1, 2, 3]}}},
)
"""Values that are wrong in type, range, form or content for every key of every tool."""


def places(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into `data`: each table's keys, each list's indexes, the tables and lists themselves included."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for k, v in data.items():
            out.extend(places(v, prefix + (k,)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(places(v, prefix + (i,)))
    return out


def _parent(data: Any, path: tuple) -> Any:
    node = data
    for part in path[:-1]:
        node = node[part]
    return node


def _hostile(choose: Callable[[int], int]) -> Any:
    return copy.deepcopy(HOSTILE[choose(len(HOSTILE))])  # a copy: a later mutation must not change the table (or make a cycle)


def mutate(data: Any, choose: Callable[[int], int], steps: int) -> Any:
    """`data` changed `steps` times; `choose(n)` picks one of n options (0 <= result < n)."""
    data = copy.deepcopy(data)
    for _ in range(steps):
        spots = places(data)
        if not spots:
            return data
        path = spots[choose(len(spots))]
        parent, key = _parent(data, path), path[-1]
        action = choose(5)
        if action == 0 or action == 1:
            parent[key] = _hostile(choose)
        elif action == 2:
            if isinstance(parent, dict):
                del parent[key]
            else:
                parent.pop(key)
        elif action == 3:
            target = parent[key] if isinstance(parent[key], dict) else parent
            if isinstance(target, dict):
                target[f"unknown_key_{choose(1000)}"] = _hostile(choose)
        else:
            value = parent[key]
            for _ in range(1 + choose(40)):
                value = {"x": value} if choose(2) else [value]
            parent[key] = value
    return data


def mutated(source: str, choose: Callable[[int], int], steps: int, folder: Path) -> Path:
    """Write `source` (relative to tests/data/import) mutated into `folder`; return the file's path."""
    _, data = load(str(DATA / source))
    data = mutate(data, choose, steps)
    as_json = choose(2) == 0
    path = folder / (Path(source).stem + (".json" if as_json else ".yaml"))
    if as_json:
        path.write_text(json.dumps(data, allow_nan=True), encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


SPEC_SOURCES = sorted([str(p) for p in (DATA.parent.parent.parent / "specs").glob("*.toml")]
                      + [str(p) for p in (DATA.parent.parent / "cases" / "valid").glob("*/spec.*")])
"""The repository's own specs and the golden cases' valid ones: real specs to break."""


def _schema_keys() -> list[tuple[tuple[str, ...], dict]]:
    from launcher.planning.read import schema

    out = []

    def walk(node: dict, prefix: tuple[str, ...]) -> None:
        for key, sub in node.get("properties", {}).items():
            if isinstance(sub, dict):
                out.append((prefix + (key,), sub))
                walk(sub, prefix + (key,))

    walk(schema(), ())
    return out


def _plausible(node: dict, choose: Callable[[int], int]) -> Any:
    """A value the schema might take at `node`: one of its enum values, its default, an edge of its range, or hostile."""
    options: list[Any] = list(node.get("enum", []))
    if "default" in node:
        options.append(node["default"])
    for bound in ("minimum", "maximum", "exclusiveMinimum"):
        if bound in node:
            options += [node[bound], node[bound] - 1, node[bound] + 1]
    if node.get("type") == "integer":
        options += [0, 1, 2, 3, 4, 8, 16, 64, 1000, 10**6, 10**12]
    if node.get("type") == "boolean":
        options += [True, False]
    return copy.deepcopy(options[choose(len(options))]) if options and choose(4) else _hostile(choose)


def mutate_spec(data: dict, choose: Callable[[int], int], steps: int) -> dict:
    """A spec changed `steps` times, each either at a key the schema defines (a plausible value: other combinations of
    the options, the edges of their ranges) or anywhere (`mutate`'s hostile changes)."""
    keys = _schema_keys()
    data = copy.deepcopy(data)
    for _ in range(steps):
        if choose(3) == 0:
            data = mutate(data, choose, 1)
            continue
        path, node = keys[choose(len(keys))]
        table = data
        for part in path[:-1]:
            if not isinstance(table.get(part), dict):
                table[part] = {}
            table = table[part]
        table[path[-1]] = _plausible(node, choose)
    return data


def mutated_spec(source: str, choose: Callable[[int], int], steps: int, folder: Path) -> Path:
    """Write the spec `source` mutated into `folder` as TOML (JSON where TOML has no form for a value, or by choice)."""
    from launcher.planning.read import read_spec
    from launcher.targets.toml_text import toml_text

    data = mutate_spec(read_spec(source).data, choose, steps)
    path = folder / "spec.toml"
    try:
        text = None if choose(4) == 0 else toml_text(data)
    except TypeError:  # None, or a list of tables: JSON says it
        text = None
    if text is None:
        path = folder / "spec.json"
        text = json.dumps(data, allow_nan=True)
    path.write_text(text, encoding="utf-8")
    return path
