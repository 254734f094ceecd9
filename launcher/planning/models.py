"""Shapes of the builtin Llama-style decoder: the config type, the named sizes, and counts
computed from a config alone. Imports no torch, so planning can size a model cheaply."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from launcher.planning.suggest import did_you_mean
from launcher.errors import InputError

KEY = "train.model"


@dataclass(frozen=True, kw_only=True, slots=True)
class LlamaConfig:
    """One Llama-style decoder shape (the fields of Llama 3's ModelArgs)."""

    dim: int
    """Width of the residual stream."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Query heads; head_dim = dim // n_heads."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None means n_heads."""
    vocab_size: int
    """Rows of the token embedding and columns of the output head."""
    multiple_of: int = 256
    """The feed-forward width is rounded up to a multiple of this."""
    ffn_dim_multiplier: float | None = None
    """Scales the feed-forward width (Llama 3: 1.3 for 8B/70B, 1.5 for 1B)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding frequencies."""
    max_seq_len: int = 2048
    """Context the size was designed for (informational: RoPE is computed for any length)."""

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_dim(self) -> int:
        """SwiGLU hidden width, computed as Llama 3 does: 2/3 of 4*dim, scaled, rounded up."""
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)


SIZES: dict[str, LlamaConfig] = {
    # Tiny: every Linear dim is a multiple of 16 (FP8 applies everywhere); a CPU step takes a fraction of a second.
    "llama-debug": LlamaConfig(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=2048, max_seq_len=2048),
    # GPT-2-small-like width and depth (~134M parameters with untied embeddings).
    "llama-small": LlamaConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, vocab_size=32000, max_seq_len=2048),
    # Llama 3.2 1B (ffn 8192; embeddings untied here, so 1.50B parameters instead of 1.24B).
    "llama3-1b": LlamaConfig(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
        multiple_of=256, ffn_dim_multiplier=1.5, rope_theta=500000.0, max_seq_len=8192,
    ),
    # Llama 3 / 3.1 8B (ffn 14336).
    "llama3-8b": LlamaConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256,
        multiple_of=1024, ffn_dim_multiplier=1.3, rope_theta=500000.0, max_seq_len=8192,
    ),
    # Llama 3 / 3.1 70B (ffn 28672).
    "llama3-70b": LlamaConfig(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256,
        multiple_of=4096, ffn_dim_multiplier=1.3, rope_theta=500000.0, max_seq_len=8192,
    ),
}

OVERRIDES = {"layers": "n_layers", "vocab": "vocab_size"}
"""`builtin:NAME?key=N` keys and the LlamaConfig field each one sets."""


def parse_builtin(spec: str) -> LlamaConfig:
    """'builtin:NAME[?layers=N&vocab=M]' (or 'NAME...') -> the LlamaConfig it names."""
    body = spec.removeprefix("builtin:")
    name, _, query = body.partition("?")
    if name not in SIZES:
        raise InputError(
            KEY,
            f"unknown builtin model '{name}'{did_you_mean(name, SIZES)}",
            f"use one of: {', '.join('builtin:' + n for n in SIZES)}",
        )
    changes = {}
    for item in filter(None, query.split("&")):
        k, _, v = item.partition("=")
        if k not in OVERRIDES:
            raise InputError(
                KEY, f"unknown option '{k}' in '{spec}'{did_you_mean(k, OVERRIDES)}", f"use {', '.join(f'{o}=N' for o in OVERRIDES)}"
            )
        if not v.isdigit() or int(v) < 1:
            raise InputError(KEY, f"'{item}' in '{spec}' needs a positive integer", f"write {k}=N with N >= 1, e.g. builtin:{name}?{k}=2")
        changes[OVERRIDES[k]] = int(v)
    return dataclasses.replace(SIZES[name], **changes)


def param_count(cfg: LlamaConfig) -> int:
    """Parameters of the built model (equals sum(p.numel() for p in Llama(cfg).parameters()))."""
    return cfg.vocab_size * cfg.dim + cfg.n_layers * (linear_params_per_layer(cfg) + 2 * cfg.dim) + cfg.dim + cfg.dim * cfg.vocab_size


def linear_params_per_layer(cfg: LlamaConfig) -> int:
    """Weights of one block's Linear layers: wq, wk, wv, wo, w1, w2, w3 (no biases)."""
    q = cfg.n_heads * cfg.head_dim
    kv = cfg.kv_heads * cfg.head_dim
    return cfg.dim * q + 2 * cfg.dim * kv + q * cfg.dim + 3 * cfg.dim * cfg.ffn_dim


def linear_params(cfg: LlamaConfig) -> int:
    """Weights of every Linear layer (the blocks' and the output head; not the embedding)."""
    return cfg.n_layers * linear_params_per_layer(cfg) + cfg.dim * cfg.vocab_size
