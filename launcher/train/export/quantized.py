"""`fp8launch export --quant`: what one quantized export writes beyond the bf16 one: the format and every Linear's
fate (`plan_quantization`, checked for vLLM's tensor parallel), then the measured gap, README.md and the marker's
"quant" record (`Quantization.finish`)."""

from __future__ import annotations

import os
import typing
from collections.abc import Callable
from dataclasses import dataclass

from launcher.errors import InputError

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


@dataclass
class Quantization:
    """--quant: the format, every Linear quantized or kept (and why), and what the export writes for it."""

    plan: Plan
    phase: Plan
    step: int
    target: object
    fmt: object
    layers: list
    tps: list[int]

    @property
    def weights(self) -> dict:
        return {f"{layer.name}.weight": self.fmt for layer in self.layers if layer.kept is None}

    @property
    def config(self) -> dict:
        return self.fmt.config([layer.name for layer in self.layers if layer.kept is not None])

    def finish(self, folder: str, weights, dtype: str, files: list[str], echo: Callable[[str], None]) -> dict:
        """Measure the logit gap on what `folder` holds, write README.md there; the marker's "quant" record."""
        from .card import measure_gap, readme
        from .write import write_text

        gap = measure_gap(self.target, weights, self.layers, self.fmt, folder)
        if gap is not None:
            echo(f"export: logits against the bf16 export ({gap.tokens} tokens): max |difference| {gap.max_abs:.4g}, "
                 f"mean {gap.mean_abs:.4g}, top-1 agreement {100 * gap.top1:.1f}%")
        linear = {f"{layer.name}.weight" for layer in self.layers}
        others = [h.removesuffix(".weight") for h in self.target.names.values() if h not in linear and h.endswith(".weight")]
        write_text(os.path.join(folder, "README.md"), readme(
            plan=self.plan, phase=self.phase, step=self.step, architecture=self.target.architecture, fmt=self.fmt,
            layers=self.layers, gap=gap, tps=self.tps, dtype=dtype, other_weights=others))
        files.append("README.md")
        return {"format": self.fmt.name, "quantized": [layer.name for layer in self.layers if layer.kept is None],
                "kept": {layer.name: layer.kept for layer in self.layers if layer.kept is not None},
                "recipes": {layer.name: layer.recipe for layer in self.layers if layer.kept is None},
                "serving_tensor_parallel": self.tps, "logit_gap": gap.as_dict() if gap else None}


def plan_quantization(plan: Plan, spec_dir: str, step: int, target, quant: str, serve_tp: int | None,
                  echo: Callable[[str], None]) -> Quantization:
    from .layers import export_layers, serving_tps, tp_problem
    from .quant import FORMATS

    fmt = FORMATS[quant]
    layers = export_layers(plan, step, spec_dir, target, fmt)
    if serve_tp is not None:
        problem = tp_problem(layers, fmt, serve_tp, target.config)
        if problem:
            fits = serving_tps(layers, fmt, target.config)
            raise InputError("--serve-tp", f"vLLM cannot load this {quant} export at tensor parallel {serve_tp}: {problem}",
                             (f"serve it at --serve-tp {' or '.join(map(str, fits))}, or " if fits else "")
                             + ("export with --quant fp8-channel (one scale per output row: no block)"
                                if quant != "fp8-channel" else "serve at a tensor parallel size that divides the layers"))
    kept = [layer for layer in layers if layer.kept is not None]
    quantized = len(layers) - len(kept)
    echo(f"export: {quantized} Linear layers in {quant}, {len(kept)} kept in high precision"
         + (": " + "; ".join(f"{layer.name} ({layer.kept})" for layer in kept[:3]) + ("; ..." if len(kept) > 3 else "")
            if kept else ""))
    from launcher.planning.schedule import plan_at

    return Quantization(plan=plan, phase=plan_at(plan, step).plan, step=step, target=target, fmt=fmt, layers=layers,
                        tps=serving_tps(layers, fmt, target.config))
