"""`fp8launch export RUN_DIR`: the weights of a run's checkpoint as a Hugging Face folder (or one
torch.save file). This module checks the arguments without torch; launcher/train/export does the work.

RUN_DIR is the run's train.output_dir, as `fp8launch run` lays it out: `plan/plan.json` (the plan the
run trained with: the model's exact shapes come from it) and `checkpoints/step-N/`.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Callable

from launcher.commands.run import PLAN_SUBDIR
from launcher.errors import InputError
from launcher.train.export import FORMATS, KEY, QUANTS

if typing.TYPE_CHECKING:
    from launcher.train.export.pipeline import Exported

PLAN_FILE = os.path.join(PLAN_SUBDIR, "plan.json")
"""Where `fp8launch run` writes the plan, under train.output_dir."""
EXPORT_SUBDIR = "export"
DEFAULT_MAX_SHARD = "5GB"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """"5GB", "500MB", "2GiB", "4096" -> bytes (decimal units as huggingface_hub reads them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", text.upper())
    if not m or m.group(2) not in _UNITS or float(m.group(1)) * _UNITS[m.group(2)] < 1:
        raise InputError("--max-shard-size", f"{text!r} is not a size", "write a size like 5GB, 500MB or 2GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def default_out(run_dir: str, step: int, fmt: str, quant: str | None = None) -> str:
    return os.path.join(run_dir, EXPORT_SUBDIR, f"step-{step}-{fmt}" + (f"-{quant}" if quant else ""))


def run_export(run_dir: str, *, step: int | None, fmt: str, dtype: str, out: str | None, max_shard_size: str,
               plan_path: str | None, echo: Callable[[str], None], quant: str | None = None,
               serve_tp: int | None = None) -> Exported:
    """Check the arguments, find the checkpoint, export it. Raises LauncherErrors with the fix."""
    from launcher.planning.plan import load_plan

    if fmt not in FORMATS:  # pragma: no cover - Click's Choice refuses it first
        raise InputError("--format", f"{fmt!r} is not a format", f"use one of {', '.join(FORMATS)}")
    if quant is not None and quant not in QUANTS:  # pragma: no cover - Click's Choice refuses it first
        raise InputError("--quant", f"{quant!r} is not an FP8 format", f"use one of {', '.join(QUANTS)}")
    if quant and fmt != "hf":
        raise InputError("--quant", f"an FP8 export is a Hugging Face folder, and --format is {fmt}",
                         "leave out --format torch (or --quant)")
    if serve_tp is not None and not quant:
        raise InputError("--serve-tp", "checks the shards of an FP8 export's blocks, and --quant is not given",
                         "add --quant fp8-block (or leave out --serve-tp: a bf16 export has no blocks)")
    max_bytes = parse_size(max_shard_size)
    if not os.path.isdir(run_dir):
        raise InputError(KEY, f"{run_dir} is not a folder",
                         "give the train.output_dir of a run (the folder holding plan/ and checkpoints/)")
    plan_file = plan_path or os.path.join(run_dir, PLAN_FILE)
    if not os.path.isfile(plan_file):
        where = "--plan" if plan_path else KEY
        raise InputError(where, f"{plan_file} does not exist", "give the train.output_dir of a run started with `fp8launch run` "
                         "(it holds plan/plan.json), or pass --plan with the plan.json the run was started with")
    try:
        plan = load_plan(plan_file)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError("--plan" if plan_path else KEY, f"{plan_file} is not a plan fp8launch can read ({e})",
                         "regenerate it with `fp8launch plan SPEC` from the spec the run was started with") from e

    from launcher.train import quiet

    quiet.install()  # before torch, torchao (transformers imports it) and deepspeed are imported
    from launcher.train.export.pipeline import export, find_checkpoint
    from launcher.train.export.write import check_target

    if out:  # a bad --out is refused before the checkpoints are read (and their notes printed)
        check_target(out)
    step, checkpoint = find_checkpoint(run_dir, step, echo)
    target = out or default_out(run_dir, step, fmt, quant)
    if not out:
        check_target(target)
    return export(plan, os.path.dirname(os.path.abspath(plan_file)), checkpoint, step, fmt=fmt, dtype=dtype, out=target,
                  max_shard_bytes=max_bytes, echo=echo, quant=quant, serve_tp=serve_tp)
