"""`fp8launch import FILE`: a config from another project -> an fp8launch spec and a per-setting report.

    imported = import_config("accelerate.yaml", folder=".")   # read, detect the kind, map, make it plan
    imported.text                                              # the spec's TOML, the report as its comment block
    imported.report.lines()                                    # mapped / approximated / no equivalent, one per setting

The kind is detected from the content (each kind scores the keys it knows), not from the extension: an
Accelerate config, an Axolotl YAML, a torchtitan job TOML, a NeMo / Megatron-Bridge YAML or a DeepSpeed JSON.
One module per kind (its `KIND` record: score, read, name, unknown); known/ holds each tool's key names: a key the
tool refuses (torchtitan: any; Accelerate: a top-level one; DeepSpeed: one in a section it validates strictly) stops
the import, exit 2, with "did you mean"; any other unknown key is reported. draft.py holds the spec being built and
the report (report.py: every line mapped, approximated with before / after / effect, or no equivalent); batch.py
the batch; planable.py makes the result plan. Nothing here imports torch.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass

from launcher.errors import EnvironmentProblem, SourceError, with_fix
from launcher.planning import bounded
from launcher.planning.sourcemap import json_duplicates

from . import accelerate, axolotl, deepspeed, megatron, placeholders, torchtitan
from .draft import Draft, render, source_stem, spec_name
from .kind import Kind
from .planable import settle
from .report import Report

KINDS: tuple[Kind, ...] = (accelerate.KIND, axolotl.KIND, torchtitan.KIND, megatron.KIND, deepspeed.KIND)

MAX_BYTES = bounded.CONFIG_BYTES
MAX_LEAVES = 20000
MAX_DEPTH = 64
"""Tables and lists nest at most this deep in a config (a NeMo / Megatron-Bridge YAML: under 10)."""
MAX_NODES = 200_000
"""The most values a YAML document may hold with its aliases expanded: a NeMo config holds a few thousand, a
billion-laughs file of a few hundred bytes a billion."""


@dataclass(frozen=True, slots=True)
class Imported:
    kind: Kind
    name: str
    """The spec name (from the source's run or job name, else the file name)."""
    text: str
    """The spec's TOML, planned: the report is its comment block."""
    report: Report


def _yaml(text: str):
    try:
        import yaml
    except ImportError as e:  # pyyaml is a dependency of fp8launch; an install from before it was may lack it
        raise EnvironmentProblem(with_fix("the pyyaml package is not importable", "pip install 'pyyaml>=6', or reinstall fp8launch "
                                          'from your clone: pip install -e .')) from e

    class Loader(yaml.SafeLoader):
        """SafeLoader that reads an unknown tag (`!!python/...`, a project's own `!tag`) as the plain value under it, and
        refuses a document nested past MAX_DEPTH (while composing it: composing recurses) or holding more than MAX_NODES
        values once its aliases are expanded (before constructing it: what is built shares the aliased values, but
        every reader of it walks them all)."""

        depth = 0

        def fetch_flow_collection_start(self, token_class):
            if self.flow_level >= MAX_DEPTH:  # before the scanner looks ahead through every bracket for a simple key
                raise bounded.Refused(f"nested more than {MAX_DEPTH} levels deep (line {self.line + 1}): not a config")
            super().fetch_flow_collection_start(token_class)

        def compose_node(self, parent, index):
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    line = self.peek_event().start_mark.line + 1
                    raise bounded.Refused(f"nested more than {MAX_DEPTH} levels deep (line {line}): not a config")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_document(self, node):
            _expanded_size(node, yaml)
            return super().construct_document(node)

    def plain(loader, _suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node)
        return loader.construct_scalar(node)

    Loader.add_multi_constructor("!", plain)
    Loader.add_multi_constructor("tag:", plain)
    return yaml.load(text, Loader=Loader)  # noqa: S506 -- a SafeLoader subclass


def _expanded_size(root, yaml) -> None:
    """Raise bounded.Refused when the YAML node graph under `root`, every alias expanded, holds more than MAX_NODES nodes or
    nests past MAX_DEPTH, or an alias holds itself. Each node is counted once (its expanded size kept), so a
    billion-laughs file costs what its text costs; no recursion (aliases can chain deeper than the stack)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]

    def children(node):
        if isinstance(node, yaml.MappingNode):
            return [part for pair in node.value for part in pair]
        return node.value if isinstance(node, yaml.SequenceNode) else []

    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_nodes.discard(key)
            line = node.start_mark.line + 1
            if size[key] > MAX_NODES:
                raise bounded.Refused(f"its YAML aliases expand to more than {MAX_NODES} values (line {line}): not a config")
            if depth[key] > MAX_DEPTH:
                raise bounded.Refused(f"its YAML aliases nest more than {MAX_DEPTH} levels deep (line {line}): not a config")
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise bounded.Refused(f"a YAML alias holds itself (line {node.start_mark.line + 1}): not a config")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in children(node) if id(k) not in size)


def _json(text: str):
    try:
        return bounded.loads_json(text)
    except bounded.DuplicateKey as e:
        where = json_duplicates(text)
        at = f"{'.'.join(where[0][0])} (line {where[0][1]})" if where else e.key
        raise bounded.Refused(f"{at}: a key written twice in one object; JSON readers keep only the last, DeepSpeed refuses "
                              "it; fix: keep one") from None
    except bounded.NotANumber as e:
        raise bounded.Refused(f"{e.text} is not a number JSON allows; fix: write a finite number") from None
    except bounded.Refused as e:
        raise bounded.Refused(f"{e} (JSON); a config is at most {MAX_DEPTH} levels deep") from None


PARSERS = {"json": _json, "toml": tomllib.loads, "yaml": _yaml}
BY_EXTENSION = {".json": "json", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}


def load(path: str) -> tuple[str, dict]:
    """(format, data) of the file at `path`: JSON, TOML or YAML, whichever parses to a table (the extension's first).
    Raises SourceError (one line) when it cannot be read or parsed, or holds what no config holds."""
    try:
        raw = bounded.read_bytes(path, MAX_BYTES)
    except bounded.Unreadable as e:
        if e.size is not None:
            raise SourceError(path, f"larger than {MAX_BYTES // 2**20} MiB: not a config") from None
        raise SourceError(path, f"{e.strerror}: expected a JSON, TOML or YAML config") from None
    except OSError as e:
        raise SourceError(path, f"cannot read it ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SourceError(path, "not a text file (not UTF-8): expected a JSON, TOML or YAML config") from None
    first = BY_EXTENSION.get(os.path.splitext(path)[1].lower())
    order = [first] + [f for f in PARSERS if f != first] if first else list(PARSERS)
    errors = {}
    for fmt in order:
        try:
            data = PARSERS[fmt](text)
        except (SourceError, EnvironmentProblem):
            raise
        except bounded.Refused as e:
            raise SourceError(path, str(e)) from None
        except RecursionError:
            raise SourceError(path, f"nested deeper than Python reads ({fmt.upper()}); a config is at most {MAX_DEPTH} levels "
                                    "deep") from None
        except Exception as e:  # each parser has its own error types; the first line says where
            errors[fmt] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            continue
        if data is None or data == {}:
            raise SourceError(path, f"empty: it holds no settings (it reads as {fmt.upper()}, with nothing but blanks and comments)")
        if isinstance(data, dict):
            _check_values(path, data)
            return fmt, data
        kind = {"str": "text", "list": "list", "int": "number", "float": "number", "bool": "boolean"}.get(type(data).__name__, "value")
        raise SourceError(path, f"not a config: it reads as {fmt.upper()} holding a {kind}, not a table of settings")
    detail = errors.get(first) or "; ".join(f"{k}: {v}" for k, v in errors.items())
    raise SourceError(path, f"cannot parse it as JSON, TOML or YAML ({detail})")


def _check_values(path: str, data: dict) -> None:
    """Refuse nesting past MAX_DEPTH, and NaN or an infinity anywhere (TOML's nan / inf, YAML's .nan / .inf): no setting
    fp8launch maps takes one, and the spec it would go to refuses them."""
    deep = bounded.too_deep(data, MAX_DEPTH)
    if deep is not None:
        raise SourceError(path, f"{'.'.join(map(str, deep[:8]))}...: nested more than {MAX_DEPTH} levels deep: not a config")
    bad = bounded.first_nonfinite(data)
    if bad is not None:
        where, value = bad
        raise SourceError(path, with_fix(f"{'.'.join(map(str, where))}: {value} is not a number a config can hold (NaN or infinite)",
                                         "write a finite number, or remove the key"))


def detect(path: str, data: dict) -> Kind:
    """The kind whose keys the data has most of; SourceError when it has none of any kind's."""
    scores = sorted(((k.score(data), i) for i, k in enumerate(KINDS)), reverse=True)
    best, i = scores[0]
    if best <= 0:
        raise SourceError(path, "not a config fp8launch can import: expected an Accelerate config, an Axolotl YAML, a torchtitan "
                                "job TOML, a NeMo / Megatron-Bridge YAML or a DeepSpeed JSON (none of their keys found)")
    return KINDS[i]


def import_config(path: str, folder: str = ".") -> Imported:
    """Read `path`, map it to a spec and make the spec plan (planning in `folder`, where it will be written).
    Raises SourceError for an unreadable or unknown file, SpecError when a rule refuses the spec and no nearer
    setting plans."""
    _, data = load(path)
    kind = detect(path, data)
    try:
        draft = Draft(data, path=path, title=kind.title, max_leaves=MAX_LEAVES)
    except ValueError as e:
        raise SourceError(path, str(e)) from None
    found = kind.unknown(draft)
    refused = [u for u in found if u.refused]
    if refused:
        more = f" ({len(refused) - 1} more: {', '.join(u.label or u.key for u in refused[1:])})" if len(refused) > 1 else ""
        raise SourceError(path, with_fix(refused[0].line() + more, "correct the name, or remove the key"))
    draft.ignore(found)
    try:
        kind.read(draft)
    except (ValueError, TypeError) as e:  # a value of the wrong type (lr: "fast"): invalid input, one line
        raise SourceError(path, f"a value this {kind.title} should not have: {e}") from None
    draft.leftovers(kind.other)
    placeholders.size_world(draft)
    draft.name = spec_name(kind.name(draft) or source_stem(path))
    header = [f"Imported by `fp8launch import` from {os.path.basename(path)} ({kind.title}).",
              "Each setting of the source and what it became; a line marked PLACEHOLDER needs your value.", ""]
    try:
        text = settle(draft, lambda d: render(d, header + [d.report.summary() + ":"]), folder, label=f"{path} (imported)")
    except (ValueError, TypeError) as e:  # a value that only the batch or the layout arithmetic finds wrong (a batch of 0)
        raise SourceError(path, f"a value this {kind.title} should not have: {e}") from None
    return Imported(kind=kind, name=draft.name, text=text, report=draft.report)
