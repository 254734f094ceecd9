"""Context parallelism's attention on CPU: torch's ring attention, given the CPU attention kernel.

torch 2.13's context parallel (torch.distributed.tensor.experimental.context_parallel) shards q, k and v along the
sequence over a "cp" mesh and sends SDPA, as a DTensor op, to its ring attention (_context_parallel/_attention.py:
_templated_ring_attention and its backward: each rank attends its query shard to every rank's key/value shard in turn,
the partial outputs merged by their logsumexp; causal masks load-balanced head and tail). It binds the ring to the CUDA
kernels only (flash, memory-efficient, cuDNN): on CPU, SDPA reaches aten._scaled_dot_product_flash_attention_for_cpu,
which has no sharding strategy, and fails. `cpu_ring_attention()` binds that kernel and its backward the way torch binds
the CUDA flash kernel: the same sharding (q, k, v, output and logsumexp sharded on the sequence, dim 2), the same ring
functions, torch's merger and rotaters; only the kernel differs. The CPU kernel returns (output, logsumexp) with the
logsumexp (batch, heads, seq) as the CUDA flash kernel's, and takes the same arguments but the dropout seed.

    with cpu_ring_attention(), context_parallel(cp_mesh, buffers=[...], buffer_seq_dims=[...]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # q, k, v: this rank's sequence shards

The rest of a model under context parallel is position-wise, but for rotary embeddings: `apply_context_parallel` gives
each attention the positions of the tokens its rank holds (torch's head-tail load balancer deals rank r the chunks r and
2 cp - 1 - r of 2 cp), and `step_context` shards a step's token and label tensors the way context_parallel does.

tests/train/test_context_parallel.py: outputs and gradients equal the unsharded attention's (2 ranks, gloo), and the
builtin Llama's loss and gradients under cp 2 equal one process's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

aten = torch.ops.aten

SEQ_DIM = 2
"""The sequence dim of SDPA's (batch, heads, seq, head_dim) tensors and of the logsumexp (batch, heads, seq)."""


def _forward_strategy(op_schema):
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.distributed.tensor.placement_types import Replicate, Shard

    # output, logsumexp, then the inputs q, k, v: all replicated, or all sharded on the sequence (the ring's case)
    strategies = [[Replicate()] * 5, [Shard(SEQ_DIM)] * 5]
    return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, strategies, input_index=2)


def _backward_strategy(op_schema):
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.distributed.tensor.placement_types import Replicate, Shard

    # grad q, k, v, then grad_out, q, k, v, output, logsumexp
    strategies = [[Replicate()] * 9, [Shard(SEQ_DIM)] * 9]
    return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(validate=False), op_schema, strategies, input_index=3)


def _ring_forward(mesh, query, key, value, dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask=None, scale=None):
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    if attn_mask is not None:
        raise NotImplementedError("context parallel attention takes no attention mask (causal only)")
    return _templated_ring_attention(mesh.get_group(), SEQ_DIM, aten._scaled_dot_product_flash_attention_for_cpu, query=query,
                                     key=key, value=value, is_causal=is_causal, dropout_p=dropout_p, scale=scale)


def _ring_backward(mesh, grad_out, query, key, value, out, logsumexp, dropout_p: float, is_causal: bool, *, attn_mask=None,
                   scale=None):
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention_backward

    if attn_mask is not None:
        raise NotImplementedError("context parallel attention takes no attention mask (causal only)")
    return _templated_ring_attention_backward(
        mesh.get_group(), SEQ_DIM, aten._scaled_dot_product_flash_attention_for_cpu_backward.default, grad_out=grad_out,
        grad_out_name="grad_out", query=query, key=key, value=value, out=out, logsumexp=logsumexp, is_causal=is_causal,
        dropout_p=dropout_p, scale=scale)


_RING = {aten._scaled_dot_product_flash_attention_for_cpu.default: _ring_forward,
         aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _ring_backward}
_STRATEGY = {aten._scaled_dot_product_flash_attention_for_cpu.default: _forward_strategy,
             aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _backward_strategy}


def _handler(op_call, args, kwargs):
    """torch's _sdpa_handler for the CPU kernels: unwrap the DTensors, check the sharding, run the ring, wrap."""
    from torch.distributed.tensor import DTensor

    dispatcher = DTensor._op_dispatcher
    op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    dispatcher.sharding_propagator.propagate(op_info)
    sharding = op_info.output_sharding
    if sharding is None or sharding.needs_redistribute:
        raise RuntimeError(f"{op_call}: context parallel attention needs q, k and v sharded on the sequence alike")
    return dispatcher.wrap(_RING[op_call](op_info.compute_mesh, *op_info.local_args, **op_info.local_kwargs), sharding.output_spec)


@contextlib.contextmanager
def cpu_ring_attention() -> Iterator[None]:
    """Within it, context_parallel's SDPA on CPU runs torch's ring attention over the CPU kernel. The sharding strategies
    hold only inside (a Shard(2) SDPA is wrong without the ring), as torch's own CP rules do (_sharding_rules.py)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention
    from torch.distributed.tensor.experimental._context_parallel._sharding_rules import _op_strategy_context

    with contextlib.ExitStack() as stack:
        for op, strategy in _STRATEGY.items():
            stack.enter_context(_op_strategy_context(op, strategy))
        saved = dict(_attention.custom_ops)
        _attention.custom_ops.update(dict.fromkeys(_RING, _handler))  # context_parallel() installs custom_ops on entry
        try:
            yield
        finally:
            _attention.custom_ops.clear()
            _attention.custom_ops.update(saved)


def local_positions(seq_len: int, cp_mesh) -> torch.Tensor:
    """The sequence positions (int64, seq_len / cp) of the tokens this rank holds under context_parallel: an arange
    sharded by torch's own code with the load balancer context_parallel picks for a sequence of seq_len."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _context_parallel_buffers
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _create_default_load_balancer

    device = torch.device(cp_mesh.device_type)
    balancer = _create_default_load_balancer(seq_len, cp_mesh.size(), device)
    (shard,) = _context_parallel_buffers(cp_mesh, [torch.arange(seq_len, device=device)], [0], balancer)
    return shard


def apply_context_parallel(model: torch.nn.Module, cp_mesh, seq_len: int) -> int:
    """Give every attention of `model` that takes positions (the builtin models' llama.Attention) this rank's; return how
    many took them."""
    positions = local_positions(seq_len, cp_mesh)
    taken = 0
    for module in model.modules():
        if "positions" in module._buffers:
            module.positions = positions.clone()
            taken += 1
    return taken


@contextlib.contextmanager
def step_context(cp_mesh, tensors: list[torch.Tensor], seq_dim: int = 1) -> Iterator[None]:
    """One step's forward and backward under context parallel: `tensors` (token ids, labels: (batch, seq)) resharded in
    place to this rank's part of every sequence, and SDPA through the ring (on CPU, over the CPU kernel)."""
    from torch.distributed.tensor.experimental import context_parallel

    with contextlib.ExitStack() as stack:
        if cp_mesh.device_type == "cpu":
            stack.enter_context(cpu_ring_attention())
        stack.enter_context(context_parallel(cp_mesh, buffers=tensors, buffer_seq_dims=[seq_dim] * len(tensors),
                                             no_restore_buffers=set(tensors)))
        yield
