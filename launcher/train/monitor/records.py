"""Rank reduction of one sample and its records: max for amax, count-weighted shares.

Every rank holds one FIELDS row per (layer, operand) it measured; `reduce_rows` packs them in
the fixed key order into two tensors (maxima, sums) and all-reduces each once, so a sample
costs two collectives whatever the number of layers. A row no rank saw is left out.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from launcher.train.metrics.trackers import FP8_EVENT

from .stats import Scaling

Reduce = Callable[[torch.Tensor], torch.Tensor]


def reduce_rows(keys: list[tuple[str, str]], rows: dict[tuple[str, str], torch.Tensor], *,
                all_reduce_max: Reduce, all_reduce_sum: Reduce) -> dict[tuple[str, str], list[float]]:
    """(layer, operand) -> [amax, scale_min, scale_max, nonzero, underflow, overflow] over every rank."""
    if not keys:
        return {}
    device = next(iter(rows.values())).device if rows else torch.device("cpu")
    inf = float("inf")
    maxima = torch.tensor([[0.0, -inf, -inf]] * len(keys), dtype=torch.float64, device=device)
    sums = torch.zeros(len(keys), 4, dtype=torch.float64, device=device)
    for i, key in enumerate(keys):
        row = rows.get(key)
        if row is None:
            continue
        maxima[i] = torch.stack([row[0], row[2], -row[1]])
        sums[i, :3] = row[3:]
        sums[i, 3] = 1.0
    # gloo and NCCL both reduce float64; one host transfer for the whole sample
    maxima, sums = all_reduce_max(maxima).cpu().tolist(), all_reduce_sum(sums).cpu().tolist()
    out = {}
    for key, (amax, scale_max, neg_scale_min), (nonzero, under, over, seen) in zip(keys, maxima, sums):
        if seen:
            out[key] = [amax, -neg_scale_min, scale_max, nonzero, under, over]
    return out


def record(step: int, layer: str, operand: str, scaling: Scaling, row: list[float]) -> dict[str, Any]:
    """One fp8_stats.jsonl record: the contract's fields first (step, layer, tensor, amax, scale,
    underflow, overflow), then the details."""
    amax, scale_min, scale_max, nonzero, under, over = row
    total = nonzero  # shares of the nonzero values (an exact zero is no underflow)
    return {
        "step": step,
        "layer": layer,
        "tensor": operand,
        "amax": amax,
        "scale": scale_min,  # the smallest scale in use: the one the largest amax (row, micro-batch, rank) set
        "underflow": under / total if total else 0.0,
        "overflow": over / total if total else 0.0,
        "scale_min": scale_min,
        "scale_max": scale_max,
        "scale_inv_max": 1.0 / scale_min if scale_min > 0 else None,
        "format": scaling.fmt,
        "granularity": scaling.granularity,
        "nonzero": int(nonzero),
    }


def sample_summary(records: list[dict[str, Any]], *, underflow_warn: float, overflow_warn: float) -> dict[str, Any]:
    """One sample's records in a few numbers for the experiment trackers: the largest and the mean underflow and
    overflow share over every (layer, operand) cast, and how many layers cross monitor.underflow_warn / overflow_warn."""
    n = len(records) or 1
    over = {r["layer"] for r in records if r["overflow"] > overflow_warn or r["underflow"] > underflow_warn}
    return {
        "event": FP8_EVENT,
        "step": records[0]["step"] if records else 0,
        "fp8/underflow_max": max((r["underflow"] for r in records), default=0.0),
        "fp8/underflow_mean": sum(r["underflow"] for r in records) / n,
        "fp8/overflow_max": max((r["overflow"] for r in records), default=0.0),
        "fp8/overflow_mean": sum(r["overflow"] for r in records) / n,
        "fp8/layers_over_warn": len(over),
    }
