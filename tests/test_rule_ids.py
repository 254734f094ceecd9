"""Every rule id named anywhere exists in the rule table (issue 29): code that raises or looks up a rule by id
(rule_error("DS-FP16-CPU", ...), RULES_BY_ID["..."]), messages and comments that name one ("rule TP-SEQ-LEN"),
the schema's descriptions, the shipped specs and the docs. A renamed or deleted rule fails here, not in a user's
error message."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from conftest import REPO
from launcher.planning.rules import RULES_BY_ID

RULE_ID = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]+(?:-[A-Z0-9]+)+(?![\w-])")
"""Upper-case words joined by '-', at least two (FP8-NOT-APPLIED, TE-TOKENS-DIV8): the shape of every rule id.
The lookarounds keep a piece of a longer token (a prefix before `-*`, an f-string's `TE-{x}`) from matching."""

RULE_PREFIX = re.compile(r"(?<![\w-])([A-Z][A-Z0-9]+(?:-[A-Z0-9]+)*)-\*")
"""A family of rules by prefix, as the docs write it: PRECISION-RULE-*, MOE-*, TE-FP8-PARAMS-*."""

NOT_RULE_IDS = {
    "AMX-FP16": "an x86 CPU feature (launcher/train/precision/cpu_scaled_mm.py)",
    "AMX-INT8": "an x86 CPU feature (launcher/train/precision/cpu_scaled_mm.py)",
    "AVX-512": "an x86 CPU feature (launcher/train/compile_ac.py)",
    "AVX-NE-CONVERT": "an x86 CPU feature (launcher/commands/doctor.py: fast bf16 matmuls)",
    "CRC-32": "the checksum a checkpoint's record keeps per file (launcher/targets/checkpoint_record.py)",
    "DNS-1123": "the Kubernetes name format (launch.kubernetes.namespace)",
    "GPT-3": "a model family an imported config names (launcher/commands/importer/hub.py)",
    "GPT-2": "the model family (Conv1D, its tokenizer)",
    "MS-AMP": "Microsoft's FP8 library",
    "SHA-256": "a hash (the checkpoint record's benchmark compares it with CRC-32)",
    "RESULTS-LEFT-OUT": "the file listing what the GPU session's tarball left out (benchmarks/pack_results.py)",
    "RULE-ID": "the placeholder of `fp8launch explain [RULE-ID]` in the README",
    "UTF-8": "the encoding",
}
"""Rule-id-shaped tokens that are not rule ids. Keep it short: a token added here is one the test no longer checks."""


TABLE = "launcher/planning/rules/"
"""The rule table's package: its modules define the rules, and name each other's in whys and messages."""


def _scanned():
    """The files that may name a rule: launcher/ (the rule table's modules too, for the rules they name across domains),
    the schema, README, the templates, the shipped specs and the docs."""
    files = list((REPO / "launcher").rglob("*.py"))
    files += [REPO / "launcher" / "planning" / "schema.json", REPO / "README.md"]
    files += [*(REPO / "templates").glob("*.j2"), *(REPO / "specs").glob("*.toml"), *(REPO / "docs").glob("*.md")]
    return sorted(p for p in files if p.is_file())


def _tokens():
    ids, prefixes = defaultdict(set), defaultdict(set)
    for path in _scanned():
        text, where = path.read_text(encoding="utf-8"), str(path.relative_to(REPO))
        for m in RULE_ID.finditer(text):
            ids[m.group()].add(f"{where}:{text.count(chr(10), 0, m.start()) + 1}")
        for m in RULE_PREFIX.finditer(text):
            prefixes[m.group(1)].add(f"{where}:{text.count(chr(10), 0, m.start()) + 1}")
    return ids, prefixes


IDS, PREFIXES = _tokens()


def test_the_scan_sees_the_files_and_the_ids():
    scanned = {str(p.relative_to(REPO)) for p in _scanned()}
    assert {"README.md", "launcher/cli.py", "launcher/planning/schema.json", "docs/precision.md", TABLE + "te.py"} <= scanned
    assert all(RULE_ID.fullmatch(rule) for rule in RULES_BY_ID), "a rule id the pattern does not match: widen RULE_ID"
    outside = {token for token, where in IDS.items() if any(not w.startswith(TABLE) for w in where)}
    assert len(outside & set(RULES_BY_ID)) >= 50
    assert "FP8-NOT-APPLIED" in {token for token, where in IDS.items() if any(w.startswith(TABLE + "selection.py") for w in where)}


def test_every_rule_id_named_outside_the_rule_table_exists():
    unknown = {token: sorted(where) for token, where in IDS.items() if token not in RULES_BY_ID and token not in NOT_RULE_IDS}
    print(f"not rule ids ({len(NOT_RULE_IDS)}): {', '.join(sorted(NOT_RULE_IDS))}")
    assert not unknown, ("rule ids that launcher/planning/rules/ does not define (rename the reference, or if the "
                         f"token is not a rule id add it to NOT_RULE_IDS): {unknown}")


def test_every_rule_family_named_by_prefix_has_a_rule():
    empty = {prefix: sorted(where) for prefix, where in PREFIXES.items()
             if not any(rule.startswith(prefix + "-") for rule in RULES_BY_ID)}
    assert not empty, f"`PREFIX-*` names no rule of launcher/planning/rules/: {empty}"


def test_the_allow_list_is_needed_and_holds_no_rule():
    assert not set(NOT_RULE_IDS) & set(RULES_BY_ID)
    assert set(NOT_RULE_IDS) <= set(IDS), f"no longer in the scanned files, remove: {sorted(set(NOT_RULE_IDS) - set(IDS))}"


def test_the_registry_refuses_an_id_defined_twice_or_left_out_of_its_order():
    """launcher/planning/rules/__init__.py builds RULES once, at import, with this function: a second rule under one id
    (in the same domain or another), or a rule ORDER does not place, stops the import naming the id."""
    import dataclasses
    from types import SimpleNamespace

    from launcher.planning.rules import DOMAINS, ORDER, RULES, registry, te

    def domain(name: str, rule_id: str) -> SimpleNamespace:
        return SimpleNamespace(__name__=name, RULES=(dataclasses.replace(RULES_BY_ID["FP8-HARDWARE"], id=rule_id),))

    with pytest.raises(ValueError, match="rule id TE-FP8-MHA is defined twice: in launcher.planning.rules.te and in x.copy"):
        registry([*DOMAINS, domain("x.copy", "TE-FP8-MHA")], ORDER)
    with pytest.raises(ValueError, match="rule id TE-DELAYED-COMPILE is defined twice"):
        registry([*DOMAINS, te], ORDER)
    with pytest.raises(ValueError, match=r"rules not in ORDER \(append them\): \['NEW-RULE'\]"):
        registry([*DOMAINS, domain("x.new", "NEW-RULE")], ORDER)
    with pytest.raises(ValueError, match="ORDER names TE-FP8-MHA twice"):
        registry(DOMAINS, (*ORDER, "TE-FP8-MHA"))
    assert registry(DOMAINS, ORDER)[0] == RULES and [r.id for r in RULES] == list(ORDER)
    with pytest.raises(TypeError):
        RULES_BY_ID["TE-FP8-MHA"] = RULES_BY_ID["FP8-HARDWARE"]  # built once: nothing patches it afterwards
