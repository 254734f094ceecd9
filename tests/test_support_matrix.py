"""The support matrix's generator (torch-free): every schema key is in a matrix or says where it is tested,
every pair is covered, every run's spec is valid, and docs/support-matrix.md is current. The runs
themselves run in tests/e2e/test_support_matrix.py (CPU) and tests/gpu/test_support_matrix_gpu.py."""

from __future__ import annotations

import json
import re

import pytest

from conftest import REPO
from launcher.planning.read import SpecSource, validate
from launcher.planning.rules import RULES_BY_ID
from tools.support_matrix import (
    CPU_BASE,
    CPU_OPTIONS,
    ELSEWHERE,
    GPU_BASE,
    GPU_OPTIONS,
    Option,
    all_pairs,
    document,
    load,
    main,
    pairs_in,
    rows_text,
    schema_keys,
    spec_of,
)

CPU, GPU = load("cpu"), load("gpu")
"""The committed runs (docs/support-matrix.json); test_the_committed_rows_are_what_the_generator_gives holds them to it."""
GENERATES = pytest.mark.xdist_group("support_matrix_generation")
"""The tests that generate the matrices (~15 s, once per process): one worker runs them all."""


def test_every_schema_key_is_in_a_matrix_or_says_where_it_is_tested():
    in_matrix = {o.key for o in CPU_OPTIONS + GPU_OPTIONS}
    keys = set(schema_keys())
    assert keys - in_matrix - set(ELSEWHERE) == set(), "add the new option to a matrix in tools/support_matrix.py"
    assert set(ELSEWHERE) - keys == set() and not (set(ELSEWHERE) & in_matrix)


TEST_FILE = re.compile(r"\b(tests/[\w/]+\.py)(?:::(\w+))?")
TEST_NAME = re.compile(r"(?<![\w:/.])(test_\w+)\b(?!\.py)")


@pytest.mark.parametrize("key", sorted(ELSEWHERE))
def test_every_test_file_and_rule_an_elsewhere_entry_names_is_real(key):
    # Each test file the entry names exists and mentions the key (its last dotted part or the whole, spelled as in
    # a spec, a `--set`, a keyword `train__steps=` or a CLI flag `--rdzv-endpoint`); a `::test_name` and a bare
    # `test_name` are defined there; each rule id or `PREFIX-*` family it names is in the rule table.
    from test_rule_ids import NOT_RULE_IDS, RULE_ID, RULE_PREFIX

    entry, last = ELSEWHERE[key], key.rsplit(".", 1)[-1]
    files = {}
    for m in TEST_FILE.finditer(entry):
        path = REPO / m.group(1)
        assert path.is_file(), f"{key}: {m.group(1)} does not exist"
        text = files.setdefault(m.group(1), path.read_text(encoding="utf-8"))
        assert key in text or last in text or last.replace("_", "-") in text, f"{key}: {m.group(1)} never mentions {last}"
        if m.group(2):
            assert re.search(rf"def {m.group(2)}\b", text), f"{key}: {m.group(0)} is no test"
    for name in TEST_NAME.findall(TEST_FILE.sub("", entry)):
        assert any(re.search(rf"def {name}\b", text) for text in files.values()), f"{key}: {name} is in no file it names"
    rules = [r for r in RULE_ID.findall(entry) if r not in NOT_RULE_IDS]
    assert set(rules) <= set(RULES_BY_ID), f"{key}: no such rule: {sorted(set(rules) - set(RULES_BY_ID))}"
    for prefix in RULE_PREFIX.findall(entry):
        assert any(r.startswith(prefix + "-") for r in RULES_BY_ID), f"{key}: no rule {prefix}-*"


@pytest.mark.parametrize("matrix", [CPU, GPU], ids=["cpu", "gpu"])
def test_every_pair_is_covered_by_a_run_that_trains_or_by_the_rule_that_refuses_it(matrix):
    assert matrix.covered() == set(matrix.pairs)
    trained = set().union(*(pairs_in(matrix.options, r.config) for r in matrix.trained))
    assert set(matrix.pairs) - trained == set(matrix.refused_pairs)  # a pair is refused only where no run trains it
    for r in matrix.refused:
        assert r.refused_by and all(rule in RULES_BY_ID for rule in r.refused_by)
        assert r.pair in pairs_in(matrix.options, r.config)


