"""Line numbers of keys in TOML and JSON text, so errors can say `FILE:LINE`.

tomllib and json give values but no positions. These scanners only find where each
key is written; the real parsers decide what the text means. A path that is not
found falls back to its nearest located ancestor.
"""

from __future__ import annotations

import json
import re

Path = tuple[str, ...]

_BARE = r"[A-Za-z0-9_-]+"
_KEY_PART = rf'(?:{_BARE}|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_TABLE = re.compile(rf"^\s*\[\[?\s*({_DOTTED})\s*\]\]?")
_ASSIGN = re.compile(rf"^\s*({_DOTTED})\s*=\s*")
_PART = re.compile(_KEY_PART)


def _split_key(dotted: str) -> Path:
    parts = []
    for m in _PART.finditer(dotted):
        p = m.group(0)
        parts.append(json.loads(p) if p.startswith('"') else p.strip("'"))
    return tuple(parts)


def toml_lines(text: str) -> dict[Path, int]:
    """Map each key path written in TOML `text` to its 1-based line."""
    lines: dict[Path, int] = {}
    table: Path = ()
    depth = 0  # open brackets/braces of a value that spans lines
    in_multiline = None  # the closing quote of a multi-line string we are inside
    for n, line in enumerate(text.splitlines(), start=1):
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        if depth == 0:
            if m := _TABLE.match(line):
                table = _split_key(m.group(1))
                lines.setdefault(table, n)
                continue
            if m := _ASSIGN.match(line):
                path = table + _split_key(m.group(1))
                lines.setdefault(path, n)
                value = line[m.end():]
                if value.lstrip().startswith("{"):
                    for inner in re.finditer(rf"[{{,]\s*({_DOTTED})\s*=", value):
                        lines.setdefault(path + _split_key(inner.group(1)), n)
            else:
                value = ""
        else:
            value = line
        for quote in ('"""', "'''"):
            if value.count(quote) % 2 == 1:
                in_multiline = quote
        stripped = re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', "", value).split("#", 1)[0]
        depth = max(0, depth + stripped.count("[") + stripped.count("{") - stripped.count("]") - stripped.count("}"))
    return lines


def json_lines(text: str) -> dict[Path, int]:
    """Map each key path (and array index) in JSON `text` to its 1-based line."""
    return _scan_json(text)[0]


def json_duplicates(text: str) -> list[tuple[Path, int]]:
    """(path, line) of each key written a second time in one JSON object of `text` (json.loads keeps the last)."""
    return _scan_json(text)[1]


def _scan_json(text: str) -> tuple[dict[Path, int], list[tuple[Path, int]]]:
    """The line of each key path, and each repeated key. Recursive: parse and check the depth first (read.py does)."""
    lines: dict[Path, int] = {}
    repeated: list[tuple[Path, int]] = []
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def value(pos: int, path: Path) -> int:
        pos = ws.match(text, pos).end()
        ch = text[pos : pos + 1]
        if ch == "{":
            pos = ws.match(text, pos + 1).end()
            if text[pos : pos + 1] == "}":
                return pos + 1
            keys: set[str] = set()
            while True:
                pos = ws.match(text, pos).end()
                key, end = json.decoder.scanstring(text, pos + 1)
                if key in keys:
                    repeated.append((path + (key,), line_of(pos)))
                keys.add(key)
                lines.setdefault(path + (key,), line_of(pos))
                pos = ws.match(text, end).end() + 1  # the colon
                pos = ws.match(text, value(pos, path + (key,))).end()
                if text[pos] == "}":
                    return pos + 1
                pos += 1  # the comma
        if ch == "[":
            pos = ws.match(text, pos + 1).end()
            if text[pos : pos + 1] == "]":
                return pos + 1
            i = 0
            while True:
                lines.setdefault(path + (str(i),), line_of(ws.match(text, pos).end()))
                pos = ws.match(text, value(pos, path + (str(i),))).end()
                if text[pos] == "]":
                    return pos + 1
                pos, i = pos + 1, i + 1
        _, end = decoder.raw_decode(text, pos)
        return end

    try:
        value(0, ())
    except (ValueError, IndexError):
        pass  # the real parser reports malformed JSON; keep what was located
    return lines, repeated


def locate(lines: dict[Path, int], path: Path) -> int | None:
    """Line of `path`, or of its nearest located ancestor."""
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return None
