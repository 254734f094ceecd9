"""Which installed packages can run together, read from their metadata and their module specs without
importing any of them (a broken package must be reported, not crash the report).

MS-AMP 0.4.0 (its last release, 2024-02) cannot import in a current stack, and an ImportError from
it is not "MS-AMP is not installed":
- `import msamp` imports `deepspeed.ops.adam.FusedAdam` and, through msamp.te, `transformer_engine`
  and `transformer_engine_extensions`, the extension module Transformer Engine renamed
  `transformer_engine_torch` in 1.8;
- `msamp.deepspeed` (its DeepSpeed integration, used for every DeepSpeed run and O3) imports `AMP` and
  `amp` from `deepspeed.runtime.engine`, gone after DeepSpeed 0.13, and calls DeepSpeed's ZeRO
  optimizer without `optimizer_params` (positional since 0.17.5). MS-AMP pins deepspeed==0.13.1 and
  Transformer Engine 1.1 (its pyproject.toml).
"""

from __future__ import annotations

import re
from importlib import metadata, util
from typing import Callable

DISTRIBUTIONS = {
    "msamp": ("MS-AMP", "msamp"),
    "transformer_engine": ("transformer-engine", "transformer_engine", "transformer-engine-torch"),
    "deepspeed": ("deepspeed",),
    "torch": ("torch",),
}
"""Import name -> the distribution names it is published under (MS-AMP's is not its import name)."""

MSAMP_STRATEGIES = ("ddp", "deepspeed")
"""The strategies MS-AMP runs with: msamp.initialize under DDP, and its DeepSpeed integration (no FSDP2)."""

MSAMP_DEEPSPEED_MAX = (0, 13)
"""The newest DeepSpeed minor release MS-AMP's DeepSpeed integration imports from."""


def dist_version(module: str) -> str | None:
    """The installed version of the distribution that provides `module`, from its metadata; None if none."""
    for name in DISTRIBUTIONS.get(module, (module, module.replace("_", "-"))):
        try:
            return metadata.version(name)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None


def importable(module: str) -> bool:
    """Whether `import module` can find it (nothing is imported)."""
    try:
        return util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "0.19.8+cpu" -> (0, 19, 8)."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def msamp_problem(strategy: str, *, version: Callable[[str], str | None] = dist_version,
                  found: Callable[[str], bool] = importable) -> str | None:
    """Why the installed MS-AMP cannot run here for `strategy` (ddp | deepspeed | ...), with the
    versions that stop it; None when MS-AMP is not installed (BACKEND-MISSING says so) or when
    nothing visible stops it. `version` and `found` stand for the environment in tests."""
    if not found("msamp"):
        return None
    reasons = []
    te = version("transformer_engine")
    if not found("transformer_engine_extensions"):
        has = f"Transformer Engine {te}" if te else "no Transformer Engine"
        reasons.append(f"it imports transformer_engine_extensions (Transformer Engine <= 1.7; renamed transformer_engine_torch in 1.8), "
                       f"and this environment has {has}")
    ds = version("deepspeed")
    if ds is None:
        reasons.append("it imports deepspeed (FusedAdam), and this environment has no DeepSpeed")
    elif strategy == "deepspeed" and release(ds)[:2] > MSAMP_DEEPSPEED_MAX:
        reasons.append(f"its DeepSpeed integration imports AMP from deepspeed.runtime.engine (DeepSpeed <= 0.13; it pins 0.13.1), "
                       f"and this environment has DeepSpeed {ds}")
    if not reasons:
        return None
    return f"MS-AMP {version('msamp') or '(unknown version)'} is installed but cannot run here: " + "; ".join(reasons) + "."


def msamp_runs(strategy: str) -> bool:
    """Whether MS-AMP's own stack is installed here and runs `strategy` (DDP or its DeepSpeed integration; never FSDP2,
    rule MSAMP-FSDP2), so that a `backend = "msamp"` plan uses the MS-AMP package; otherwise the plan gives its opt
    level natively where it can (launcher/planning/levels.py)."""
    return strategy in MSAMP_STRATEGIES and importable("msamp") and msamp_problem(strategy) is None


def msamp_absent(strategy: str) -> str:
    """Why MS-AMP does not run here for `strategy`, in a few words (the plan's line about its native levels)."""
    if not importable("msamp"):
        return "MS-AMP 0.4 is not installed here (it needs torch 2.1-2.2)"
    return "the MS-AMP installed here cannot run next to this stack (`fp8launch doctor` says why)"
