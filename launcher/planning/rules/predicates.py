"""What the rules of more than one domain ask of a plan: FP8 with which backend, the strategy, the tensor-parallel
degree, fullgraph compile, the tokens of one micro-batch on one rank, a builtin model's experts."""

from __future__ import annotations

from launcher.planning.backends import Backend, backend_of
from launcher.planning.models import builtin_config, is_moe
from launcher.planning.rules.core import Facts


def fp8(f: Facts, backend: Backend | None = None) -> bool:
    """An FP8 plan (with this backend)."""
    b = backend_of(f.plan.precision)
    return b is not None and (backend is None or b is backend)


def strategy(f: Facts) -> str:
    return f.plan.distributed.strategy


def is_deepspeed(f: Facts) -> bool:
    return strategy(f) == "deepspeed"


def tp(f: Facts) -> int:
    return f.plan.distributed.tensor_parallel


def fullgraph(f: Facts) -> bool:
    return f.plan.compile.enabled and f.plan.compile.fullgraph


def tokens_per_rank(f: Facts) -> int:
    """The tokens of one micro-batch on one rank: the rows of every Linear's GEMM input (TE asserts they divide
    by 8), and the dimension the weight-gradient GEMM scales along (blocks of 32 / 16 for MX / NVFP4). Sequence
    parallel (tensor_parallel) and context parallel split each sequence over their ranks; a pipeline runs the step's
    sequences in its own micro-batches."""
    t, layout = f.plan.train, f.plan.distributed.layout()
    sequences = layout.sequences_per_micro_batch(t.micro_batch_size, t.micro_batch_size * t.grad_accum_steps,
                                                 f.plan.pipeline_microbatches)
    return layout.tokens_per_rank(sequences, t.seq_len)


def builtin_experts(f: Facts) -> int | None:
    """The routed experts per MoE layer of a builtin model (0: a dense one); None for hf: / py: models (known at run
    time) and for a bad builtin name (planning reports it)."""
    cfg = builtin_config(f.plan.train.model)
    if cfg is None:
        return None
    return cfg.num_experts if is_moe(cfg) else 0

