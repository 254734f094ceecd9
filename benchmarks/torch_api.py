"""The torch names fp8launch's code uses, checked against the floor torch (pyproject's `torch>=`, 2.11: the GPU image's).

    python benchmarks/torch_api.py              # print what launcher/ uses, and check it against the manifest
    python benchmarks/torch_api.py --record     # with the floor's torch installed: resolve every name, write the manifest

A name is a dotted path from torch that the code spells out: `torch.distributed.fsdp.fully_shard`, `dist.ReduceOp.SUM`
(`import torch.distributed as dist`), `from torch.distributed.pipelining import PipelineStage`. The scan is the AST of
launcher/**.py, so it needs no torch (tests/test_torch_api.py runs it in CI against the recorded manifest). A name is
behind a feature check where the code asks for it with `getattr(X, "name", default)` or `hasattr(X, "name")`, or uses it
inside a `try:` whose handler catches ImportError / AttributeError: such a name may be missing on the floor.

--record imports torch and resolves each name (modules imported, then attributes), and writes
benchmarks/results/torch_api_manifest.json: the names present on that torch, and those missing there but checked. It
exits 1, naming them, where a name is missing and not checked. Methods called on torch's objects (`model.set_...`)
are not names the scan sees: `make test-compat TORCH=X` runs the tests on that torch for those.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
MANIFEST = REPO / "benchmarks" / "results" / "torch_api_manifest.json"
CAUGHT = {"ImportError", "ModuleNotFoundError", "AttributeError", "Exception"}


@dataclasses.dataclass(frozen=True)
class Use:
    name: str  # dotted, from torch
    where: str  # file:line
    checked: bool  # behind a feature check


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to torch paths anywhere in the file (function-local imports included)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    found[a.asname] = a.name if a.asname else None
                    if a.asname is None:
                        found["torch"] = "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "torch" or node.module.startswith("torch.")):
            for a in node.names:
                found[a.asname or a.name] = f"{node.module}.{a.name}"
    found.pop(None, None)
    return found


def _guarded(tree: ast.AST) -> set[int]:
    """ids of the nodes inside a try: body whose handlers catch a missing name."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            caught = set()
            for h in node.handlers:
                types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type] if h.type else []
                caught |= {t.id for t in types if isinstance(t, ast.Name)} or {"Exception"}
            if caught & CAUGHT:
                for stmt in node.body:
                    ids |= {id(n) for n in ast.walk(stmt)}
    return ids


def scan_source(text: str, where: str) -> list[Use]:
    """Every torch name `text` uses, each use once."""
    tree = ast.parse(text)
    aliases = _aliases(tree)
    guarded = _guarded(tree)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}

    def resolve(node) -> str | None:
        parts = _dotted(node)
        if not parts or parts[0] not in aliases:
            return None
        return ".".join([aliases[parts[0]], *parts[1:]])

    uses = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "torch":
            uses += [Use(f"{node.module}.{a.name}", line, id(node) in guarded) for a in node.names]
        elif isinstance(node, ast.Import):
            uses += [Use(a.name, line, id(node) in guarded) for a in node.names if a.name.split(".")[0] == "torch"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            base = resolve(node.args[0])
            if base and (node.func.id == "hasattr" or len(node.args) == 3):
                uses.append(Use(f"{base}.{node.args[1].value}", line, True))
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            name = resolve(node)
            if name:
                uses.append(Use(name, line, id(node) in guarded))
    return uses


def scan(root: pathlib.Path = REPO / "launcher") -> list[Use]:
    uses = []
    for path in sorted(root.rglob("*.py")):
        uses += scan_source(path.read_text(), str(path.relative_to(REPO)))
    return uses


def names(uses: list[Use]) -> tuple[set[str], set[str]]:
    """(names used somewhere without a check, names used only behind one)."""
    unchecked = {u.name for u in uses if not u.checked}
    return unchecked, {u.name for u in uses if u.checked} - unchecked


def present(name: str) -> bool:
    """Whether this process's torch has `name`: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    obj, i = None, len(parts)
    while i > 0:
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            i -= 1
        except Exception:  # a module that fails to import on this machine (no GPU library): not an API question
            return True
    for part in parts[i:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def check(uses: list[Use], manifest: dict) -> list[str]:
    """Problems: names used without a check that the floor's manifest does not hold."""
    have = set(manifest["present"])
    where = {}
    for u in uses:
        if not u.checked:
            where.setdefault(u.name, u.where)
    unchecked, _ = names(uses)
    return [f"{where[n]}: {n} is not in torch {manifest['torch']}'s recorded API" for n in sorted(unchecked - have)]


def record(uses: list[Use]) -> tuple[dict, list[str]]:
    import torch

    unchecked, checked = names(uses)
    everything = sorted(unchecked | checked)
    found = {n: present(n) for n in everything}
    missing = sorted(n for n in unchecked if not found[n])
    manifest = {"benchmark": "torch_api", "command": "python benchmarks/torch_api.py --record",
                "torch": torch.__version__.split("+")[0],
                "present": sorted(n for n in everything if found[n]),
                "missing_checked": sorted(n for n in checked if not found[n])}
    return manifest, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="resolve the names on this torch and write the manifest")
    args = parser.parse_args(argv)
    uses = scan()
    unchecked, checked = names(uses)
    if args.record:
        manifest, missing = record(uses)
        for n in missing:
            print(f"missing on torch {manifest['torch']}, unchecked: {n}")
        if missing:
            return 1
        MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
        print(f"torch {manifest['torch']}: {len(manifest['present'])} names present, "
              f"{len(manifest['missing_checked'])} missing behind a check -> {MANIFEST.relative_to(REPO)}")
        return 0
    problems = check(uses, json.loads(MANIFEST.read_text()))
    print(f"{len(unchecked)} torch names used, {len(checked)} only behind a feature check; {len(problems)} problems")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
