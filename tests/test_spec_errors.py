"""Bad specs: every problem at once, located as FILE:LINE, with did-you-mean; exit 2, no traceback, nothing written."""

from __future__ import annotations

import json

import pytest

from conftest import run_module


def test_reports_every_problem_with_lines_and_suggestions(cli, spec, tmp_path):
    path = spec(
        """
        version = 1
        name = "bad"

        [precision]
        mode = "fp8"
        backend = "torchoa"

        [precision.te]
        recipe = "delayd"

        [distributed]
        strategy = "fsdp2"
        procs_per_nod = 2
        nodes = 0

        [train]
        steps = "ten"
        """
    )
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 2
    lines = [line for line in r.stderr.splitlines() if ": error" in line]
    assert lines == [
        f'{path}:6: error: $.precision.backend: "torchoa" is not one of "torchao", "te", "msamp" (did you mean "torchao"?)',
        f'{path}:9: error: $.precision.te.recipe: "delayd" is not one of "delayed", "current", "block", "mxfp8", "nvfp4" '
        '(did you mean "delayed"?)',
        f"{path}:13: error: $.distributed.procs_per_nod: unknown key 'procs_per_nod' (did you mean 'procs_per_node'?)",
        f"{path}:14: error: $.distributed.nodes: must be >= 1, got 0",
        f'{path}:17: error: $.train.steps: expected an integer, got string "ten"',
    ]
    assert "5 problems found." in r.stderr
    assert not (tmp_path / "out").exists()


def test_json_spec_errors_have_lines(cli, spec):
    path = spec(
        json.dumps({"version": 1, "name": "j", "compile": {"enabled": "yes"}, "train": {"optimiser": "adamw"}}, indent=2),
        name="spec.json",
    )
    r = cli("plan", path, "--out", "out")
    assert r.exit_code == 2
    assert f'{path}:5: error: $.compile.enabled: expected true or false, got string "yes"' in r.stderr
    assert f"{path}:8: error: $.train.optimiser: unknown key 'optimiser' (did you mean 'optimizer'?)" in r.stderr


def test_key_in_the_wrong_section_names_where_it_belongs(cli, spec):
    path = spec(
        """
        version = 1
        name = "x"
        [precision]
        recipe = "rowwise"
        """
    )
    r = cli("plan", path)
    assert r.exit_code == 2
    assert "unknown key 'recipe' (did you mean 'precision.torchao.recipe'? it belongs in [precision.torchao])" in r.stderr


def test_missing_required_keys(cli, spec):
    r = cli("plan", spec("[train]\nsteps = 3\n"))
    assert r.exit_code == 2
    assert "missing required key 'version'; add `version = 1`" in r.stderr
    assert "missing required key 'name'; add `name = \"my-job\"`" in r.stderr


def test_name_cannot_escape_the_output_folder(cli, spec, tmp_path):
    r = cli("plan", spec('version = 1\nname = "../../etc"\n'), "--out", "out")
    assert r.exit_code == 2
    assert "$.name" in r.stderr and "has the wrong form" in r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "etc").exists()


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda d: str(d / "nope.toml"), "no such file"),
        (lambda d: str(d), "is a directory"),
        (lambda d: _write(d / "empty.toml", b"  \n"), "is empty"),
        (lambda d: _write(d / "bin.toml", b"\x00\x01\x02version"), "is a binary file"),
        (lambda d: _write(d / "latin.toml", b'name = "caf\xe9"\n'), "is not UTF-8"),
        (lambda d: _write(d / "huge.toml", b"# x\n" * 300_000), "a spec is at most 1048576 bytes"),
        (lambda d: _write(d / "broken.toml", b'version = 1\nname = "a\n'), "invalid TOML"),
        (lambda d: _write(d / "broken.json", b'{"version": 1,\n "name": }'), "invalid JSON"),
        (lambda d: _write(d / "list.json", b"[1, 2]"), "the top level must be a table"),
    ],
    ids=["missing", "directory", "empty", "binary", "not-utf8", "huge", "bad-toml", "bad-json", "json-list"],
)
def test_unreadable_files_exit_2_without_traceback(tmp_path, make, expected):
    target = make(tmp_path)
    r = run_module("plan", target, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert expected in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "out").exists()


def test_toml_parse_error_has_line(cli, tmp_path):
    path = _write(tmp_path / "b.toml", b'version = 1\nname = "ok"\n[train\n')
    r = cli("plan", path)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{path}:3: error: invalid TOML")


def test_one_bad_spec_among_several_writes_nothing(cli, spec, tmp_path):
    good = spec('version = 1\nname = "good"\n', name="good.toml")
    bad = spec('version = 1\nname = "bad"\n[train]\nsteps = 0\n', name="bad.toml")
    r = cli("plan", good, bad, "--out", "out")
    assert r.exit_code == 2
    assert f"{bad}:4: error: $.train.steps: must be >= 1, got 0" in r.stderr
    assert not (tmp_path / "out").exists()


def test_two_specs_with_one_name_are_refused(cli, spec):
    a = spec('version = 1\nname = "same"\n', name="a.toml")
    b = spec('version = 1\nname = "same"\n', name="b.toml")
    r = cli("plan", a, b)
    assert r.exit_code == 2
    assert "name 'same' is also the name of" in r.stderr


def test_set_overrides_are_validated_and_named(cli, spec):
    path = spec('version = 1\nname = "s"\n')
    r = cli("plan", path, "--set", "train.stepz=3", "--set", "precision.mode=fp4")
    assert r.exit_code == 2
    assert "$.train.stepz: unknown key 'stepz' (did you mean 'steps'?) (from --set train.stepz=3)" in r.stderr
    assert "(from --set precision.mode=fp4)" in r.stderr
    r = cli("plan", path, "--set", "nonsense")
    assert r.exit_code == 2 and "is not KEY=VALUE" in r.stderr
    r = cli("plan", path, "--set", "name.x=1")
    assert r.exit_code == 2 and "name is not a table" in r.stderr


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_unknown_builtin_model_is_caught_when_planning(cli, spec):
    path = spec('version = 1\nname = "m"\n[train]\nmodel = "builtin:llama3-8bb?layers=2"\n')
    r = cli("plan", path)
    assert r.exit_code == 2
    assert r.stderr.startswith(f"{path}:4: error: $.train.model: unknown builtin model 'llama3-8bb' (did you mean 'llama3-8b'?); "
                               "fix: use one of: builtin:llama-debug,")
