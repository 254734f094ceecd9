"""One record per FP8 backend (launcher/planning/backends.py): each is held to the schema, the rule table and the code
it names, and no code outside the records compares a backend's name."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from launcher.planning.backends import BACKENDS, MSAMP, TE, TORCHAO, backend_of, named
from launcher.planning.hardware import supports
from launcher.planning.plan import resolve
from launcher.planning.read import SpecSource, choices, recipes, schema
from launcher.planning.rules import RULES_BY_ID

ROOT = Path(__file__).resolve().parents[1]


def test_the_records_are_the_schemas_backends_in_its_order():
    assert list(BACKENDS) == list(choices("precision.backend"))


@pytest.mark.parametrize("b", BACKENDS.values(), ids=list(BACKENDS))
def test_each_record_names_what_exists(b):
    precision = schema()["properties"]["precision"]["properties"]
    assert b.section in precision and b.recipe_field in precision[b.section]["properties"]
    own = recipes(b.name)
    assert b.default_recipe in own
    assert set(b.capability) <= set(own) and set(b.float8_tp_recipes) <= set(own)
    assert b.accelerate_recipes is None or set(b.accelerate_recipes) <= set(own)
    assert b.costed_as == "" or b.costed_as in recipes(TE.name)  # the prediction costs MS-AMP's kernels as TE's
    assert b.hardware_rule in RULES_BY_ID
    assert any(r.startswith(b.rule_prefix) for r in RULES_BY_ID), b.rule_prefix
    module, function = b.apply.split(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and function in {n.name for n in ast.parse(Path(spec.origin).read_text()).body
                                             if isinstance(n, ast.FunctionDef)}
    assert importlib.util.find_spec(b.package.split(".")[0]) is not None or b.cuda_only  # torchao is installed here


def test_the_capabilities_each_record_holds_are_the_ones_hardware_answers_with():
    """TE block needs Hopper, MXFP8 Blackwell but not sm120; torchao's block-scaled recipes sm100; MS-AMP FP8 itself."""
    assert supports((9, 0), "fp8", TE.name, "block") and not supports((8, 9), "fp8", TE.name, "block")
    assert supports((10, 0), "fp8", TE.name, "mxfp8") and not supports((12, 0), "fp8", TE.name, "mxfp8")
    assert supports((12, 0), "fp8", TORCHAO.name, "mxfp8") and not supports((9, 0), "fp8", TORCHAO.name, "nvfp4")
    assert supports((8, 9), "fp8", MSAMP.name, "O2") and not supports((8, 0), "fp8", MSAMP.name, "O2")


def _precision(precision: dict):
    return resolve(SpecSource(path="<test>", data={"version": 1, "name": "t", "precision": precision}, sha256="")).precision


def test_a_record_reads_its_own_table_and_answers_for_any_other():
    p = _precision({"mode": "fp8", "backend": "te", "te": {"recipe": "delayed", "fp8_params": True}})
    b = backend_of(p)
    assert b is TE and b.recipe(p) == "delayed" and b.setting(p, "fp8_params") is True
    assert b.setting(p, "fsdp_float8_all_gather") is False and not b.float8_all_gather(p, "fsdp2")  # torchao's key
    q = TE.with_recipe(p, "current")
    assert q.te.recipe == "current" and q.te.fp8_params and p.te.recipe == "delayed"
    assert backend_of(_precision({"mode": "bf16"})) is None and named("") is None and named("msamp") is MSAMP


COMPARED = re.compile(r'''(==|!=) ?["'](torchao|te|msamp)["']|["'](torchao|te|msamp)["'] ?(==|!=)|in \(\s*["'](torchao|te|msamp)["']''')
"""A backend's name compared as a string (`p.backend == "te"`, `backend in ("te", "msamp")`)."""
NOT_A_BACKEND = {("launcher/planning/install.py", "msamp"), ("launcher/train/quiet.py", "torchao")}
"""Where the same word is a Python package's name (what to install, whose warnings to quiet), not precision.backend."""


def test_no_code_outside_the_records_compares_a_backend_name():
    found = []
    for path in sorted((ROOT / "launcher").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "launcher/planning/backends.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in COMPARED.finditer(line):
                word = m.group(2) or m.group(3) or m.group(5)
                if (rel, word) not in NOT_A_BACKEND:
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "ask the backend's record (launcher/planning/backends.py) instead:\n" + "\n".join(found)
