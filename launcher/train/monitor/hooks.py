"""Which modules really run in FP8, how each of their operands is cast, and the hooks that
measure those casts on a sampled step.

A Target is one FP8 layer (its FQN as the precision report names it) with the Scaling of
each FP8 operand. `Collector.arm()` registers, on every target: a forward pre-hook (input
and weight, the tensors the layer is about to cast) and a forward hook that puts a gradient
hook on the output (grad_output, the tensor the backward casts). `disarm()` removes them:
between samples, and with the monitor off, no hook exists at all.

Operands are measured as the backend casts them: torchao's Float8Linear reads its own
config (cast_config_input / _weight / _grad_output, AXISWISE = rowwise, power-of-2 scales);
Transformer Engine modules take the recipe's format (HYBRID: e4m3 forward, e5m2 backward),
its margin, and with delayed scaling the scale TE really uses (module.fp8_meta, from its amax
history). A recomputation under activation checkpointing is not measured twice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from launcher.train.fqn import clean_fqn

from .stats import FIELDS, Scaling, cast_stats, torchao_scale

OPERANDS = ("input", "weight", "grad_output")

ScaleSource = Callable[[nn.Module, str], "torch.Tensor | None"]
"""(module, operand) -> the scale the backend will use, or None: compute it as dynamic scaling does."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    layer: str
    """The module's FQN in the model as built (what the precision report names)."""
    module: nn.Module
    operands: dict[str, Scaling]
    """operand name -> how it is cast; operands the backend leaves in high precision are absent."""
    scale_source: ScaleSource | None = None


# ----------------------------------------------------------------------------- targets per backend


TE_BLOCK = {"Float8BlockScaling": 128, "MXFP8BlockScaling": 32}
"""Elements per scaling block along the last dim (1 x N blocks) of TE's block recipes."""


def te_operands(recipe) -> dict[str, Scaling]:
    """The Scaling of each operand under a Transformer Engine recipe object."""
    fmt = getattr(getattr(recipe, "fp8_format", None), "name", "HYBRID")
    forward, backward = ("e5m2", "e5m2") if fmt == "E5M2" else ("e4m3", "e4m3") if fmt == "E4M3" else ("e4m3", "e5m2")
    name = type(recipe).__name__
    block = TE_BLOCK.get(name, 0)
    kw = {"rowwise": bool(block), "block": block, "power_of_2": name == "MXFP8BlockScaling",
          "margin": int(getattr(recipe, "margin", 0) or 0)}
    return {"input": Scaling(fmt=forward, **kw), "weight": Scaling(fmt=forward, **kw),
            "grad_output": Scaling(fmt=backward, **kw)}


_TE_META = {"input": ("scaling_fwd", 0), "weight": ("scaling_fwd", 1), "grad_output": ("scaling_bwd", 0)}
"""Where TE keeps a delayed-scaling module's scales: fp8_meta[key].scale[index]
(tex.FP8FwdTensors.GEMM1_INPUT / GEMM1_WEIGHT, tex.FP8BwdTensors.GRAD_OUTPUT1)."""


def te_delayed_scale(module: nn.Module, operand: str) -> torch.Tensor | None:
    """The scale TE's delayed scaling will use for `operand` (from the amax history of earlier
    steps), or None before TE has set one up."""
    meta = getattr(module, "fp8_meta", None)
    key, index = _TE_META[operand]
    state = meta.get(key) if isinstance(meta, dict) else None
    scale = getattr(state, "scale", None)
    if not isinstance(scale, torch.Tensor) or scale.numel() <= index:
        return None
    return scale.reshape(-1)[index].detach()


def te_targets(model: nn.Module, fp8_classes: tuple[type, ...], recipe) -> list[Target]:
    """Every TE FP8 module (te.Linear, te.LayerNormLinear, ...) under `recipe`."""
    ops = te_operands(recipe)
    source = te_delayed_scale if type(recipe).__name__ == "DelayedScaling" else None
    return [Target(layer=clean_fqn(fqn), module=m, operands=dict(ops), scale_source=source)
            for fqn, m in model.named_modules() if isinstance(m, fp8_classes)]


# ----------------------------------------------------------------------------- collection

def _recomputing() -> bool:
    """Inside a backward pass: an activation-checkpointing recomputation of the forward."""
    return torch._C._current_graph_task_id() != -1


