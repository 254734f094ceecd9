"""What `fp8launch import` says about each setting of the source. Every line is one of:

- mapped: the same meaning, and the run does the same;
- approximated: what changed, in numbers: `before: <what the source does>; after: <what the spec does>;
  <what that does to the run>`;
- no equivalent: why, and what to do; the key named, its value not quoted (the user has it; a secret-looking key's
  line says to set it in the job's environment).

The same lines go to the screen and, as comments, to the top of the written spec."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from launcher.targets.toml_text import toml_value

from .hidden import secret_note

MAPPED = "mapped"
APPROXIMATED = "approximated"
NONE = "no equivalent"
STATUSES = (MAPPED, APPROXIMATED, NONE)

UNSET = object()
"""A source value not given (the entry shows none)."""


def one_line(text: str) -> str:
    """`text` without control characters or line breaks (safe in a TOML comment)."""
    return " ".join(re.sub(r"[\x00-\x1f\x7f]+", " ", text).split())


def shown(value: Any, limit: int = 72) -> str:
    """A source value as one short line: TOML's spelling where it has one, JSON's else."""
    try:
        text = toml_value(value)
    except TypeError:
        text = json.dumps(value, default=str, ensure_ascii=False)
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(slots=True)
class Entry:
    """One setting of the source (or a group of them, or a fact the source leaves to its launcher) and what it became."""

    source: str
    """Its dotted path in the source, e.g. "fp8_config.backend"; "a, b" for several; "(world size)" for a fact."""
    status: str
    """mapped | approximated | no equivalent"""
    value: Any = UNSET
    """The source's value (UNSET: none shown)."""
    sets: list[tuple[str, Any]] = field(default_factory=list)
    """The spec keys it set, with their values, in order."""
    note: str = ""
    """approximated: what the change does to the run; no equivalent: why, and what to do; mapped: an optional remark."""
    before: str = ""
    """approximated: what the source does, in numbers where it has numbers."""
    after: str = ""
    """approximated: what the spec does instead."""
    tag: str = ""
    """Entries made again on each planning attempt (the batch) carry a tag, so they can be replaced."""

    def line(self) -> str:
        text = self.source if self.value is UNSET else f"{self.source} = {shown(self.value)}"
        if self.sets:
            text += " -> " + ", ".join(f"{k} = {shown(v)}" for k, v in self.sets)
        parts = ([f"before: {self.before}; after: {self.after}"] if self.before or self.after else []) + ([self.note] if self.note else [])
        if parts:
            text += ": " + "; ".join(parts)
        return f"{self.status:<13}  {one_line(text)}"


@dataclass(slots=True)
class Report:
    """Every entry, in the order the source was read."""

    entries: list[Entry] = field(default_factory=list)

    def add(self, entry: Entry) -> Entry:
        if entry.status == NONE and (secret := secret_note(entry.source)) and secret not in entry.note:
            entry.note = f"{entry.note}; {secret}" if entry.note else secret
        self.entries.append(entry)
        return entry

    def of(self, status: str) -> list[Entry]:
        return [e for e in self.entries if e.status == status]

    def setting(self, key: str) -> list[Entry]:
        """The entries that set spec key `key`."""
        return [e for e in self.entries if any(k == key for k, _ in e.sets)]

    def refused(self, key: str, old: Any, value: Any, rule: str, why: str) -> None:
        """A planning rule refused `key = old`, what the entries setting `key` wrote: they now set `value`, approximated,
        naming the rule (an entry of its own where none set it: the value was fp8launch's default)."""
        was, now = f"{key} = {shown(old)}", f"{key} = {shown(value)}"
        effect = f"rule {rule} refuses {was} ({why})"
        entries = self.setting(key)
        if not entries:
            self.add(Entry(source=f"(rule {rule})", status=APPROXIMATED, sets=[(key, value)], before=was, after=now, note=effect))
            return
        for e in entries:
            e.sets = [(k, value if k == key else v) for k, v in e.sets]
            if e.status == APPROXIMATED and (e.before or e.after):
                e.after = f"{e.after}, then {now}"
                e.note = (e.note + "; " if e.note else "") + effect
            else:
                e.status, e.before, e.after = APPROXIMATED, was, now
                # the refusal first: what the entry's own note says of the value it mapped no longer holds for the spec
                e.note = effect + (f"; as mapped, before the rule: {e.note}" if e.note else "")

    def carried(self, key: str, old: Any, value: Any, rule: str, note: str) -> None:
        """`key = value` set beside the fix of `rule` (which did not refuse it), for the reason `note`."""
        self.add(Entry(source=f"(with rule {rule})", status=APPROXIMATED, sets=[(key, value)], before=f"{key} = {shown(old)}",
                       after=f"{key} = {shown(value)}", note=note))

    def summary(self) -> str:
        counts = {s: len(self.of(s)) for s in STATUSES}
        return f"{counts[MAPPED]} mapped, {counts[APPROXIMATED]} approximated, {counts[NONE]} with no equivalent"

    def lines(self) -> list[str]:
        return [e.line() for e in self.entries]

    def comment(self, header: list[str]) -> str:
        """The comment block at the top of the written spec: `header`, then one line per entry."""
        return "".join(f"# {line}".rstrip() + "\n" for line in header + self.lines())
