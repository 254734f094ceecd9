"""The package list in pyproject.toml ships every subpackage: a non-editable install (pip install
fp8launch) has only what it names, while the editable install the tests run from finds everything."""

from __future__ import annotations

import pathlib
import tomllib

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "launcher").rglob("__init__.py")}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
