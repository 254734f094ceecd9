"""Each rule's `when` (the words `fp8launch explain` prints) is held to its condition, so the two cannot drift apart.

Every spec key the words name (a dotted key of the schema: compile.enabled, precision.te.fp8_params; or a short form
with its value: "strategy ddp", "backend te") must be one the condition depends on: starting from the rule's own firing
example in tests/test_rules.py, some other value the schema allows for that key (or leaving it out) changes whether the
rule fires, with the rest of the example as it is or with one other key changed too (a key the `when` names, or one the
example's fixed twin sets differently). A `when` that names a key its condition ignores fails here; so does a dotted
word that starts like a spec key but is not one.
"""

from __future__ import annotations

import copy
import re
from functools import cache

import pytest

from launcher.planning.read import schema
from launcher.planning.rules import RULES, RULES_BY_ID, Facts, Rule
from tests.support import plan_from
from tests.test_rules import PLAN_CASES, PREDICTION_CASES, RUN_CASES

pytestmark = pytest.mark.usefixtures("msamp_stack")
"""The MS-AMP rules are about plans for the MS-AMP package: planned where its own stack is installed (elsewhere a
backend = "msamp" spec is planned as its native levels: tests/train/test_msamp_native.py)."""

KEY = re.compile(r"(?<![\w.])[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+(?![\w.])")
"""A dotted word: compile.enabled, precision.torchao.fsdp_float8_all_gather (also deepspeed.json, e.g: not spec keys)."""

SHORTHANDS = {
    re.compile(r"\bstrategy (!= )?(ddp|fsdp2|deepspeed)\b"): "distributed.strategy",
    re.compile(r"\bbackend (te|msamp|torchao)\b"): "precision.backend",
    re.compile(r"\bzero_stage (!= )?[0-3]\b"): "distributed.deepspeed.zero_stage",
    re.compile(r"\bopt_level O[1-3]\b"): "precision.msamp.opt_level",
    re.compile(r"\btorchao recipe\b"): "precision.torchao.recipe",
    re.compile(r"\bte recipe\b"): "precision.te.recipe",
}
"""The short forms `when`s write a key in, each with its value: "strategy ddp", "backend te", "zero_stage 3"."""

ABSENT = object()
"""The key left out of the spec (its default, and not `present`)."""


def _nodes(node: dict, prefix: str = "") -> dict[str, dict]:
    """Every schema key by dotted path (sections and leaves)."""
    out = {}
    for name, child in node.get("properties", {}).items():
        out[prefix + name] = child
        out.update(_nodes(child, prefix + name + "."))
    return out


NODES = _nodes(schema())
SECTIONS = {k for k, n in NODES.items() if "properties" in n}
TOP = tuple(f"{k}." for k in schema()["properties"])


def dotted_words(rule: Rule) -> list[str]:
    """The dotted words of the rule's `when` that start like a spec key (precision., compile., ...)."""
    return [w for w in KEY.findall(rule.when) if w.startswith(TOP)]


def named_keys(rule: Rule) -> list[str]:
    """The schema leaves the rule's `when` names, as dotted keys or in a short form."""
    words = [w for w in dotted_words(rule) if w in NODES and w not in SECTIONS]
    words += [key for pattern, key in SHORTHANDS.items() if pattern.search(rule.when)]
    return list(dict.fromkeys(words))


def _get(data: dict, key: str):
    node = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def _set(data: dict, key: str, value) -> dict:
    out = copy.deepcopy(data)
    *parents, leaf = key.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    if value is ABSENT:
        node.pop(leaf, None)
    else:
        node[leaf] = copy.deepcopy(value)
    return out


def _examples() -> dict[str, tuple[dict, dict | None, dict]]:
    """rule id -> (spec that fires it, its fixed twin or None, run-time facts)."""
    out = {rid: (bad, fixed, {}) for rid, (bad, fixed) in {**PLAN_CASES, **PREDICTION_CASES}.items()}
    out.update({rid: (data, None, bad) for rid, (data, bad, _) in RUN_CASES.items()})
    return out