def is_fp8_tensor(t) -> bool:
    """A tensor already cast by the backend (torchao's Float8TrainingTensor after a float8 all-gather)."""
    return hasattr(t, "_data") and hasattr(t, "_scale") and getattr(t, "_data").dtype.itemsize == 1


@dataclass
class Collector:
    """Accumulates one FIELDS row per (layer, operand) over the micro-batches of a sampled step."""

    targets: list[Target]
    _handles: list = field(default_factory=list)
    _rows: dict = field(default_factory=dict)

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def keys(self) -> list[tuple[str, str]]:
        """Every (layer, operand) a record can have, in a fixed order (the same on every rank)."""
        return [(t.layer, op) for t in self.targets for op in OPERANDS if op in t.operands]

    def arm(self) -> None:
        if self._handles:
            return
        for t in self.targets:
            if "input" in t.operands or "weight" in t.operands:
                self._handles.append(t.module.register_forward_pre_hook(functools.partial(self._before, t)))
            if "grad_output" in t.operands:
                self._handles.append(t.module.register_forward_hook(functools.partial(self._after, t)))

    def disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def take(self) -> dict[tuple[str, str], torch.Tensor]:
        """The rows gathered since the last take (and forget them)."""
        rows, self._rows = self._rows, {}
        return rows

    def add(self, layer: str, operand: str, row: torch.Tensor) -> None:
        key = (layer, operand)
        old = self._rows.get(key)
        if old is None:
            self._rows[key] = row
            return
        self._rows[key] = torch.stack([torch.maximum(old[0], row[0]), torch.minimum(old[1], row[1]),
                                       torch.maximum(old[2], row[2]), old[3] + row[3], old[4] + row[4], old[5] + row[5]])

    def measure(self, t: Target, operand: str, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0 or is_fp8_tensor(x):
            return
        if hasattr(x, "to_local"):  # a DTensor shard: its own values (amax is reduced with max across ranks)
            x = x.to_local()
            if is_fp8_tensor(x):  # cast before it got here (tensor parallel: PrepareFloat8ModuleInput, before the all-gather)
                return
        x = getattr(x, "_tensor", x)  # torchao's WeightWithDynamicFloat8CastTensor wraps the hp weight
        if type(x).__name__.endswith("TrainingWeightWrapperTensor"):  # torchao's MX training weight: the hp weight in _data
            x = x._data
        scale = t.scale_source(t.module, operand) if t.scale_source else None
        self.add(t.layer, operand, cast_stats(x, t.operands[operand], scale))

    # torch.compile: the hooks run eagerly (a graph break at each hooked layer on sampled steps)
    # instead of being traced and recompiled into every compiled block.
    @torch.compiler.disable
    def _before(self, t: Target, module: nn.Module, args: tuple) -> None:
        if _recomputing():
            return
        with torch.no_grad():
            if "input" in t.operands and args:
                self.measure(t, "input", args[0])
            if "weight" in t.operands:
                self.measure(t, "weight", getattr(module, "weight", None))

    @torch.compiler.disable
    def _after(self, t: Target, module: nn.Module, args: tuple, output) -> None:
        out = output[0] if isinstance(output, (tuple, list)) else output
        if _recomputing() or not isinstance(out, torch.Tensor) or not out.requires_grad:
            return

        def on_grad(grad: torch.Tensor) -> None:
            with torch.no_grad():
                self.measure(t, "grad_output", grad)

        out.register_hook(on_grad)

    def measure_sharded_fp8_weights(self, all_reduce_max: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Weights FSDP2 all-gathers already in FP8 (torchao float8 all-gather) reach the layer
        cast: measure each rank's high-precision shard instead, with the scale torchao computes
        from the global amax (one all-reduce for all of them). Call between steps, on every rank."""
        shards = []
        for t in self.targets:
            w = getattr(t.module, "weight", None)
            if "weight" in t.operands and w is not None and hasattr(w, "to_local") and hasattr(w.to_local(), "_tensor"):
                shards.append((t, w.to_local()._tensor.detach()))
        if not shards:
            return
        local = torch.stack([s.abs().max().float() if s.numel() else s.new_zeros((), dtype=torch.float32) for _, s in shards])
        amax = all_reduce_max(local)
        for (t, shard), a in zip(shards, amax):
            sc = t.operands["weight"]
            scale = torchao_scale(a, sc.fmt, power_of_2=sc.power_of_2)
            if shard.numel():
                self.add(t.layer, "weight", cast_stats(shard, sc, scale))


__all__ = ["FIELDS", "OPERANDS", "Collector", "Target", "te_targets"]
