"""TOML text from plain data: the one writer for the specs fp8launch writes (`init`, `tune`'s winner)
and the tests'. Strings are TOML basic strings (JSON's escapes are TOML's; a raw DEL is escaped too)."""

from __future__ import annotations

import json
from typing import Any


def toml_key(key: str) -> str:
    """A bare key where TOML allows one, else a quoted key."""
    return key if key and key.replace("_", "").replace("-", "").isalnum() else toml_value(key)


def toml_value(value: Any) -> str:
    """One TOML value: a bool, number, string, list or inline table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_text(data: dict) -> str:
    """A nested dict as TOML: each table's values first, then one [table] per nested dict, depth first."""
    lines: list[str] = []

    def emit(table: dict, prefix: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in table.items() if isinstance(v, dict)}
        if prefix and (scalars or not tables):
            lines.append(f"\n[{prefix}]")
        lines.extend(f"{toml_key(k)} = {toml_value(v)}" for k, v in scalars.items())
        for k, v in tables.items():
            emit(v, f"{prefix}.{toml_key(k)}" if prefix else toml_key(k))

    emit(data, "")
    return "\n".join(lines).lstrip("\n") + "\n"
