"""The record each source kind provides: how much a config looks like it, how to read it, what to name it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .draft import Draft
from .known import Unknown


@dataclass(frozen=True, slots=True)
class Kind:
    id: str
    """accelerate | axolotl | torchtitan | megatron | deepspeed"""
    title: str
    """In words, e.g. "Accelerate config"."""
    score: Callable[[dict], int]
    """How many of this kind's telltale keys the parsed config has (0: not this kind)."""
    read: Callable[[Draft], None]
    """Map the source into the draft: spec keys and a report entry for each setting it takes."""
    name: Callable[[Draft], str | None]
    """The run's name in the source (None: the file name is used)."""
    other: str
    """Why a setting no rule of the kind reads has no equivalent."""
    unknown: Callable[[Draft], list[Unknown]] = lambda d: []
    """The keys of the source its tool does not read (known/): refused where the tool refuses them, else reported."""


def count(data: dict, paths: tuple[str, ...]) -> int:
    """How many of the dotted `paths` exist in `data`."""
    n = 0
    for path in paths:
        node = data
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                break
        n += node is not None
    return n
