"""Weights a run stored in FP8: read from their high-precision master copy, or refused naming why."""

from __future__ import annotations

import typing
from collections.abc import Callable

from launcher.errors import InputError
from launcher.planning.backends import backend_of

from . import KEY

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


def fp8_stored(plan: Plan, spec_dir: str, step: int, weights, checkpoint: str, echo: Callable[[str], None]) -> None:
    """Weights the run stored in FP8 are read from their high-precision master copy, or refused naming why.

    Transformer Engine's precision.te.fp8_params: `model/` holds the Float8Tensor weights, TE's FusedAdam the fp32
    master copy of each (`optim/`, state.NAME.master_param; DeepSpeed's partitions are fp32 masters already). MS-AMP's
    ScalingTensor weights (FP8 codes in the checkpoint) have no master copy fp8launch reads."""
    from . import read

    p = plan.precision
    backend = backend_of(p)
    if backend is not None and backend.setting(p, "fp8_params") and weights.kind == "dcp":
        from .layers import trained_precision

        _, trained = trained_precision(plan, step, spec_dir)
        stored = [f"{name}.weight" for name, (recipe, _) in trained.items() if recipe is not None]
        redirected = set(weights.use_masters())
        missing = [n for n in stored if n in weights.entries and n not in redirected]
        if missing:
            raise InputError(KEY, f"{checkpoint} stores {missing[0]} (and {len(missing) - 1} more) in FP8 "
                             "(precision.te.fp8_params), and its optimizer state holds no fp32 master copy of it "
                             f"(optim/: state.{missing[0]}.{read.MASTER}): its FP8 rounding is all there is",
                             "export a checkpoint written with TE's FusedAdam master_weights (fp8launch's own), or a run with "
                             "precision.te.fp8_params = false")
        echo(f"export: {len(redirected)} weights stored in FP8 (precision.te.fp8_params) read from TE FusedAdam's fp32 master "
             "copy in optim/")
    not_float = sorted(n for n, e in weights.entries.items() if not (e.dtype in read.FLOATS or not e.dtype.is_floating_point))
    if not_float:
        why = ("MS-AMP's FP8 ScalingTensor weights, whose master copy is not in a form fp8launch reads"
               if backend is not None and backend.scaling_tensors
               else "not high-precision weights, and no master copy of them is saved beside them")
        raise InputError("train.model", f"{checkpoint} stores {len(not_float)} weight(s) in a low-precision format ({not_float[0]}: "
                         f"{weights.entries[not_float[0]].dtype}): {why}",
                         "export a run that keeps high-precision weights (precision.te.fp8_params = false, MS-AMP O1)")
