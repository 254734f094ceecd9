"""One place adds the "error:" prefix: LauncherError.__str__. Raisers pass the message only."""

from __future__ import annotations

import ast
import re

from conftest import REPO, run_module
from launcher.errors import BackendMissing, EnvironmentProblem, LauncherError, Problem, SpecError, UsageError, with_fix
from launcher.train.checkpoint.preempt import Preempted


def test_the_class_adds_the_prefix_once():
    assert str(UsageError("--x is bad")) == "error: --x is bad"
    assert str(EnvironmentProblem("no GPU", rule="FP8-HARDWARE")) == "error[FP8-HARDWARE]: no GPU"
    assert str(LauncherError("boom", exit_code=4)) == "error: boom" and LauncherError("boom", exit_code=4).exit_code == 4
    assert str(SpecError([Problem("s.toml", "bad", path="$.x", line=3)])) == "s.toml:3: error: $.x: bad"
    assert str(Preempted("preempted: SIGTERM after step 3")) == "preempted: SIGTERM after step 3"


def test_no_raiser_spells_the_prefix_itself():
    raising = re.compile(r"""(?:Error|Problem|Interrupted|Diverged|Failed|Preempted)\(\s*f?["']error""")
    offenders = [f"{path.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}"
                 for path in sorted((REPO / "launcher").rglob("*.py")) if path.name != "errors.py"
                 for text in [path.read_text()] for m in raising.finditer(text)]
    assert offenders == []


def test_cli_errors_read_error_once(tmp_path):
    (tmp_path / "s.toml").write_text('version = 1\nname = "s"\n[launch]\ndevice = "cpu"\n')
    r = run_module("run", "s.toml", "--rdzv-endpoint", "nohost", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == "error: --rdzv-endpoint 'nohost' is not HOST:PORT (e.g. node0:29500)"
    r = run_module("explain", "NOPE", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: no rule 'NOPE'") and r.stderr.count("error") == 1


def _string_literals(tree):
    """Each string literal of a module but its docstrings, with f-string fields as {}."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_every_message_says_its_fix_after_a_semicolon():
    """"what is wrong; fix: what to change", never ". fix:" or " fix:" (issue 23). `explain` prints `fix:` as a label."""
    offenders = [f"{path.relative_to(REPO)}:{line}: {text!r}"
                 for path in sorted((REPO / "launcher").rglob("*.py"))
                 for line, text in _string_literals(ast.parse(path.read_text()))
                 for m in re.finditer(r"fix: ", text)
                 if text[max(0, m.start() - 2):m.start()] != "; " and not text.startswith("  fix:  ")]
    assert offenders == []


def test_with_fix_joins_once_whatever_the_message_ends_with():
    for message in ("a is bad", "a is bad.", "a is bad;", "a is bad. "):
        assert with_fix(message, "set b") == "a is bad; fix: set b"
    assert str(BackendMissing("torchao", "pip install x")) == (
        "error[BACKEND-MISSING]: the torchao package is not importable here; fix: install it: pip install x")


def test_every_rule_reads_with_one_fix():
    from launcher.planning.rules import RULES, Finding

    for rule in RULES:
        text = Finding(rule, rule.why).text
        assert text.count("fix:") == 1 and "; fix: " in text and ". fix" not in text, rule.id
