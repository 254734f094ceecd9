"""The spec an importer builds from a source config, and the report of what became of each source setting.

    draft = Draft(data, path="job.toml", title="torchtitan job TOML")
    draft.mapped("training.seq_len", ("train.seq_len", 8192))       # takes the source key, sets the spec key
    draft.approximated("lr_scheduler.decay_type", ("train.min_lr_ratio", 0.0), before="a linear decay to 0",
                       after="a cosine decay to 0", effect="a higher lr through the middle of the run")
    draft.none("parallelism.pipeline_parallel_degree", "no pipeline parallelism: ...")
    draft.group("profiling", "...")                                   # what is left under a table, as one entry
    text = render(draft, header)                                       # the TOML, the report as its comment block

Every source leaf an importer does not take is reported at the end as having no equivalent, so nothing
in the source goes unmentioned. A line quotes the source value it maps; a line with no equivalent names its key only.
The draft holds the source as hidden.hide leaves it: no value under a secret-looking key reaches a line or the spec.
"""

from __future__ import annotations

import os
import re
from typing import Any

from launcher.errors import with_fix
from launcher.planning.backends import BACKENDS
from launcher.planning.layout import Layout
from launcher.planning.read import defaults
from launcher.targets.toml_text import toml_text

from . import batch
from .hidden import hide, holds_hidden, secret_looking
from .known import Unknown
from .report import APPROXIMATED, MAPPED, NONE, UNSET, Entry, Report, one_line, shown

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
SECTIONS = ("precision", "distributed", "compile", "activation_checkpointing", "launch", "train", "eval", "log")
"""The spec's tables, in the order they are written."""


