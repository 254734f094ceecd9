"""The warning lines of the monitor and its end-of-run summary of the worst layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.planning.backends import named

WARN_EVERY_SAMPLES = 10
"""A layer warns at most once per this many samples (logs stay readable)."""

WORST_SHOWN = 5
"""Layers the end-of-run summary names."""


def fix_for(layer: str, backend: str, recipe: str) -> str:
    """Keep the layer, or the recipe of the same backend that copes better with one layer's outliers (its record's
    outlier_fix)."""
    keep = f'keep this layer in high precision (precision.keep = ["{layer}"])'
    b = named(backend)
    other = b.outlier_fix.get(recipe) if b is not None else None
    return f"{keep}, or {other}" if other else f"{keep}, or another recipe"


@dataclass
class Warner:
    """Decides which records warn, at most once per layer per WARN_EVERY_SAMPLES samples, and
    keeps each (layer, operand)'s worst shares for the summary."""

    underflow_warn: float
    overflow_warn: float
    backend: str = ""
    recipe: str = ""
    _last: dict[str, int] = field(default_factory=dict)
    _worst: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    samples: int = 0

    def check(self, records: list[dict[str, Any]]) -> list[str]:
        """The warning lines of one sample's records (call once per sample)."""
        self.samples += 1
        lines, warned = [], set()
        for r in records:
            self._keep_worst(r)
            what = self._crossed(r)
            if not what or r["layer"] in warned:
                continue
            last = self._last.get(r["layer"])
            if last is not None and self.samples - last < WARN_EVERY_SAMPLES:
                continue
            self._last[r["layer"]] = self.samples
            warned.add(r["layer"])
            lines.append(f"warning: FP8 {what} in layer {r['layer']} ({r['tensor']}, {r['format']}) at step {r['step']}; "
                         f"fix: {fix_for(r['layer'], self.backend, self.recipe)} "
                         f"[at most one warning per layer every {WARN_EVERY_SAMPLES} samples]")
        return lines

    def _crossed(self, r: dict[str, Any]) -> str:
        if r["overflow"] > self.overflow_warn:
            return (f"overflow: {_pct(r['overflow'])} of values saturate at the format's max "
                    f"(monitor.overflow_warn = {self.overflow_warn:g}; amax {r['amax']:.3g})")
        if r["underflow"] > self.underflow_warn:
            return (f"underflow: {_pct(r['underflow'])} of nonzero values flush to zero "
                    f"(monitor.underflow_warn = {self.underflow_warn:g}; amax {r['amax']:.3g} sets scale {r['scale']:.3g})")
        return ""

    def _keep_worst(self, r: dict[str, Any]) -> None:
        key = (r["layer"], r["tensor"])
        w = self._worst.setdefault(key, {"layer": r["layer"], "tensor": r["tensor"], "underflow": 0.0, "overflow": 0.0,
                                         "underflow_step": None, "overflow_step": None})
        for share in ("underflow", "overflow"):
            if r[share] > w[share]:
                w[share], w[f"{share}_step"] = r[share], r["step"]

    def worst(self, n: int = WORST_SHOWN) -> list[dict[str, Any]]:
        """The (layer, operand)s with the largest underflow or overflow share, worst first (zeros left out)."""
        rows = [w for w in self._worst.values() if w["underflow"] > 0 or w["overflow"] > 0]
        rows.sort(key=lambda w: (w["overflow"] > self.overflow_warn, max(w["underflow"], w["overflow"])), reverse=True)
        return rows[:n]

    def summary_lines(self) -> list[str]:
        if not self.samples:
            return []
        worst = self.worst()
        if not worst:
            return [f"fp8 monitor: {self.samples} samples, no FP8 value flushed to zero or saturated"]
        lines = [f"fp8 monitor: {self.samples} samples; worst layers:"]
        for w in worst:
            lines.append(f"  {w['layer']} {w['tensor']}: underflow {_pct(w['underflow'])}"
                         + (f" (step {w['underflow_step']})" if w["underflow_step"] else "")
                         + f", overflow {_pct(w['overflow'])}" + (f" (step {w['overflow_step']})" if w["overflow_step"] else ""))
        return lines


def _pct(share: float) -> str:
    return f"{100 * share:.3g}%"
