"""A tiny deterministic YAML emitter for the manifests `plan` writes, torch-free and dependency-free.

Only what the manifests need: mappings (in the order given), lists, strings, integers, booleans.
Every user-controlled string is a double-quoted scalar with JSON-style escapes (valid YAML 1.2 and
1.1), so a newline, a quote, `$(...)`, `: ` or `#` in a value can never change the document's
structure. Two exceptions keep the committed files readable, both safe by construction:
- a mapping key that is a plain identifier (`apiVersion`, `nvidia.com/gpu`) is written plain;
- a multi-line text of printable ASCII that ends in exactly one newline (the plan files in the
  ConfigMap) is written as a literal block (`|`), indented, which YAML reads back byte for byte.
"""

from __future__ import annotations

import re

_PLAIN_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]*$")
# Plain scalars YAML 1.1 (PyYAML, go-yaml v2) reads as booleans or null: such keys are quoted.
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
INDENT = "  "


def quote(text: str) -> str:
    """A double-quoted scalar: printable ASCII as is, everything else escaped (\\uXXXX or \\UXXXXXXXX)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"mapping keys must be strings, not {type(key).__name__}")
    return key if _PLAIN_KEY.match(key) and key.lower() not in _RESERVED else quote(key)


def _block_ok(text: str) -> bool:
    """Text a literal block scalar reproduces exactly: printable ASCII lines, no leading or trailing
    spaces that indentation or chomping could eat, ending in exactly one newline."""
    if "\n" not in text[:-1] or not text.endswith("\n") or text.endswith("\n\n"):
        return False
    lines = text[:-1].split("\n")
    return (not lines[0].startswith(" ")
            and all(all(0x20 <= ord(c) < 0x7F for c in line) and not line.endswith(" ") for line in lines))


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, str):
        return quote(value)
    raise TypeError(f"cannot write a {type(value).__name__} into a manifest")


def _lines(value, level: int) -> list[str]:
    """`value` (a mapping or a list) as block lines at indentation `level`."""
    pad = INDENT * level
    out = []
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    for key, item in items:
        lead = f"{pad}{_key(key)}:" if isinstance(value, dict) else f"{pad}-"
        if isinstance(item, (dict, list)) and item:
            if isinstance(value, dict):
                out.append(lead)
                out.extend(_lines(item, level + 1))
            else:  # a list item that is a collection starts on the dash's line
                nested = _lines(item, level + 1)
                out.append(f"{lead} {nested[0].lstrip()}")
                out.extend(nested[1:])
        elif isinstance(item, (dict, list)):
            out.append(f"{lead} {'{}' if isinstance(item, dict) else '[]'}")
        elif isinstance(item, str) and _block_ok(item):
            out.append(f"{lead} |")
            inner = INDENT * (level + 1)
            out.extend(f"{inner}{line}" if line else "" for line in item[:-1].split("\n"))
        else:
            out.append(f"{lead} {_scalar(item)}")
    return out


def dump(document: dict) -> str:
    """One YAML document (a mapping), block style, keys in the order given, trailing newline."""
    return "\n".join(_lines(document, 0)) + "\n"


def dump_all(documents: list[dict]) -> str:
    """Several documents, each started by `---` (what `kubectl apply -f` reads as a stream)."""
    return "".join("---\n" + dump(d) for d in documents)
