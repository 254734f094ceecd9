"""The API-surface check (benchmarks/torch_api.py): every torch name launcher/ spells out exists in the floor torch's
recorded API (benchmarks/results/torch_api_manifest.json, recorded on torch 2.11), or sits behind a feature check; and
the floor in pyproject.toml is the torch the manifest was recorded on and the lowest that docs/compatibility.md
records as tested. Torch-free: the scan reads the AST."""

from __future__ import annotations

import json
import re
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import torch_api  # noqa: E402

MANIFEST = json.loads(torch_api.MANIFEST.read_text())


def test_every_torch_name_the_code_uses_exists_in_the_floors_api_or_is_feature_checked():
    uses = torch_api.scan()
    assert len({u.name for u in uses}) > 150  # the scan sees the code (211 names on 2026-12-08)
    problems = torch_api.check(uses, MANIFEST)
    assert problems == [], ("a torch name the floor's manifest does not hold; fix: record it on the floor "
                            "(make test-compat TORCH=2.11.0 RECORD=1: docs/compatibility.md), or put it behind a feature check:\n"
                            + "\n".join(problems))
    # what the floor lacks is only ever asked for behind a check
    unchecked, _ = torch_api.names(uses)
    assert not unchecked & set(MANIFEST["missing_checked"])
    assert {"torch.distributed.all_gather_single", "torch.distributed.reduce_scatter_single"} <= set(MANIFEST["missing_checked"])


def test_the_scan_reads_aliases_from_imports_and_feature_checks():
    src = '''
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard as shard
from torch import nn

def f(x):
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if hasattr(torch.ops.aten, "_scaled_mm_v2"):
        pass
    try:
        from torch.distributed.tensor._ops import newer_thing
    except ImportError:
        newer_thing = None
    shard(nn.Linear(2, 2)).weight.full_tensor()
    return torch.randn(3).to(torch.float8_e4m3fn)
'''
    got = {(u.name, u.checked) for u in torch_api.scan_source(src, "x.py")}
    assert got == {("torch", False), ("torch.distributed", False), ("torch.distributed.fsdp.fully_shard", False),
                   ("torch.nn", False), ("torch.distributed.all_reduce", False), ("torch.distributed.ReduceOp.SUM", False),
                   ("torch.distributed.all_gather_single", True), ("torch.distributed.all_gather_into_tensor", False),
                   ("torch.ops.aten", False), ("torch.ops.aten._scaled_mm_v2", True), ("torch.distributed.tensor._ops.newer_thing", True),
                   ("torch.nn.Linear", False), ("torch.randn", False), ("torch.float8_e4m3fn", False)}
    manifest = {"torch": "2.11.0", "present": ["torch", "torch.distributed", "torch.randn"]}
    problems = torch_api.check(torch_api.scan_source("import torch\ntorch.randn(2)\ntorch.newer_op(1)\n", "y.py"), manifest)
    assert problems == ["y.py:3: torch.newer_op is not in torch 2.11.0's recorded API"]


def test_the_floor_is_the_torch_the_manifest_was_recorded_on_and_the_lowest_tested():
    pyproject = (REPO / "pyproject.toml").read_text()
    floors = set(re.findall(r'"torch>=([0-9.]+)"', pyproject))
    assert floors == {".".join(MANIFEST["torch"].split(".")[:2])}, floors
    table = (REPO / "docs" / "compatibility.md").read_text()
    tested = re.findall(r"^\| torch ([0-9.]+)[^|]*\| tested ", table, re.M)
    assert tested and min(tested, key=lambda v: tuple(map(int, v.split(".")))) == MANIFEST["torch"], tested
