"""The project an invocation works in, found as black finds it: the nearest folder upward holding
.git or pyproject.toml, else the current folder. Two things come from it:

- where paths inside generated files are relative to (`relative_to_root`): the same bytes for a
  relative, an absolute or a from-another-folder spelling of `--out`, never a machine path;
- the `--out` default, from `[tool.fp8launch]` in the root's pyproject.toml, so that
  `fp8launch plan --check specs/*.toml` in CI and pre-commit finds the committed folder:

    [tool.fp8launch]
    out = "specs/generated"
"""

from __future__ import annotations

import os
import tomllib

from launcher.errors import UsageError
from launcher.planning import bounded

DEFAULT_OUT = "generated"
MARKERS = (".git", "pyproject.toml")


def find_root(start: str = ".") -> str:
    """The nearest folder from `start` upward holding .git or pyproject.toml (absolute), else the current folder."""
    folder = os.path.abspath(start)
    while True:
        if any(os.path.exists(os.path.join(folder, m)) for m in MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return os.getcwd()
        folder = parent


def relative_to_root(path: str) -> str:
    """`path` as generated files name it: relative to the project root of the folder it names, with "/"."""
    absolute = os.path.abspath(path)
    start = absolute
    while not os.path.isdir(start) and os.path.dirname(start) != start:
        start = os.path.dirname(start)  # a folder not written yet: search from its nearest existing parent
    return os.path.relpath(absolute, find_root(start)).replace(os.sep, "/")


def default_out(folder: str | None = None) -> str:
    """The `--out` default: [tool.fp8launch] out of the project root's pyproject.toml (relative to
    that root), else "generated" in the current folder."""
    root = find_root(".") if folder is None else folder
    path = os.path.join(root, "pyproject.toml")
    if not os.path.isfile(path):
        return DEFAULT_OUT
    try:
        tool = tomllib.loads(bounded.read_bytes(path, bounded.CONFIG_BYTES).decode("utf-8")).get("tool", {})
    except OSError as e:
        raise UsageError(f"{path}: cannot read [tool.fp8launch]: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:  # TOMLDecodeError, not UTF-8, nested past Python's stack
        raise UsageError(f"{path}: cannot read [tool.fp8launch]: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    settings = tool.get("fp8launch", {}) if isinstance(tool, dict) else {}
    if not isinstance(settings, dict):
        raise UsageError(f'{path}: [tool.fp8launch] must be a table, e.g. out = "specs/generated"')
    if "out" not in settings:
        return DEFAULT_OUT
    out = settings["out"]
    if not isinstance(out, str) or not out:
        raise UsageError(f'{path}: [tool.fp8launch] out must be a folder name, e.g. out = "specs/generated"')
    return os.path.relpath(os.path.join(root, out))
