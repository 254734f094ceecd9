"""plan.json: the Plan as the file `fp8launch plan` writes (every key resolved, derived values,
provenance; sorted, no machine paths). launcher.planning.plan.load_plan reads it back."""

from __future__ import annotations

import dataclasses

from launcher import __version__
from launcher.planning.plan import Plan
from launcher.planning.precision_table import precision_table


def plan_json(plan: Plan) -> dict:
    """plan.json's content."""
    data = _asdict(plan)
    data.pop("present")
    if not data["msamp_native"]:  # only a backend = "msamp" spec planned as its native levels says so
        data.pop("msamp_native")
    data["precision"]["te"] = {k: v for k, v in data["precision"]["te"].items() if v is not None}
    data["derived"] = {
        "world_size": plan.world_size,
        "global_batch_size": plan.distributed.global_batch_size,
        "tokens_per_step": plan.tokens_per_step,
        "device": plan.launch.device,
        "compute_dtype": plan.precision.compute_dtype,
        "precision_table": precision_table(plan),
    }
    data["fp8launch_version"] = __version__
    return data


def _asdict(obj) -> dict:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            v = _asdict(v)
        elif isinstance(v, (tuple, frozenset)):
            v = sorted(v) if isinstance(v, frozenset) else [_asdict(x) if dataclasses.is_dataclass(x) else x for x in v]
        elif isinstance(v, dict):
            v = dict(sorted(v.items()))
        out[f.name] = v
    return out
