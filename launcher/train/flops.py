"""Training FLOPs per token, the share of them in FP8, and the peak the device could do.

    flops_per_token = 6 * N_linear + 12 * n_layers * d_attn * seq_len

N_linear counts the weights of every Linear layer (blocks and output head; not the
embedding, which is a lookup; biases and norms are negligible and ignored). 6 = 2 FLOPs per
multiply-add x (forward + two backward GEMMs). The second term is the attention scores and
weighted sum (QK^T and AV: 2 GEMMs x 2 FLOPs x 3 passes, with d_attn = n_heads * head_dim),
as in the PaLM paper appendix B and torchtitan. Causal masking is not discounted.

For a builtin Llama (or a LlamaConfig) every number is exact. For an MoE (MoEConfig, or a model
with expert modules) N_linear counts the ACTIVE weights: the router gate, the top_k routed experts
and the shared experts a token runs through, so MFU is on active parameters. For another nn.Module:
N_linear sums its nn.Linear weights (and those of modules named *Linear that have
in_features/out_features, as Transformer Engine's); n_layers and d_attn come from a Hugging
Face style `config` (num_hidden_layers, num_attention_heads, head_dim or hidden_size), else
from `transformer_blocks(model)` and the width of its first nn.Embedding; when either is
unknown the attention term is 0 (an undercount, so MFU errs low, never high).

torch is imported only where a module is inspected.
"""

from __future__ import annotations

import typing

from launcher.planning.models import LlamaConfig, MoEConfig, linear_params, moe_linear_params

if typing.TYPE_CHECKING:
    from torch import nn


def flops_per_token(model_or_cfg, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token at sequence length `seq_len`."""
    if isinstance(model_or_cfg, LlamaConfig):
        cfg = model_or_cfg
        return float(6 * linear_params(cfg) + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len)
    if isinstance(model_or_cfg, MoEConfig):  # active parameters: router, top_k routed + shared experts
        cfg = model_or_cfg
        return float(6 * moe_linear_params(cfg, active=True) + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len)
    n_layers, d_attn = attention_shape(model_or_cfg)
    return float(6 * sum(linear_macs(model_or_cfg).values()) + 12 * n_layers * d_attn * seq_len)


def attention_shape(model: "nn.Module") -> tuple[int, int]:
    """(n_layers, n_heads * head_dim) of a model, or (0, 0) when they cannot be found."""
    from torch import nn

    from launcher.train.models import transformer_blocks

    cfg = getattr(model, "config", None)
    if isinstance(cfg, (LlamaConfig, MoEConfig)):
        return cfg.n_layers, cfg.n_heads * cfg.head_dim
    layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    head_dim = getattr(cfg, "head_dim", None) or (getattr(cfg, "hidden_size", 0) // heads if heads else None)
    if layers and heads and head_dim:
        return int(layers), int(heads * head_dim)
    blocks = transformer_blocks(model)
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if blocks and embedding is not None:
        return len(blocks), embedding.embedding_dim
    return 0, 0


def is_linear(module: "nn.Module") -> bool:
    """nn.Linear (torchao's Float8Linear included) or a *Linear with in_features/out_features (TE)."""
    from torch import nn

    if isinstance(module, nn.Linear):
        return True
    return type(module).__name__.endswith("Linear") and isinstance(getattr(module, "in_features", None), int) and isinstance(
        getattr(module, "out_features", None), int
    )


def linear_macs(model: "nn.Module") -> dict[str, int]:
    """Multiply-adds per token of each Linear layer (in_features * out_features), and of each MoE
    expert module (3D w1/w2/w3: 3 * dim * hidden for each of the top_k experts a token runs through),
    by FQN."""
    from launcher.train.precision.torchao_moe import is_grouped_experts

    out = {}
    for name, m in model.named_modules():
        if is_linear(m):
            out[name] = m.in_features * m.out_features
        elif is_grouped_experts(m):
            out[name] = 3 * int(m.w1.shape[1]) * int(m.w1.shape[2]) * int(getattr(m, "top_k", 1))
    return out


