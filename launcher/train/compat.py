"""torch APIs newer than the floor this project tests (torch 2.11, the GPU image's), each behind a feature check that
falls back to the floor's equivalent. Code in train/ calls these instead of the newer name.

    all_gather_single(out, inp, group=g)            # torch >= 2.13; all_gather_into_tensor before
    reduce_scatter_single(out, inp, op, group=g)    # torch >= 2.13; reduce_scatter_tensor before
    after_shape_inference(stage, fn)                # fn() once a PipelineStage has inferred its shapes

benchmarks/torch_api.py checks that every other torch name the code uses exists in the floor's API
(benchmarks/results/torch_api_manifest.json); tests/train/test_compat.py removes the newer names and shows the same
numbers.
"""

from __future__ import annotations

import typing

import torch.distributed as dist


def all_gather_single(output, input, group=None):
    """`input` of every rank of `group`, concatenated into `output` (the same call under both names; the older one warns
    of its deprecation from torch 2.13 on)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, input, group=group)


def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None):
    """`input` reduced over `group` with `op`, this rank's chunk into `output`."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, input, op=op, group=group)


def after_shape_inference(stage, fn: typing.Callable[[], None]) -> None:
    """Call `fn()` each time `stage` (a torch.distributed.pipelining PipelineStage) has inferred its inputs' and
    outputs' shapes, which runs its module on the first micro-batch once more. torch 2.13 infers them at the first step
    with a forward and backward and then drops what they left (`_post_metadata_inference_cleanup`); torch 2.11 runs a
    forward of zeros under no_grad (`_shape_inference`)."""
    name = "_post_metadata_inference_cleanup" if hasattr(stage, "_post_metadata_inference_cleanup") else "_shape_inference"
    inner = getattr(stage, name)

    def then(*args, **kwargs):
        result = inner(*args, **kwargs)
        fn()
        return result

    setattr(stage, name, then)
