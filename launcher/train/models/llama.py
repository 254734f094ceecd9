"""A Llama-style decoder (as in torchtitan): RMSNorm, rotary embeddings, grouped-query
attention through scaled_dot_product_attention, SwiGLU feed-forward, untied output head.

Module names follow torchtitan (tok_embeddings, layers.N.attention.wq, ..., norm, output) so
FQN globs written for torchtitan work here. Every block is self-contained: it takes and
returns the residual stream only, so wrappers (FSDP2, activation checkpointing, compile)
treat it as a black box. RoPE angles are recomputed in fp32 in each forward: they are a few
kernels per layer, carry no state, survive `.to(bf16)` and meta-device init unharmed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from launcher.planning.models import SIZES, LlamaConfig, param_count, parse_builtin

__all__ = ["SIZES", "LlamaConfig", "Llama", "param_count", "parse_builtin", "RMSNorm", "CoreAttention", "Attention", "FeedForward",
           "TransformerBlock"]

INIT_STD = 0.02


def residual_std(cfg: LlamaConfig) -> float:
    """Init std of the residual output projections (wo, w2): 0.02 / sqrt(2 * n_layers)."""
    return INIT_STD / math.sqrt(2 * cfg.n_layers)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, scaled by a learned weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device, positions: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (seq_len, head_dim) fp32, halves laid out as rotate_half expects; at positions
    0 .. seq_len - 1, or at `positions` (seq_len,) where this rank holds other tokens of the sequence (context parallel)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    at = torch.arange(seq_len, device=device, dtype=torch.float32) if positions is None else positions.to(torch.float32)
    angles = torch.outer(at, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate query or key vectors by position, in fp32; `cos`/`sin` broadcast over x's layout
    ((seq, head_dim) for (batch, heads, seq, head_dim); (seq, 1, head_dim) for (batch, seq, heads, head_dim))."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).type_as(x)


class CoreAttention(nn.Module):
    """Causal scaled-dot-product attention over projected, rotated heads: q (batch, seq, heads, head_dim),
    k and v (batch, seq, kv_heads, head_dim) -> (batch, seq, heads * head_dim). No parameters: a precision
    backend may put its own attention in its place (Transformer Engine's DotProductAttention with
    qkv_format "bshd", attn_mask_type "causal" and num_gqa_groups = kv_heads computes the same)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s = q.shape[:2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if k.shape[1] != q.shape[1]:
            # Query head i reads key/value head i // n_rep (n_rep is the same on every TP rank).
            n_rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, s, -1)


class Attention(nn.Module):
    """Causal grouped-query self-attention: projections, rotary embeddings, then `core` (CoreAttention).

    `positions` (a buffer, None unless context parallel set it: launcher/train/parallel/context.py) holds the sequence
    positions of the tokens this rank holds when each rank holds a part of every sequence; never saved."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.rope_theta = cfg.rope_theta
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.core = CoreAttention()
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.register_buffer("positions", None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # Head counts from the projections' widths (-1), not the config: under tensor parallelism
        # wq/wk/wv are column-sharded and each rank holds n_heads / tp and n_kv_heads / tp heads.
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        cos, sin = rope_cos_sin(s, self.head_dim, self.rope_theta, x.device, self.positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (seq, 1, head_dim): over the heads of (batch, seq, heads, head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.wo(self.core(q, k, v))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then + feed_forward(norm(.))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg.dim, cfg.ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Token ids (batch, seq) int64 -> logits (batch, seq, vocab_size)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.check_config(cfg)
        self.config = cfg
        self.vocab_size = cfg.vocab_size
        # Parameters are created on meta and materialised where the caller builds (the default
        # device), so only init_weights draws random numbers: a seeded build equals a meta build
        # followed by to_empty(), the same seed and init_weights(). It also skips nn.Linear's own init.
        device = torch.get_default_device()
        with torch.device("meta"):
            self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
            self.layers = nn.ModuleList(self.block(cfg, i) for i in range(cfg.n_layers))
            self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
            self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights()

    @staticmethod
    def check_config(cfg: LlamaConfig) -> None:
        if cfg.dim % cfg.n_heads or cfg.n_heads % cfg.kv_heads or cfg.head_dim % 2:
            raise ValueError(f"inconsistent LlamaConfig: dim {cfg.dim}, n_heads {cfg.n_heads}, n_kv_heads {cfg.kv_heads}")

    @staticmethod
    def block(cfg: LlamaConfig, layer_id: int) -> nn.Module:
        """Transformer block `layer_id` (the MoE decoder's subclass builds MoE blocks)."""
        return TransformerBlock(cfg)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits for token ids. A pipeline stage (launcher/train/parallel/pipeline.py: its blocks in a ModuleDict under
        their own indices, the embedding only on the first stage, the norm and the head only on the last) maps the
        previous stage's hidden states instead, and returns its own."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values() if isinstance(self.layers, nn.ModuleDict) else self.layers:
            h = layer(h)
        return self.output(self.norm(h)) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self) -> None:
        """Deterministic given the torch seed: N(0, 0.02) everywhere, residual output
        projections (wo, w2) scaled by 1/sqrt(2 * n_layers), norms at one. Call it again
        after materialising a model built on the meta device."""
        for name, module in self.named_modules():
            self.init_module(name, module)

    @torch.no_grad()
    def init_module(self, name: str, module: nn.Module) -> None:
        """Initialise the parameters `module` (named `name` in this model) holds itself. Meta-device
        init calls it once per module, on a full-size copy, under a per-module seed
        (launcher/train/materialize.py); the rule reads the name, not the class the precision
        backend may have swapped in (torchao's Float8Linear is an nn.Linear; TE's are not)."""
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or len(module._parameters) == 0:
            return
        last = name.rsplit(".", 1)[-1]
        if isinstance(module, RMSNorm) or last.endswith("norm"):
            nn.init.ones_(weight)
        elif last in ("wo", "w2"):  # residual output projections
            nn.init.normal_(weight, std=residual_std(self.config))
        else:  # tok_embeddings, wq, wk, wv, w1, w3, output
            nn.init.normal_(weight, std=INIT_STD)


def build_llama(spec: str) -> Llama:
    """'builtin:NAME[?layers=N&vocab=M]' -> a freshly initialised Llama on the current device."""
    return Llama(parse_builtin(spec))