def flatten(data: Any, limit: int = 20000) -> dict[str, Any]:
    """Dotted path -> value of every leaf (a list is one leaf; a None value is a setting left unset, and left out).
    Raises ValueError past `limit` leaves (YAML aliases can make a small file huge)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        elif node is not None:
            if len(out) >= limit:
                raise ValueError(f"more than {limit} settings: not a config")
            out[prefix[:-1]] = node

    walk(data, "")
    return out


def dig(node: Any, key: str, default: Any = None) -> Any:
    """The value at dotted `key` in nested tables `node`, else `default`."""
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def put(node: dict, key: str, value: Any) -> None:
    """Set dotted `key` in nested tables `node`, making the tables on the way."""
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def spec_name(text: str) -> str:
    """A valid spec name from a run name or file stem: lowercase, other characters -> '-', at most 64."""
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:64].rstrip("-._")
    return name if NAME.match(name) else "imported"


class Draft:
    """A spec being built from a source config, with its report."""

    def __init__(self, data: dict, *, path: str, title: str, max_leaves: int = 20000):
        self.data = hide(data)
        """The source as the importer reads it: every value under a secret-looking key HIDDEN (hidden.py)."""
        self.path = path
        self.title = title
        """The source kind in words, e.g. "Accelerate config"."""
        self.spec: dict = {}
        self.report = Report()
        self.leaves = flatten(self.data, max_leaves)
        self.taken: set[str] = set()
        self.placeholders: dict[str, str] = {}
        """Spec keys holding a placeholder -> what to put there instead (marked on their line in the TOML)."""
        self.batch = batch.Batch()
        self.batch_at: int | None = None
        """Where the batch's entries go in the report: where the importer read the source's batch (note_batch)."""
        self.name = ""
        self.autos: list[tuple[Entry, str, str]] = []
        """"auto" entries, the spec key each one names and why (auto())."""
        self.unknowns: list[Unknown] = []
        """Keys the source's tool does not read (ignore())."""
        self.dp_stated: int | None = None
        """The data-parallel degree the source states (torchtitan's data_parallel_shard_degree x replicate), where it does:
        a placeholder world size holds it (placeholders.size_world)."""
        self.world_why = ""
        self.world_procs = 8
        self.folder = ""
        """Where the spec is planned (planable.settle)."""
        self.finishers: list = []
        """Callables(draft) run by finish() after each planning round: a line whose reason depends on what the rules left of the
        spec (torchtitan's reshard reason, which cites a pipeline a rule may have taken away)."""
        self.world_entry: Entry | None = None
        """world_unknown(): why the world size is a placeholder, the count the importer proposed, and its entry."""

    # --- the source ------------------------------------------------------------------------------

    def follow(self, prefix: str, data: dict) -> None:
        """Read `data`, a file the source names (a DeepSpeed JSON), as the source's own table `prefix`: hidden alike."""
        self.data[prefix] = hide(data)
        self.leaves.update({f"{prefix}.{k}": v for k, v in flatten(self.data[prefix]).items()})

    def get(self, path: str, default: Any = None) -> Any:
        node = dig(self.data, path)
        return default if node is None else node

    def has(self, path: str) -> bool:
        return self.get(path) is not None

    def take(self, path: str) -> Any:
        """The value at `path`, now reported for (every leaf under it)."""
        self.taken |= {k for k in self.leaves if k == path or k.startswith(path + ".")}
        return self.get(path)

    def untaken(self, prefix: str = "") -> list[str]:
        return [k for k in self.leaves if k not in self.taken and (not prefix or k == prefix or k.startswith(prefix + "."))]

    # --- the spec --------------------------------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        put(self.spec, key, value)

    def used(self, key: str) -> Any:
        """What the spec runs with for `key`: its value, else fp8launch's default."""
        value = self.value(key)
        if value is not None:
            return value
        return dig(defaults(), key)

    def value(self, key: str, default: Any = None) -> Any:
        return dig(self.spec, key, default)

    def unset(self, key: str) -> None:
        *parents, leaf = key.split(".")
        node = self.value(".".join(parents)) if parents else self.spec
        if isinstance(node, dict):
            node.pop(leaf, None)

    # --- the report ------------------------------------------------------------------------------

    def _entry(self, status: str, source: str | tuple[str, ...], sets: tuple, note: str, value: Any) -> Entry:
        sources = (source,) if isinstance(source, str) else tuple(source)
        if value is UNSET and status != NONE:  # a key with no equivalent is named, not quoted: its value is in the user's file
            values = [self.get(s) for s in sources if self.get(s) is not None]
            value = values[0] if len(values) == 1 else (values if values else UNSET)
        for key, v in sets:
            if holds_hidden(v):  # a table where a value belongs, holding a secret: what the spec would get is no setting
                raise ValueError(with_fix(f"{', '.join(sources)}: a table holding a secret-looking key where {key} needs a plain "
                                          "value (the secret is not shown)", "write the plain value there; set the secret in the "
                                          "environment where the job runs"))
        for s in sources:
            self.take(s)
        for key, v in sets:
            self.set(key, v)
        return self.report.add(Entry(source=", ".join(sources), status=status, value=value, sets=list(sets), note=note))

    def mapped(self, source: str | tuple[str, ...], *sets: tuple[str, Any], note: str = "", value: Any = UNSET) -> Entry:
        return self._entry(MAPPED, source, sets, note, value)

    def approximated(self, source: str | tuple[str, ...], *sets: tuple[str, Any], before: str, after: str, effect: str,
                     value: Any = UNSET) -> Entry:
        """What the source does (`before`) and what the spec does instead (`after`), in numbers where there are
        numbers, and what that does to the run (`effect`)."""
        entry = self._entry(APPROXIMATED, source, sets, effect, value)
        entry.before, entry.after = before, after
        return entry

    def none(self, source: str | tuple[str, ...], why: str, *sets: tuple[str, Any], value: Any = UNSET) -> Entry:
        return self._entry(NONE, source, sets, why, value)

    def placeholder(self, source: str | tuple[str, ...], key: str, value: Any, why: str, instead: str) -> Entry:
        """No equivalent for `source`: `key` gets placeholder `value` (marked on its line), `instead` says what to put there."""
        self.placeholders[key] = instead
        return self.none(source, f"{why}; {key} = {shown(value)} is a PLACEHOLDER", (key, value))

    def auto(self, source: str, key: str, why: str) -> Entry:
        """No equivalent for `source` ("auto": filled in by a program fp8launch does not run); its line says the value the
        spec uses for `key` (finish() writes it, once the spec is complete)."""
        entry = self.none(source, why)
        self.autos.append((entry, key, why))
        return entry

    def world_unknown(self, why: str, procs: int = 8) -> None:
        """The source does not say how many processes run: 1 node x `procs` (fp8launch's default 8), a placeholder, grown to
        hold the source's degrees once they are read (placeholders.size_world)."""
        self.world_why, self.world_procs = why, procs
        self.world_entry = self.placeholder("(world size)", "distributed.procs_per_node", procs,
                         f"{why}; 1 node x {procs} processes" + (" (fp8launch's default)" if procs == 8 else ""),
                         "your GPUs per node (and distributed.nodes)")

    def group(self, prefix: str, why: str) -> Entry | None:
        """What is left under `prefix`, as one no-equivalent entry."""
        rest = self.untaken(prefix)
        if not rest:
            return None
        if len(rest) == 1:
            return self.none(rest[0], why)
        names = ", ".join(k[len(prefix) + 1:] if k.startswith(prefix + ".") else k for k in rest)
        self.taken.update(rest)
        return self.report.add(Entry(source=f"{prefix}.{{{names}}}", status=NONE, note=why))

    def bundle(self, keys: tuple[str, ...], why: str) -> Entry | None:
        """The untaken of these top-level `keys`, as one no-equivalent entry."""
        rest = [k for k in keys if k in self.leaves and k not in self.taken]
        if len(rest) <= 1:
            return self.none(rest[0], why) if rest else None
        self.taken.update(rest)
        return self.report.add(Entry(source="{" + ", ".join(rest) + "}", status=NONE, note=why))

    def ignore(self, found: list[Unknown]) -> None:
        """Keys the source's tool does not read (known.Unknown): taken now, so that no table's entry swallows them,
        and reported by leftovers() with "did you mean"."""
        for u in found:
            self.taken |= {k for k in self.leaves if k == u.key or k.startswith(u.key + ".")}
        self.unknowns += found

    def leftovers(self, why: str) -> None:
        """The keys the source's tool does not read, then every leaf no importer took: no equivalent."""
        for u in self.unknowns:
            inside = [k[len(u.key) + 1:] for k in self.leaves if k.startswith(u.key + ".") and secret_looking(k[len(u.key) + 1:])]
            held = (f"; secret-looking keys inside ({', '.join(inside)}): never copied; set them in the environment where the job runs, "
                    "not in the spec" if inside and not secret_looking(u.key) else "")
            self.report.add(Entry(source=u.key, status=NONE, note=_unknown_note(u) + held))
        for key in self.untaken():
            self.none(key, why)

    def finish(self) -> None:
        """What depends on the whole spec, made again at each planning round: the tables no setting reads dropped
        (prune), the batch entries, the values the "auto" lines name."""
        self.prune()
        for finisher in self.finishers:
            finisher(self)
        self._batch()
        for entry, key, why in self.autos:
            used = self.used(key)
            if key == "distributed.global_batch_size" and not used:
                value = "micro_batch_size x grad_accum_steps x data-parallel ranks (derived)"
            elif self.value(key) is None:
                value = f"{key} = {shown(used)} (fp8launch's default): set it to your run's value"
            else:
                value = f"{key} = {shown(used)}"
            entry.note = f"{why}; the spec uses {value}"

    def prune(self) -> None:
        """Drop the backend / strategy tables the spec's choices never read (what rule SECTION-UNUSED warns about): their
        entries say the setting has no effect there."""
        mode, backend = self.value("precision.mode", "bf16"), self.value("precision.backend", "torchao")
        strategy = self.value("distributed.strategy", "fsdp2")
        unread = {**{f"precision.{b.section}": mode != "fp8" or backend != b.name for b in BACKENDS.values()},
                  "distributed.fsdp2": strategy != "fsdp2",
                  "distributed.deepspeed": strategy != "deepspeed",
                  "distributed.pipeline": self.value("distributed.pipeline_parallel", 1) <= 1}
        for section, drop in unread.items():
            if not drop or self.value(section) is None:
                continue
            self.unset(section)
            reader = ("distributed.pipeline_parallel = 1" if section == "distributed.pipeline" else
                      f"distributed.strategy = {strategy!r}" if section.startswith("distributed") else
                      f"precision.backend = {backend!r}" if mode == "fp8" else f"precision.mode = {mode!r}")
            for e in list(self.report.entries):
                gone = [k for k, _ in e.sets if k.startswith(section + ".")]
                if gone and e.source.startswith("(rule ") and len(gone) == len(e.sets):
                    self.report.entries.remove(e)  # a rule's move inside a section no longer written: nothing of it is left
                elif gone:
                    e.sets = [(k, v) for k, v in e.sets if k not in gone]
                    e.note = (e.note + "; " if e.note else "") + f"{', '.join(gone)} not written: no effect with {reader}"

    # --- the batch -------------------------------------------------------------------------------

    def _batch(self) -> None:
        """The batch entries (batch.entries) for the spec as it stands, where the source read its batch (batch_at)."""
        self.report.entries = [e for e in self.report.entries if e.tag != batch.TAG]
        at = len(self.report.entries) if self.batch_at is None else min(self.batch_at, len(self.report.entries))
        d = self.spec.get("distributed", {})
        ranks = Layout.of_degrees(d.get("nodes", 1) * d.get("procs_per_node", 8), tp=d.get("tensor_parallel", 1),
                                  cp=d.get("context_parallel", 1), pp=d.get("pipeline_parallel", 1)).dp
        placeholder = "distributed.procs_per_node" in self.placeholders
        made = batch.entries(self.batch, micro=self.value("train.micro_batch_size"), ranks=ranks, placeholder=placeholder)
        for entry in made:
            for key, value in entry.sets:
                self.set(key, value)
        self.report.entries[at:at] = made
        extra = batch.hint(self.batch, self.value("train.micro_batch_size"))
        if placeholder and extra and extra not in self.placeholders["distributed.procs_per_node"]:
            self.placeholders["distributed.procs_per_node"] += f"; {extra}"

    def note_batch(self, attr: str, value: int, source: str) -> None:
        """The source's micro ("micro"), accumulation ("accum") or global ("global_") batch, read from `source`."""
        setattr(self.batch, attr, int(value))
        setattr(self.batch, attr.rstrip("_") + "_source", source)
        self.take(source)
        if self.batch_at is None:
            self.batch_at = len(self.report.entries)

    def split_batch(self, ranks: int, what: str) -> None:
        """The source has `ranks` context / pipeline parallel ranks (`what`, in its words) that the spec does not split
        sequences or layers over: data-parallel ranks here."""
        self.batch.split *= ranks
        self.batch.split_what = f"{self.batch.split_what} and {what}" if self.batch.split_what else what
        if self.batch_at is None:
            self.batch_at = len(self.report.entries)


def _unknown_note(u: Unknown) -> str:
    near = f" (did you mean {u.near}?)" if u.near else ""
    return f"unknown to {u.tool}{near}: {u.says}; nothing in the spec comes from it"


def render(draft: Draft, header: list[str]) -> str:
    """The spec's TOML: the comment block (`header` and the report), then version, name and the tables in SECTIONS order;
    each placeholder's line ends with a comment saying so."""
    spec = {"version": 1, "name": draft.name}
    spec.update({s: draft.spec[s] for s in SECTIONS if draft.spec.get(s)})
    spec.update({k: v for k, v in draft.spec.items() if k not in SECTIONS and k not in spec})
    lines = toml_text(spec).splitlines()
    table = ""
    for i, line in enumerate(lines):
        if m := re.match(r"^\[(.+)\]$", line):
            table = m.group(1)
            continue
        key = line.split(" = ", 1)[0]
        dotted = f"{table}.{key}" if table else key
        if dotted in draft.placeholders:
            lines[i] = f"{line}  # PLACEHOLDER: {one_line(draft.placeholders[dotted])}"
    return draft.report.comment(header) + "\n".join(lines) + "\n"


def source_stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]

