"""How to install what fp8launch needs: the one place that words it (error hints, doctor, and the README,
CI example and container recipe say the same).

fp8launch is published on no package index. It installs from a clone (`pip install -e ".[EXTRA]"`) or
from the wheel `make dist` builds (`pip install "dist/fp8launch-VERSION-py3-none-any.whl[EXTRA]"`). A
missing optional package on its own installs from PyPI, with the version range of its fp8launch extra
(pyproject.toml, read from the installed package's metadata).
"""

from __future__ import annotations

import re
from functools import cache

EXTRA = {"torchao": "torchao", "transformer_engine": "te", "deepspeed": "deepspeed", "transformers": "hf",
         "tokenizers": "hf", "accelerate": "accelerate", "matplotlib": "bench", "tensorboard": "tensorboard",
         "wandb": "wandb", "mlflow": "mlflow", "datasets": "data", "safetensors": "hf"}
"""Import name -> the fp8launch extra that installs it."""

DISTRIBUTION = {"transformer_engine": "transformer-engine", "tokenizers": "transformers", "mlflow": "mlflow-skinny",
                "safetensors": "transformers"}
"""Import name -> the distribution that provides it, where they differ (tokenizers and safetensors come with transformers)."""

FROM_CLONE = 'pip install -e ".[{extras}]"'
"""Installing fp8launch from a clone, in the clone's folder."""

FROM_WHEEL = 'pip install "dist/fp8launch-{version}-py3-none-any.whl[{extras}]"'
"""Installing the wheel `make dist` builds."""

TORCH = "pip install torch (a CUDA build for GPUs; CPU machines: pip install torch==2.13.0)"
MSAMP = "build MS-AMP from source: https://github.com/Azure/MS-AMP (it pins DeepSpeed 0.13.1 and Transformer Engine 1.1)"


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


@cache
def _requirements() -> dict[str, str]:
    """extra -> its requirements (without the extra marker), from fp8launch's metadata; {} when not installed."""
    from importlib import metadata

    try:
        lines = metadata.requires("fp8launch") or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for line in lines:
        req, _, marker = line.partition(";")
        m = re.search(r'extra\s*==\s*"([^"]+)"', marker)
        if m:
            out.setdefault(m.group(1), []).append(req.strip())
    return {extra: reqs for extra, reqs in out.items()}


def requirement(module: str) -> str:
    """The pip requirement for an import name, e.g. "torchao>=0.12" (the bare name without metadata)."""
    dist = DISTRIBUTION.get(module, module).lower().replace("_", "-")
    for req in _requirements().get(EXTRA.get(module, ""), []):
        if _name(req) == dist:
            return req
    return dist


def hint(module: str) -> str:
    """How to install `module`, as every error message and doctor say it."""
    if module == "torch":
        return TORCH
    if module == "msamp":
        return MSAMP
    extra = EXTRA.get(module)
    if extra is None:
        return f"pip install {module}"
    cuda = " (needs CUDA)" if module == "transformer_engine" else ""
    return f"pip install '{requirement(module)}'{cuda}, or in your fp8launch clone: {FROM_CLONE.format(extras=extra)}"


class _Hints(dict):
    def __missing__(self, module: str) -> str:
        return hint(module)


INSTALL: dict[str, str] = _Hints()
"""INSTALL[import name] -> how to install it (computed on first use, from the package's metadata)."""
