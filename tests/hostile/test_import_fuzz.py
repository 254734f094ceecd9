"""`fp8launch import` of real configs broken at random (tests/hostile/mutate.py): whatever the mutation, the import
either writes a spec that plans or refuses with LauncherError lines (one per problem, exit 2 or 3 in the CLI), never an
exception of Python's own, and returns in well under a second each. Hypothesis draws the mutations (derandomized: CI
sees the same examples every run; the long search is benchmarks/fuzz_inputs.py)."""

from __future__ import annotations

import tempfile
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.commands.importer import import_config
from launcher.errors import LauncherError
from tests.hostile.corpus import Case, check
from tests.hostile.mutate import SOURCES, mutated

SLOWEST_S = 5.0
"""A bound for a hang, not a speed check: an import of these files takes ~20 ms here, 2-3x that on the slowest CI hosts."""


@settings(max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(source=st.sampled_from(SOURCES), steps=st.integers(1, 4), data=st.data())
def test_a_mutated_real_config_imports_or_is_refused_in_lines(source, steps, data):
    choose = lambda n: data.draw(st.integers(0, n - 1))  # noqa: E731
    with tempfile.TemporaryDirectory() as folder:
        path = mutated(source, choose, steps, Path(folder))
        t0 = time.monotonic()
        try:
            result = import_config(str(path), folder=folder)
        except LauncherError as e:
            assert e.exit_code in (2, 3), (source, e)
            lines = str(e).splitlines()
            assert lines and all(line.strip() for line in lines) and "Traceback" not in str(e), (source, str(e))
        else:
            spec = tomllib.loads(result.text)  # the spec it would write parses, and names itself
            assert spec["version"] == 1 and spec["name"] == result.name
        assert time.monotonic() - t0 < SLOWEST_S, source


FOUND = [
    # benchmarks/fuzz_inputs.py found these; each was a traceback before
    Case(id="deepspeed-global-batch-0", argv=("import", "ds.json", "--out", "s.toml"), code=2, absent=("s.toml",),
         files={"ds.json": '{"train_batch_size": 0, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}'},
         line=r"^error: ds\.json: a value this DeepSpeed JSON should not have: train_batch_size: 0 sequences per step; "
              r"a batch is at least 1$"),
]


@pytest.mark.parametrize("case", FOUND, ids=str)
def test_what_the_long_fuzz_found(case, tmp_path):
    check(case, tmp_path)
