"""What a plan names by reference: local paths and `py:module:function` user factories.

A spec names files and factories relative to itself, but a run may start anywhere, so a
relative path is tried against the current directory first, then the spec's folder.
Factories are imported with the current directory and the spec's folder on `sys.path`
and called with no arguments; exceptions raised inside a factory are the user's and
propagate unchanged, with their traceback.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from typing import Any, Callable

from launcher.errors import InputError
from launcher.planning.suggest import did_you_mean


def resolve_path(path: str, spec_dir: str, key: str) -> str:
    """An existing file or folder for `path`: as given (absolute, or from the current
    directory), else relative to `spec_dir`. Raises InputError naming `key` when neither exists."""
    path = os.path.expanduser(path)
    tried = [os.path.abspath(path)]
    if os.path.exists(path):
        return path
    if not os.path.isabs(path):
        candidate = os.path.join(spec_dir, path)
        tried.append(os.path.abspath(candidate))
        if os.path.exists(candidate):
            return candidate
    raise InputError(
        key,
        f"'{path}' does not exist (tried {', '.join(tried)})",
        "give an absolute path, or one relative to the current directory or the spec's folder",
    )


def _search_path(spec_dir: str) -> list[str]:
    """Put the current directory, then the spec's folder, on sys.path; return them."""
    wanted = [os.getcwd(), os.path.abspath(spec_dir)]
    present = {os.path.abspath(p or ".") for p in sys.path}
    for i, folder in enumerate(wanted):
        if folder not in present:
            sys.path.insert(i, folder)
            present.add(folder)
    return wanted


def _where(e: BaseException) -> str:
    """'file:line' where `e` was raised (for a SyntaxError, where the bad code is)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    frames = traceback.extract_tb(e.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def parse_ref(ref: str, key: str) -> tuple[str, str]:
    """'py:pkg.mod:fn' (or 'pkg.mod:fn') -> ('pkg.mod', 'fn')."""
    body = ref[3:] if ref.startswith("py:") else ref
    module, sep, name = body.rpartition(":")
    if not sep or not module or not name:
        raise InputError(key, f"'{ref}' is not a factory reference", "write it as py:module:function, e.g. py:my_model:build")
    return module, name


def import_factory(ref: str, spec_dir: str, key: str) -> Callable[[], Any]:
    """The callable named by `ref` ('py:module:function'), checked to take no arguments."""
    module_name, func_name = parse_ref(ref, key)
    searched = _search_path(spec_dir)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing_itself = e.name is None or module_name == e.name or module_name.startswith(e.name + ".")
        if not missing_itself:
            raise InputError(
                key,
                f"module '{module_name}' was found but importing it failed: {e}",
                f"install the package '{e.name.split('.')[0]}' where the run happens",
            ) from e
        raise InputError(
            key,
            f"no module named '{module_name}' (searched the current directory and the spec's folder: "
            f"{', '.join(searched)}, then the rest of sys.path)",
            f"put {module_name.replace('.', '/')}.py in one of those folders, or install the package that provides it",
        ) from e
    except Exception as e:
        raise InputError(
            key,
            f"importing module '{module_name}' raised {type(e).__name__} at {_where(e)}: {e}",
            f"fix the error in {module_name}",
        ) from e

    func = getattr(module, func_name, None)
    where = getattr(module, "__file__", None) or module_name
    if func is None:
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        raise InputError(
            key,
            f"module '{module_name}' ({where}) has no '{func_name}'{did_you_mean(func_name, names)}",
            f"name one of its functions: {', '.join(sorted(names)) or '(it defines none)'}",
        )
    if not callable(func):
        raise InputError(
            key, f"'{module_name}.{func_name}' is a {type(func).__name__}, not a function", "name a function that takes no arguments"
        )
    try:
        inspect.signature(func).bind()
    except TypeError:
        raise InputError(
            key,
            f"factory '{module_name}.{func_name}{inspect.signature(func)}' cannot be called with no arguments",
            "give every parameter a default, or wrap it in a function that takes none",
        ) from None
    except ValueError:
        pass  # builtins without a signature: let the call decide
    return func


def load_factory(ref: str, spec_dir: str, key: str) -> Any:
    """Import `ref` ('py:module:function') and return what calling it with no arguments returns."""
    return import_factory(ref, spec_dir, key)()
