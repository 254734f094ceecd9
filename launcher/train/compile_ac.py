"""Activation checkpointing and torch.compile, applied per transformer block as torchtitan does,
after the precision backend converted the model and BEFORE the engine wraps it.

Order (torchtitan's): precision -> activation checkpointing -> compile -> FSDP2/DDP/DeepSpeed.
Each block is replaced in its parent by its wrapped version; `prepare_blocks` returns the
blocks as they end up, which are the units FSDP2 shards.

- activation_checkpointing.mode = "full": every block recomputes its activations in backward;
  "selective": every other block (0, 2, 4, ...), torchtitan's layer-based selective AC.
  With Transformer Engine the recompute goes through TE's own `checkpoint`
  (transformer_engine.pytorch.distributed.checkpoint): torch's checkpoint would recompute
  outside `te.autocast`, so the recomputed GEMMs would not be FP8 and delayed scaling would
  record every amax twice. TE's keeps the forward's FP8 state for the recompute. TE's checkpoint is
  dynamo-disabled (`@torch._disable_dynamo`, transformer_engine/pytorch/distributed.py): a compiled block
  around it would run eagerly, compiling nothing. So TE with both activation checkpointing and compile is
  refused up front (rule TE-AC-COMPILE, checked again here for a hand-edited plan.json).
- compile.enabled: each block goes through torch.compile(mode=compile.mode,
  fullgraph=compile.fullgraph); the embedding, final norm and head stay eager. A block holding
  grouped experts (MoE) is compiled as torchtitan compiles one: each part on its own (attention,
  norms, router, shared experts) and the experts' grouped GEMMs (`GroupedExperts.swiglu`) with a
  dynamic row count, while the token reordering and expert parallelism's all-to-all stay eager
  (data-dependent split sizes would recompile the block every step, and FSDP2's hooks on the
  experts would break the graph).
- On CPU, Inductor's C++ kernels are held to 256-bit vectors (AVX2) on every CPU (`cpu_vector_width`).
"""

from __future__ import annotations

import typing

import torch
from torch import nn

from launcher.train.models import transformer_blocks

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan


def prepare_blocks(model: nn.Module, plan: Plan, precision=None, device: torch.device | None = None) -> list[nn.Module]:
    """Apply the plan's activation checkpointing, then compile, to each transformer block of
    `model` in place; return the blocks (wrapped where they were) in order. `precision`: what
    apply_precision returned (a Transformer Engine one brings TE's checkpoint); `device`: the run's
    (None: CUDA where there is one)."""
    blocks = transformer_blocks(model)
    mode = plan.activation_checkpointing.mode
    if mode != "none" and plan.compile.enabled and getattr(precision, "te", None) is not None:
        from launcher.planning.rules import Facts, rule_error

        raise rule_error("TE-AC-COMPILE", Facts(plan=plan))
    if mode != "none":
        fn = checkpoint_fn(precision)
        blocks = [checkpointed(model, b, fn) if _checkpoints(i, mode) else b for i, b in enumerate(blocks)]
    if plan.compile.enabled:
        if (device.type == "cpu") if device is not None else not torch.cuda.is_available():
            cpu_vector_width()
        blocks = [compiled(model, b, mode=plan.compile.mode, fullgraph=plan.compile.fullgraph) for b in blocks]
    return blocks


CPU_SIMD_BITS = 256


def cpu_vector_width() -> None:
    """Hold this process's compiled CPU kernels to AVX2's 256-bit vectors, whatever the CPU offers.

    torch 2.13's Inductor, given AVX-512 (its default wherever the CPU has it), writes wrong FP8 tiles:
    the kernel that casts an activation to float8_e4m3fn and stores it transposed for the weight-gradient
    GEMM (torchao tensorwise, two FP8 Linears in a row) leaves most of its bytes wrong and about 6% NaN,
    so every such layer's weight gradient is NaN from step 1. The same graphs are right with 256-bit
    vectors, and with none (tests/train/test_compile_cpu.py). 256 bits is also what every x86 CPU this
    runs on has, so a compiled CPU run computes the same on each of them. `cpp.simdlen` is part of
    Inductor's cache key: graphs compiled at another width are not reused."""
    import torch._inductor.config as inductor

    inductor.cpp.simdlen = CPU_SIMD_BITS


def _checkpoints(index: int, mode: str) -> bool:
    return mode == "full" or (mode == "selective" and index % 2 == 0)


def checkpoint_fn(precision) -> typing.Callable | None:
    """Transformer Engine's checkpoint for a TE precision (its `te` namespace), else None (torch's)."""
    te = getattr(precision, "te", None)
    if te is None:
        return None
    fn = getattr(getattr(te, "distributed", None), "checkpoint", None) or getattr(te, "checkpoint", None)
    if fn is None:
        from launcher.errors import EnvironmentProblem

        raise EnvironmentProblem("this Transformer Engine has no checkpoint function, so checkpointed blocks would recompute outside "
                                 'te.autocast; fix: set activation_checkpointing.mode = "none", or install a Transformer Engine with '
                                 "transformer_engine.pytorch.checkpoint")
    return fn


def checkpointed(root: nn.Module, block: nn.Module, fn: typing.Callable | None = None) -> nn.Module:
    """`block` wrapped so that its activations are recomputed in backward (non-reentrant), by torch's
    checkpoint or by `fn` (Transformer Engine's). The wrapper keeps torch's module names either way."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if fn is None:
        return _replace(root, block, checkpoint_wrapper(block, preserve_rng_state=False))
    # TE's checkpoint stashes the FP8 meta of the forward and recomputes under the same te.autocast state.
    return _replace(root, block, checkpoint_wrapper(block, checkpoint_fn=fn, use_reentrant=False, distribute_saved_activations=False))


def compiled(root: nn.Module, block: nn.Module, *, mode: str, fullgraph: bool) -> nn.Module:
    """`block` compiled by torch.compile (an OptimizedModule that keeps the block's parameters); a block
    holding grouped experts stays in place with its parts compiled (`compile_parts`)."""
    if not _holds_experts(block):
        return _replace(root, block, torch.compile(block, mode=mode, fullgraph=fullgraph))
    compile_parts(block, mode=mode, fullgraph=fullgraph)
    return block


def _holds_experts(module: nn.Module) -> bool:
    from launcher.train.models.moe import GroupedExperts

    return any(isinstance(m, GroupedExperts) for m in module.modules())


def compile_parts(module: nn.Module, *, mode: str, fullgraph: bool) -> None:
    """Compile, in place, the largest parts of `module` that hold no grouped experts, and each GroupedExperts'
    grouped GEMMs (its `swiglu`): torchtitan's apply_compile for MoE blocks."""
    from launcher.train.models.moe import GroupedExperts

    for name, child in list(module.named_children()):
        if isinstance(child, GroupedExperts):
            child.register_module("swiglu", torch.compile(child.swiglu, mode=mode, fullgraph=fullgraph))
        elif _holds_experts(child):
            compile_parts(child, mode=mode, fullgraph=fullgraph)
        else:
            module.register_module(name, torch.compile(child, mode=mode, fullgraph=fullgraph))


def _replace(root: nn.Module, old: nn.Module, new: nn.Module) -> nn.Module:
    """Put `new` where `old` is registered under `root`; return `new`."""
    for parent in root.modules():
        for name, child in parent.named_children():
            if child is old:
                parent.register_module(name, new)
                return new
    raise ValueError(f"{type(old).__name__} is not a submodule of {type(root).__name__}")