@pytest.mark.parametrize("matrix", [CPU, GPU], ids=["cpu", "gpu"])
def test_every_runs_spec_is_valid(matrix):
    base = CPU_BASE if matrix is CPU else GPU_BASE
    for r in matrix.runs:
        validate(SpecSource(path=r.name, data=json.loads(json.dumps(spec_of(r.config, r.name, base))), sha256=""))


@GENERATES
def test_the_committed_rows_are_what_the_generator_gives():
    """Generation is deterministic (this process generates what another one committed) and the rows are current."""
    assert (REPO / "docs" / "support-matrix.json").read_text() == rows_text(), "regenerate them: make support-matrix"


def test_pairs_only_where_both_options_apply():
    options = (Option("distributed.strategy"), Option("distributed.fsdp2.cpu_offload", requires=(("distributed.strategy", ("fsdp2",)),)),
               Option("compile.enabled"))
    pairs = all_pairs(options)
    assert (("distributed.strategy", "ddp"), ("distributed.fsdp2.cpu_offload", True)) not in pairs
    assert (("distributed.strategy", "fsdp2"), ("distributed.fsdp2.cpu_offload", True)) in pairs
    assert len(pairs) == 3 * 2 + 2 + 2 * 2  # strategy x compile, fsdp2 x cpu_offload, cpu_offload x compile


@GENERATES
def test_the_doc_is_current():
    path = REPO / "docs" / "support-matrix.md"
    assert path.read_text() == document(REPO), "regenerate it: make support-matrix"
    # the H100 results of benchmarks/results/support_matrix_gpu.json, matched by config (row names move with the rule table)
    assert re.search(r"Status, from .*: g\d+ trained", path.read_text())


@GENERATES
def test_check_fails_on_a_stale_doc_or_stale_rows(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "support-matrix.md").write_text("old\n")
    assert main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "support-matrix.md is not current" in err and "support-matrix.json is not current" in err  # missing counts as stale
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / "support-matrix.md").read_text().startswith("# Support matrix")
    assert main(["--check", "--root", str(tmp_path)]) == 0
    matrix_json = tmp_path / "docs" / "support-matrix.json"
    matrix_json.write_text(matrix_json.read_text().replace('"m01"', '"m00"'))
    assert main(["--check", "--root", str(tmp_path)]) == 1 and "support-matrix.json is not current" in capsys.readouterr().err


def test_the_cpu_matrix_trains_the_monitor_inside_compiled_fp8_blocks():
    """tests/e2e/test_support_matrix.py checks the FP8 stats of such a run (hooks running eagerly inside
    compiled blocks, layers named as built): the generator must keep one."""
    assert CPU.trains_the_monitor_in_compiled_fp8()


@pytest.mark.parametrize("name", ["cpu", "moe"])
def test_runs_that_share_compiled_graphs_share_one_xdist_group(name):
    """Matrix.graph_groups: two trained runs are in one group exactly when they have the same graph key, and no group
    holds a run alone (a run whose graphs no other run has, and an eager run, stay ungrouped: either worker may take it)."""
    import itertools

    from tools.support_matrix import graph_key

    matrix = load(name)
    groups = matrix.graph_groups()
    pairs = list(itertools.combinations(matrix.trained, 2))
    for a, b in pairs:
        same_graphs = graph_key(a.config) is not None and graph_key(a.config) == graph_key(b.config)
        assert (a.name in groups and groups.get(a.name) == groups.get(b.name)) == same_graphs, (a.name, b.name)
    assert all(list(groups.values()).count(g) > 1 for g in groups.values())
    if name == "cpu":
        assert groups and set(groups) < {r.name for r in matrix.trained}


@GENERATES
def test_gpu_results_follow_a_row_by_its_config_not_its_name():
    """Row names are positions in the generated order: they move when an option gains a value (as the torchao
    recipe did with mxfp8 / nvfp4). A recorded outcome stays with the configuration that earned it."""
    gpu = GPU
    first, second = gpu.trained[0], gpu.trained[1]
    results = {"device": "d", "date": "x", "runs": [{"config": second.config, "outcome": "trained"},
                                                  {"config": {"precision.mode": "fp64"}, "outcome": "trained"}]}
    from tools.support_matrix import gpu_status, render_markdown

    assert gpu_status(gpu, results) == {second.name: "trained"} and first.name != second.name
    text = render_markdown(gpu=gpu, gpu_results=results)
    assert f"{second.name} trained" in text and "`precision.mode = fp64`" in text  # an earlier row's result stays visible
