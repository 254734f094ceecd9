"""The house keeps its shape (issue 23): no import circle among launcher's modules, function-level imports
included (they hid one before), and planning/ (what `fp8launch plan` runs: pre-commit, CI) never reaches
torch or the training code, even lazily."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "launcher"


def _name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str) -> set[str]:
    """Every module `module` imports, at any depth of its code (TYPE_CHECKING blocks included):
    `from pkg import sub` counts as importing pkg.sub when that is a module, else pkg."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") if node.level else node.module
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
    return out


def _type_checking_only(module: str) -> set[str]:
    """The imports that sit only under `if typing.TYPE_CHECKING:` (annotations, never run)."""
    tree = ast.parse(MODULES[module].read_text())
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and sub.module:
                    inside.update(f"{sub.module}.{a.name}" if f"{sub.module}.{a.name}" in MODULES else sub.module for a in sub.names)
    return inside


def graph(skip_type_checking: bool = True) -> dict[str, set[str]]:
    return {m: {i for i in imports(m) - (_type_checking_only(m) if skip_type_checking else set()) if i in MODULES and i != m}
            for m in MODULES}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_even_through_function_level_imports():
    assert circles(graph()) == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_planning_reaches_neither_torch_nor_the_training_code():
    """Everything planning/ imports, transitively, at any depth of the code (not only what `plan` happens to run)."""
    g = {m: imports(m) - _type_checking_only(m) for m in MODULES}
    seen, todo = set(), [m for m in MODULES if m.startswith("launcher.planning")]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(i for i in g.get(m, ()) if i in MODULES)
    reached = {i.split(".")[0] for m in seen for i in g[m]} | {m for m in seen}
    assert not {"torch", "torchao", "deepspeed", "transformer_engine", "msamp"} & reached
    assert not [m for m in seen if m.startswith(("launcher.train", "launcher.commands"))]


MAX_FUNCTION_LINES = 80


def test_no_function_in_launcher_is_over_80_lines():
    """A function longer than a screen does several jobs: split it into named steps (issue 53)."""
    long = [f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in MODULES.values() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []
