"""MS-AMP's opt levels (O1, O2, O3) as fp8launch's own spec keys, on plain spec data (no Plan): what `backend = "msamp"` plans
as where MS-AMP's stack is not installed, `fp8launch init --preset msamp-oN` writes, and the rules' fixes name.
launcher/planning/levels.py accounts the levels' bytes on a Plan; plan.py resolves a spec through native_level here."""

from __future__ import annotations

import typing

from launcher.planning import stack
from launcher.planning.backends import BACKENDS

MSAMP_LEVELS: dict[str, dict[str, typing.Any]] = {
    "O1": {"precision.mode": "fp8", "precision.backend": "torchao", "precision.grad_reduce": "fp8",
           "precision.master_weights": "bf16"},
    "O2": {"precision.mode": "fp8", "precision.backend": "torchao", "precision.grad_reduce": "fp8",
           "precision.master_weights": "bf16", "precision.optimizer_states": "fp8"},
    "O3": {"precision.mode": "fp8", "precision.backend": "torchao", "precision.grad_reduce": "fp8",
           "precision.master_weights": "bf16", "precision.optimizer_states": "fp8", "distributed.strategy": "fsdp2",
           "precision.torchao.fsdp_float8_all_gather": True},
}
"""MS-AMP opt level -> the spec keys that give it with torchao and fp8launch's engines. O1: FP8 gradient
communication and weights kept in 16 bits without a master copy; O2: + 8-bit Adam moments (both in fp8, where
MS-AMP keeps the second in fp16); O3: + ZeRO-3-style sharding (FSDP2) with the weights all-gathered in FP8 (MS-AMP
stores them in FP8 with an FP16 master; here the bf16 master is the only copy)."""

PRESETS = {f"msamp-{level.lower()}": level for level in MSAMP_LEVELS}
"""`fp8launch init --preset NAME` -> the MS-AMP level it writes the native equivalent of."""


def _toml(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else f'"{value}"'


def native_keys(level: str) -> str:
    """The keys of MS-AMP level `level` as a fix names them: 'precision.backend = "torchao", ...'."""
    return ", ".join(f"{k} = {_toml(v)}" for k, v in MSAMP_LEVELS[level].items() if k != "precision.mode")


def native_fix(level: str) -> str:
    """The fix a spec with backend = "msamp" gets where MS-AMP cannot run: its level natively."""
    return f"its native equivalent: set {native_keys(level)} (`fp8launch init --preset msamp-{level.lower()}` writes such a spec)"


def native_level(data: dict, msamp_runs: typing.Callable[[str], bool] | None = None) -> str | None:
    """The MS-AMP opt level a spec (as resolved: every key, defaults filled) names with `backend = "msamp"` where the
    plan gives it natively instead: MS-AMP's own stack is not installed here (launcher/planning/stack.py) and its level's
    keys express the spec. None otherwise: a spec that names another backend, one MS-AMP itself runs here, and what the
    native levels cannot express (its DeepSpeed integration, use_te's TE modules, level keys of its own, a recipe in
    [[precision.rules]] or [[precision.schedule]], an optimizer or high precision the bf16 master weights cannot take,
    O3 without FSDP2, tensor parallel): those stay with MS-AMP and its rules, which refuse what cannot run.
    `msamp_runs(strategy)`: whether MS-AMP's stack is installed (default: here, stack.msamp_runs; the doctor passes the
    machine it assesses)."""
    p, d = data["precision"], data["distributed"]
    b = BACKENDS.get(p["backend"])
    if p["mode"] != "fp8" or b is None or not b.native_as:
        return None
    level = p["msamp"]["opt_level"]
    expressible = (
        d["strategy"] in ("ddp", "fsdp2") and (level != "O3" or d["strategy"] == "fsdp2")
        and not p["msamp"]["use_te"] and d["tensor_parallel"] == 1
        and (p["optimizer_states"], p["grad_reduce"], p["master_weights"]) == ("fp32", "auto", "fp32")
        and not any(r.get("recipe") for r in p["rules"]) and not any(ph.get("recipe") for ph in p["schedule"])
        and data["train"]["optimizer"] in ("adam", "adamw") and p["high_precision"] == "bf16"
    )
    return level if expressible and not (msamp_runs or stack.msamp_runs)(d["strategy"]) else None


def as_native(data: dict, level: str) -> None:
    """Set MS-AMP level `level`'s native keys in a resolved spec's data (in place)."""
    for key, value in MSAMP_LEVELS[level].items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value


