"""The corpus runner itself (tests/hostile/corpus.py): it tells a wrong code, a changed file and a hang."""

from __future__ import annotations

import pytest

from tests.hostile.corpus import Case, check

SPEC = 'version = 1\nname = "tiny"\n[launch]\ndevice = "cpu"\n'


def test_a_one_line_error_passes_and_leaves_the_files(tmp_path):
    got = check(Case(id="missing", argv=("plan", "nope.toml"), code=2, line=r"^nope\.toml: error: no such file",
                     files={"keep.toml": SPEC}), tmp_path)
    assert got.code == 2 and got.stderr.count("\n") == 1


@pytest.mark.parametrize("case, complaint", [
    (Case(id="code", argv=("plan", "nope.toml"), code=3, line="."), "exit 2"),
    (Case(id="line", argv=("plan", "nope.toml"), code=2, line="not this"), "expected a line matching"),
    (Case(id="changed", argv=("plan", "nope.toml"), code=2, line=".", files={"s.toml": SPEC}, kept={"s.toml": SPEC + "#\n"}),
     "s.toml changed"),
    (Case(id="absent", argv=("plan", "nope.toml"), code=2, line=".", files={"s.toml": SPEC}, absent=("s.toml",)), "s.toml exists"),
    (Case(id="hang", argv=("plan", "nope.toml"), code=2, line=".", process=True, timeout=3, env={"PYTHONPATH": "."},
          files={"sitecustomize.py": "import time\ntime.sleep(60)\n"}), "hung"),
], ids=lambda v: v.id if isinstance(v, Case) else "")
def test_each_broken_promise_fails_the_case(case, complaint, tmp_path):
    with pytest.raises(AssertionError, match=complaint):
        check(case, tmp_path)
