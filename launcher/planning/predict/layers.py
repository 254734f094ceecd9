"""torchao's rule for Linears too small to gain from FP8 (torch-free: planning and the entrypoint share it)."""

from __future__ import annotations


def too_small(recipe: str, in_features: int, out_features: int) -> bool:
    """torchao 0.18.0's size heuristic (torchao/float8/float8_linear_utils.py,
    `_auto_filter_for_tensorwise` / `_auto_filter_for_rowwise`, from H100 benchmarks in
    torchao/float8/README.md): True when FP8 is expected to be slower than bf16.

    torchao names the weight shape (N, K) = (out_features, in_features). It has no heuristic
    for rowwise_with_gw_hp (`_auto_filter_for_recipe` raises NotImplementedError); that recipe
    is rowwise scaling with a high-precision weight-gradient GEMM, so the rowwise thresholds apply.
    """
    n, k = out_features, in_features
    if recipe == "tensorwise":
        return k <= 4096 and n <= 1024
    return n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048)
