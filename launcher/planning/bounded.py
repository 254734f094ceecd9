"""Reading a file a user names, within bounds: a regular file only, at most `limit` bytes, JSON without duplicate keys
or NaN, data no deeper than a config ever is. Every file fp8launch reads on a user's behalf while planning or importing
(the spec, `fp8launch import FILE`, the DeepSpeed JSON an import follows, an hf: model's config.json, pyproject.toml)
comes in through here, so a FIFO, /dev/zero, a 10 GB file or a 5000-deep nest is refused in milliseconds.

    raw = read_bytes("spec.toml", 1 << 20)        # Unreadable (an OSError) with the reason as its strerror
    data = loads_json(text)                        # Refused (a ValueError) naming a duplicate key or a NaN
    where = too_deep(data, 16)                     # the path of the first container nested deeper, or None
    bad = first_nonfinite(data)                    # (path, value) of a NaN or an infinity, or None
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import Any

CONFIG_BYTES = 8 << 20
"""The most bytes read of a config another tool wrote (an Accelerate / DeepSpeed / NeMo file, an hf: config.json):
they are a few KiB, a classifier's label maps make a config.json larger; more is not a config."""

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class Unreadable(OSError):
    """The file cannot be read within bounds; `strerror` says why in words ("is a named pipe (FIFO), not a file"), and
    `size` is the file's size where that is why."""

    def __init__(self, path: str, reason: str, code: int = errno.EINVAL, size: int | None = None):
        super().__init__(code, reason, path)
        self.size = size


def read_bytes(path: str, limit: int) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them. Opened without blocking (a FIFO with no writer
    would wait forever in open()) and checked on the opened descriptor, so what is checked is what is read; the limit
    holds while reading, whatever the size the file reports (a device reports 0)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a socket, or a FIFO on a system that will not open it without a writer
            raise Unreadable(path, "is not a regular file (a socket or a pipe)") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
            raise Unreadable(path, f"is {kind}, not a file", errno.EISDIR if stat.S_ISDIR(info.st_mode) else errno.EINVAL)
        if info.st_size > limit:
            raise Unreadable(path, f"is {info.st_size} bytes; at most {limit} are read", errno.EFBIG, info.st_size)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:  # it grew while being read
            raise Unreadable(path, f"is more than {limit} bytes; at most {limit} are read", errno.EFBIG, total)
        return b"".join(chunks)
    finally:
        os.close(fd)


class Refused(ValueError):
    """The text parses, or would, but holds what no config holds: a duplicate key, NaN, nesting past what is read."""


class DuplicateKey(Refused):
    """A JSON object names a key twice (json.loads would silently keep the last value)."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(f"key {json.dumps(key)} is written twice in one object")


class NotANumber(Refused):
    """JSON's NaN, Infinity or -Infinity (not JSON at all: Python's extension), or a number too large for a float."""

    def __init__(self, text: str):
        self.text = text
        super().__init__(f"{text} is not a number JSON allows")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json.loads' object_pairs_hook that refuses a key written twice in one object (DuplicateKey)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise NotANumber(text)
    return value


def _constant(text: str) -> None:
    raise NotANumber(text)


def loads_json(text: str, max_depth: int | None = None) -> Any:
    """json.loads, refusing what DeepSpeed and other JSON readers refuse or misread: a key written twice in one object
    (DuplicateKey), NaN / Infinity / a number beyond a float (NotANumber), nesting deeper than Python's stack or than
    `max_depth` (Refused). Other malformed text raises ValueError (json.JSONDecodeError; an integer of more than 4300
    digits), as json.loads does."""
    try:
        data = json.loads(text, object_pairs_hook=unique_keys, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise Refused("nested deeper than Python reads") from None
    if max_depth is not None and (deep := too_deep(data, max_depth)) is not None:
        raise Refused(f"{'.'.join(map(str, deep[:8]))}: nested more than {max_depth} levels deep")
    return data


def too_deep(data: Any, max_depth: int) -> tuple[str | int, ...] | None:
    """The path of the first table or array nested more than `max_depth` deep in `data` (the top level is depth 1), or
    None. Walks without recursion, and reaches a container that YAML aliases share (or that holds itself) again only at
    a greater depth, so a small file of aliases costs at most `max_depth` visits a container."""
    deepest: dict[int, int] = {}
    stack: list[tuple[Any, tuple]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, (dict, list)) or deepest.get(id(node), -1) >= len(path):
            continue
        if len(path) >= max_depth:
            return path
        deepest[id(node)] = len(path)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((value, path + (key,)) for key, value in items)
    return None


def first_nonfinite(data: Any) -> tuple[tuple[str | int, ...], float] | None:
    """(path, value) of the first float in `data` that is NaN or infinite, or None. Visits each container once."""
    seen: set[int] = set()
    stack: list[tuple[Any, tuple]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return path, node
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        items = list(node.items() if isinstance(node, dict) else enumerate(node))
        stack.extend((value, path + (key,)) for key, value in reversed(items))
    return None
