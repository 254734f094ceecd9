"""One record per FP8 backend (launcher/planning/backends.py): each is held to the schema, the rule table and the code
it names, and no code outside the records compares a backend's name."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

from launcher.planning import backends
from launcher.planning.backends import BACKENDS, BUILT_IN, MSAMP, TE, TORCHAO, Backend, backend_of, named
from launcher.planning.hardware import supports
from launcher.planning.msamp_levels import MSAMP_LEVELS
from launcher.planning.plan import resolve
from launcher.planning.read import SpecSource, choices, recipes, schema, schema_text

ROOT = Path(__file__).resolve().parents[1]


def test_the_records_are_the_schemas_backends_in_its_order():
    """schema.json names the built-in records, in their order; the schema the planner validates with takes its enum from
    the records (a registered backend joins it: tests/test_toy_backend.py)."""
    file = json.loads(schema_text())["properties"]["precision"]["properties"]["backend"]["enum"]
    assert list(BUILT_IN) == file == list(choices("precision.backend"))


@pytest.mark.parametrize("b", BACKENDS.values(), ids=list(BACKENDS))
def test_each_record_names_what_exists(b):
    precision = schema()["properties"]["precision"]["properties"]
    assert b.section in precision and b.recipe_field in precision[b.section]["properties"]
    own = recipes(b.name)
    assert b.default_recipe in own
    assert set(b.capability) <= set(own) and set(b.float8_tp_recipes) <= set(own)
    assert b.accelerate_recipes is None or set(b.accelerate_recipes) <= set(own)
    assert b.costed_as == "" or b.costed_as in recipes(TE.name)  # the prediction costs MS-AMP's kernels as TE's
    assert set(b.gemms) - {"*"} <= set(own) and set(b.overflow_hints) - {"*"} <= set(own)
    assert set(b.outlier_fix) <= set(own) and set(b.recipe_notes) <= set(own)
    assert b.starter_recipe("deepspeed") in own and b.starter_recipe("ddp") == b.default_recipe
    if b.native_as:  # its levels' native keys name that backend (launcher/planning/levels.py)
        assert b.native_as in BACKENDS and {k["precision.backend"] for k in MSAMP_LEVELS.values()} == {b.native_as}
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


RECORDS = frozenset(name for name, value in vars(backends).items() if isinstance(value, Backend))
"""The module-level names of the records (TORCHAO, TE, MSAMP): code that imports one is about to ask "is it this one?"."""
OWNERS = ("launcher/planning/backends.py", "launcher/planning/rules/")
"""The records and the rules, which are about particular backends by nature (`fp8(f, TE)`)."""


def identity_branches(rel: str, source: str) -> list[str]:
    """Where `source` (launcher/<rel>) singles a backend out by its record or a literal name: a record imported or
    reached as backends.X (`b is TE`, `{TORCHAO: ...}`), or BACKENDS / named() given a backend's name
    (`BACKENDS["msamp"]`, `named("te") is b`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hit = None
        if isinstance(node, ast.ImportFrom) and node.module == "launcher.planning.backends":
            hit = sorted(a.name for a in node.names if a.name in RECORDS)
        elif isinstance(node, ast.Attribute) and node.attr in RECORDS and ast.unparse(node.value).endswith("backends"):
            hit = ast.unparse(node)
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "BACKENDS" and isinstance(node.slice, ast.Constant):
            hit = ast.unparse(node)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "named" and node.args and isinstance(node.args[0], ast.Constant):
            hit = ast.unparse(node)
        if hit:
            found.append(f"{rel}:{node.lineno}: {hit}")
    return found


def test_no_code_outside_the_records_and_rules_singles_a_backend_out():
    found = []
    for path in sorted((ROOT / "launcher").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(OWNERS):
            found += identity_branches(rel, path.read_text())
    assert not found, "make it a field or method of the record (launcher/planning/backends.py), or move it into the " \
                      "backend's own module:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "from launcher.planning.backends import TE, named\nif named(x) is TE: pass",
    "from launcher.planning import backends\nok = b is backends.MSAMP",
    "from launcher.planning.backends import BACKENDS\nb = BACKENDS['torchao']",
    "from launcher.planning.backends import named\nte = named('te')",
])
def test_the_identity_check_finds_each_kind_of_branch(source):
    assert len(identity_branches("launcher/x.py", source)) == 1
