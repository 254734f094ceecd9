"""CI's phases run two tests at a time (pytest-xdist, `--dist loadgroup`) and rely on `xdist_group` marks: the SLURM
tests share one cluster, the tests that read one module-scoped reference run (tensor parallel, MoE, resume) share one
worker so the runs are built once. pytest 9.2 ignored the marks silently (pytest-dev/pytest-xdist#1386: xdist renames
node ids, pytest 9.2's are structured): CI from a cold machine built the tensor-parallel reference runs twice, 115 s +
131 s. constraints.txt pins pytest 9.1.1 for it; this holds the pair to grouping."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_an_xdist_group_runs_on_one_worker_and_builds_its_module_fixture_once(tmp_path):
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent("""
        import os
        import pytest

        pytestmark = pytest.mark.xdist_group("reference_runs")

        @pytest.fixture(scope="module")
        def runs(tmp_path_factory):
            with open(os.environ["SETUPS"], "a") as f:
                f.write(f"{os.getpid()}\\n")

        @pytest.mark.parametrize("i", range(4))
        def test_reads_the_runs(runs, i):
            with open(os.environ["WORKERS"], "a") as f:
                f.write(f"{os.environ['PYTEST_XDIST_WORKER']}\\n")
    """))
    (tmp_path / "test_others.py").write_text("import pytest\n\n@pytest.mark.parametrize('i', range(4))\ndef test_other(i):\n    pass\n")
    setups, workers = tmp_path / "setups", tmp_path / "workers"
    env = {"PATH": "/usr/bin:/bin", "SETUPS": str(setups), "WORKERS": str(workers)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                        str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(set(workers.read_text().split())) == 1, workers.read_text()  # one worker ran the group
    assert len(setups.read_text().split()) == 1  # and built the module's runs once


def test_tests_that_compile_are_handed_out_first_then_the_heavy_ones_and_the_rest_keep_their_order():
    """tests/conftest.py's ordering: a compiled support-matrix run collected after eager ones still goes first, a long
    in-process run next."""
    import types

    import conftest

    def item(name, marker=None):
        return types.SimpleNamespace(name=name, get_closest_marker=lambda m: object() if m == marker else None)

    items = [item("e1"), item("h1", "heavy"), item("c1", "compiles"), item("e2"), item("c2", "compiles"), item("e3")]
    conftest.pytest_collection_modifyitems(items)
    assert [i.name for i in items] == ["c1", "c2", "h1", "e1", "e2", "e3"]
