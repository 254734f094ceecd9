"""A JSON-lines file as a run writes it (metrics.jsonl, fp8_stats.jsonl): one JSON object a line, appended to by every
run of the same train.output_dir. Torch-free: `fp8launch report`, bench and tune read these files too.

A run killed while writing leaves a last line without its newline; the next run's first record would be appended to
it and both lost. `repair` cuts such a line before a run appends (or ends it where it is a whole record), and says so.
`read` returns the records and names each line that is not one, for the reader to skip and report.
"""

from __future__ import annotations

import json
import os


def repair(path: str) -> str | None:
    """Before appending to `path`: cut a partial last line (no newline, not a whole JSON object) back to the last complete
    line, or end a whole last object with its newline. Returns what it did, in words, or None when nothing was needed."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size == 0:
                return None
            f.seek(max(0, size - 1))
            if f.read(1) == b"\n":
                return None
            start = max(0, size - (1 << 16))
            while True:  # the start of the last line: the byte after the last newline
                f.seek(start)
                chunk = f.read(size - start)
                cut = chunk.rfind(b"\n")
                if cut >= 0 or start == 0:
                    keep = start + cut + 1
                    break
                start = max(0, start - (1 << 16))
            f.seek(keep)
            tail = f.read()
    except FileNotFoundError:
        return None
    name = os.path.basename(path)
    if isinstance(_object(tail), dict):
        with open(path, "ab") as f:
            f.write(b"\n")
        return f"{name}: its last record had no newline (a run stopped while writing it); ended it before appending"
    os.truncate(path, keep)
    return (f"{name}: cut a partial last line ({len(tail)} bytes, from a run stopped while writing it) back to the last "
            "complete record before appending")


def _object(raw: bytes):
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def read(path: str) -> tuple[list[tuple[int, dict]], list[tuple[int, str]]]:
    """([(line number, JSON object)] of `path` in order, [(line number, why it is not one: "not JSON")]). A last line
    without its newline counts as a problem too (cut short, or still being written). Blank lines are neither."""
    with open(path, "rb") as f:
        data = f.read()
    rows, problems = [], []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if number == len(lines):
            problems.append((number, "cut short (no newline at the end of the file)"))
            continue
        value = _object(raw)
        if isinstance(value, dict):
            rows.append((number, value))
        elif value is None and raw.strip() != b"null":
            problems.append((number, "not JSON"))
        else:
            problems.append((number, f"a JSON {_kind(value)}, not an object"))
    return rows, problems


def summary(problems: list[tuple[int, str]], shown: int = 3) -> str:
    """(line, why) problems in words: how many lines, the first few of them by line."""
    problems = sorted(problems)
    first = "; ".join(f"line {n}: {why}" for n, why in problems[:shown])
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    return f"{len(problems)} line{'s' * (len(problems) != 1)} skipped ({first}{more})"


def _kind(value) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "number"
