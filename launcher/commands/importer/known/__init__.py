"""The key names each source tool reads, so that a key it does not know is reported (with "did you mean")
or refused where the tool itself refuses it.

    found = unknown(leaves, KNOWN)            # [(key, nearest)]: the first unknown part of each dotted path

One module per tool holds its names, read from the tool's own code at the commit its docstring names
(tests/test_import.py holds the installed DeepSpeed and Accelerate to theirs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable

from launcher.planning.suggest import closest


def unknown(leaves: Iterable[str], known: Collection[str], free: Collection[str] = ()) -> list[tuple[str, str | None]]:
    """(key, the nearest known key at its level or None) for the first part of each dotted path in `leaves` that
    `known` (dotted names, tables included) does not have, each key once, in order. Below a known name that is not
    a table of `known`, and below a `free` prefix, any key is accepted (a free-form table)."""
    known = set(known)
    tables = {k.rsplit(".", 1)[0] for k in known if "." in k}
    found: dict[str, str | None] = {}
    for leaf in leaves:
        parts = leaf.split(".")
        for i in range(1, len(parts) + 1):
            key = ".".join(parts[:i])
            if key in free or key in found:
                break
            if key in known:
                if key not in tables:
                    break
                continue
            parent = ".".join(parts[: i - 1])
            level = [k[len(parent) + 1:] if parent else k for k in known
                     if (k.startswith(parent + ".") if parent else True) and "." not in (k[len(parent) + 1:] if parent else k)]
            near = closest(parts[i - 1], level)
            found[key] = f"{parent}.{near}" if near and parent else near
            break
    return list(found.items())


@dataclass(frozen=True, slots=True)
class Unknown:
    """A key of the source its tool does not read."""

    key: str
    """Its dotted path in the source (the first part the tool does not have)."""
    near: str | None
    """The closest key the tool has at that level, for "did you mean"."""
    says: str
    """What the tool does with it, e.g. 'Axolotl's schema drops it' or 'torchtitan stops ("Invalid field names")'."""
    refused: bool = False
    """The tool stops on it: so does the import (exit 2)."""
    label: str = ""
    """How the key is shown where it differs from `key`, e.g. "[trainig]" for a TOML table."""
    tool: str = "the source's tool"
    """Who does not know it, e.g. "torchtitan"."""

    def line(self) -> str:
        near = f" (did you mean {self.near}?)" if self.near else ""
        return f"{self.label or self.key} is unknown to {self.tool}{near}: {self.says}"
