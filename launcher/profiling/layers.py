"""Which layer a GEMM in a trace belongs to, and its FLOPs, from the shapes the profiler recorded (torch-free).

A Linear (in_features K, out_features N) over M tokens runs three GEMMs, and each has K and N among its operands'
dimensions, M the third: forward (M, K) x (K, N), input gradient (M, N) x (N, K), weight gradient (N, M) x (M, K).
Grouped experts (E, K, N) likewise over their routed rows. So a GEMM op's "Input Dims" name its layer up to layers
of the same {K, N} (the forward of a K -> N layer and the input gradient of an N -> K one are the same GEMM), which
are told apart by precision (an FP8 GEMM belongs to an FP8 layer): a kept `layers.0.attention.wq` and the FP8
`layers.*.attention.wq` of the other blocks come out as two labels; w1, w3 (dim -> hidden) and w2 (hidden -> dim) as one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    """The module's name as the model defines it (`layers.3.feed_forward.w1`, `output`)."""
    in_features: int
    out_features: int
    fp8: bool
    """Whether it runs its GEMMs in FP8 as built."""

    def to_json(self) -> list:
        return [self.name, self.in_features, self.out_features, self.fp8]

    @staticmethod
    def from_json(row: list) -> Layer:
        return Layer(str(row[0]), int(row[1]), int(row[2]), bool(row[3]))


def matrix_dims(args: dict) -> list[list[int]]:
    """The dimensions of a GEMM op's two matrix operands (1-D inputs, such as addmm's bias, and scales skipped)."""
    dims = [d for d in args.get("Input Dims") or [] if isinstance(d, list) and len(d) >= 2]
    return dims[:2]


def weight_pairs(args: dict) -> list[set[int]]:
    """The {in, out} a GEMM's weight can have: with A (..., a, k) and B holding k and b (in either order), the forward
    and the input gradient contract over a weight dimension ({k, b}), the weight gradient over the tokens ({a, b})."""
    dims = matrix_dims(args)
    if len(dims) < 2:
        return []
    a, b = dims
    k = a[-1]
    other = b[-1] if b[-2] == k else b[-2]
    return [{k, other}, {a[-2], other}]


def gemm_flops(args: dict) -> float:
    """2 x M x K x N of a GEMM op from its operands' dimensions (batched and grouped GEMMs: every row once)."""
    dims = matrix_dims(args)
    if len(dims) < 2:
        return 0.0
    a, b = dims
    k = a[-1]
    n = b[-1] if b[-2] == k else b[-2]
    return 2.0 * math.prod(a) * n


def shape_of(k: int, n: int) -> tuple[int, int]:
    """A layer's shape as a GEMM sees it: its two dimensions, smaller first."""
    return (min(k, n), max(k, n))


def _collapse(name: str) -> str:
    return re.sub(r"(^|\.)\d+(\.|$)", r"\1*\2", name)


class LayerTable:
    """The model's layers, for labelling GEMMs by shape and precision."""

    def __init__(self, layers: list[Layer]):
        self.layers = layers
        self._labels: dict[tuple[int, int, bool], str] = {}
        groups: dict[tuple[int, int, bool], list[str]] = {}
        for layer in layers:
            groups.setdefault((*shape_of(layer.in_features, layer.out_features), layer.fp8), []).append(layer.name)
        for key, names in groups.items():
            copies: dict[str, list[str]] = {}
            for name in names:  # a block index becomes * where the layer is there in several blocks
                copies.setdefault(_collapse(name), []).append(name)
            shown = [pattern if len(same) > 1 else same[0] for pattern, same in copies.items()]
            self._labels[key] = " / ".join(shown[:3]) + (f" (+{len(shown) - 3})" if len(shown) > 3 else "")

    def match(self, args: dict, fp8: bool) -> tuple[str, tuple[int, int]] | None:
        """(the label of the layers a GEMM op with these args belongs to, their shape (smaller, larger dimension));
        None when no layer has its shape. Layers of the GEMM's own precision first."""
        pairs = weight_pairs(args)
        found = [(is_fp8 != fp8, label, (k, n)) for (k, n, is_fp8), label in self._labels.items() if {k, n} in pairs]
        return min(found)[1:] if found else None

    def label(self, args: dict, fp8: bool) -> str | None:
        found = self.match(args, fp8)
        return found[0] if found else None

    def fp8_flop_share(self) -> float:
        """The FLOP-weighted share of the layers in FP8 (in x out per token), from the table alone."""
        total = sum(x.in_features * x.out_features for x in self.layers)
        return sum(x.in_features * x.out_features for x in self.layers if x.fp8) / total if total else 0.0