EXAMPLES = _examples()


def _leaves(data: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in data.items():
        if prefix + k in SECTIONS and isinstance(v, dict):
            out.update(_leaves(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


@cache
def _seen() -> dict[str, list]:
    """Every value the examples give each key."""
    seen: dict[str, list] = {}
    for bad, fixed, _ in EXAMPLES.values():
        for data in (bad, fixed or {}):
            for k, v in _leaves(data).items():
                seen.setdefault(k, []).append(v)
    return seen


GENERIC = {"boolean": [True, False], "integer": [0, 1, 2, 3, 4, 8, 16, 64, 100, 1000], "number": [0.0, 0.5, 1.0],
           "string": ["", "x"], "array": [[]], "object": [{}], "any": [True, 1, "x", []]}
"""A key of no type (a removed one the schema still accepts, to refuse it with a rule) takes any of "any"."""


def candidates(key: str) -> list:
    """Values to try for a key: left out, the schema's enum or its type's usual values, its default, and every value an
    example gives it (values the schema refuses are skipped when tried)."""
    node = NODES[key]
    types = node.get("type", [] if "enum" in node else "any")
    values = [ABSENT, *node.get("enum", []), *[v for t in ([types] if isinstance(types, str) else types) for v in GENERIC[t]]]
    values += [node["default"]] if "default" in node else []
    values += _seen().get(key, [])
    out: list = []
    for v in values:
        if not any(v is u or (v is not ABSENT and u is not ABSENT and v == u and type(v) is type(u)) for u in out):
            out.append(v)
    return out


def fires(rule: Rule, data: dict, facts: dict) -> bool | None:
    """Whether the rule's condition holds for this spec (None: the schema refuses the spec)."""
    from launcher.errors import LauncherError

    try:
        plan = plan_from(data)
    except LauncherError:
        return None
    prediction = None
    if rule.id in PREDICTION_CASES:
        from launcher.planning.predict import predict

        prediction = predict(plan)
    return bool(rule.condition(Facts(plan=plan, prediction=prediction, **facts)))


def depends_on(rule: Rule, key: str) -> bool:
    """Whether some value of `key` changes whether the rule fires, around its example (see the module's docstring)."""
    bad, fixed, facts = EXAMPLES[rule.id]
    context = named_keys(rule) + ([k for k in {**_leaves(bad), **_leaves(fixed)} if _get(bad, k) != _get(fixed, k)] if fixed else [])
    for other in [None, *dict.fromkeys(k for k in context if k != key)]:
        for value in [None] if other is None else candidates(other):
            base = bad if other is None else _set(bad, other, value)
            outcomes = {fires(rule, data, facts) for data in [base, *(_set(base, key, v) for v in candidates(key))]} - {None}
            if len(outcomes) > 1:
                return True
    return False


CHECKED = [r.id for r in RULES if named_keys(r)]


def test_every_dotted_spec_word_in_a_when_is_a_schema_key():
    unknown = {r.id: [w for w in dotted_words(r) if w not in NODES] for r in RULES}
    assert not {rid: words for rid, words in unknown.items() if words}


def test_the_check_covers_most_rules_and_every_example_fires():
    assert len(CHECKED) >= 80, f"{len(CHECKED)} rules name a key: {CHECKED}"  # 83 of the 97 when this was written
    unfired = [rid for rid in CHECKED if not fires(RULES_BY_ID[rid], EXAMPLES[rid][0], EXAMPLES[rid][2])]
    assert not unfired, f"the example of these rules does not fire them: {unfired}"


@pytest.mark.parametrize("rule_id", CHECKED)
def test_every_key_a_rules_when_names_changes_its_condition(rule_id):
    rule = RULES_BY_ID[rule_id]
    ignored = [k for k in named_keys(rule) if not depends_on(rule, k)]
    assert not ignored, (f"{rule_id}'s when names {ignored}, but no value of it changes whether the rule fires around its example: "
                         "drop it from `when`, or make the condition read it")
