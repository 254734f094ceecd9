"""Shapes of the builtin Llama-style decoder: the config type, the named sizes, and counts
computed from a config alone. Imports no torch, so planning can size a model cheaply."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from launcher.errors import InputError
from launcher.planning.suggest import did_you_mean

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


@dataclass(frozen=True, kw_only=True, slots=True)
class MoEConfig:
    """A Mixture-of-Experts decoder shape (torchtitan 0.3.0's MoE args): Llama-style grouped-query
    attention blocks whose feed-forward is a routed `MoE` (the first `n_dense_layers` keep a dense
    SwiGLU of width `dense_ffn_dim`)."""

    dim: int
    """Width of the residual stream."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Query heads."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None means n_heads."""
    head_dim_override: int | None = None
    """Width of one head when it is not dim // n_heads (Qwen3: 128 with dim 2048 and 32 heads)."""
    vocab_size: int
    """Rows of the token embedding and columns of the output head."""
    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Routed experts each token goes to."""
    moe_ffn_dim: int
    """SwiGLU hidden width of one expert."""
    n_shared_experts: int = 0
    """Shared experts, run on every token as one dense SwiGLU of width n_shared_experts * moe_ffn_dim."""
    n_dense_layers: int = 0
    """The first blocks use a dense SwiGLU feed-forward instead of the MoE (DeepSeek: 1)."""
    dense_ffn_dim: int = 0
    """SwiGLU hidden width of the dense blocks."""
    score_func: str = "softmax"
    """Router scores: "softmax" or "sigmoid"."""
    route_norm: bool = False
    """Renormalise the top-k scores to sum to one (Qwen3's norm_topk_prob)."""
    route_scale: float = 1.0
    """Factor on the routing scores."""
    load_balance_coeff: float | None = 1e-3
    """Step of the auxiliary-loss-free expert bias update (DeepSeek-V3); None turns balancing off."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding frequencies."""
    max_seq_len: int = 4096
    """Context the size was designed for (informational)."""

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.dim // self.n_heads

    @property
    def ffn_dim(self) -> int:
        """Hidden width of the dense blocks' feed-forward (0 when every block is an MoE)."""
        return self.dense_ffn_dim

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - min(self.n_dense_layers, self.n_layers)


MOE_SIZES: dict[str, MoEConfig] = {
    # Tiny: trains on the CPU in seconds; every expert GEMM dim is a multiple of 32 (MXFP8 blocks).
    "moe-debug": MoEConfig(
        dim=128, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=2048,
        num_experts=8, top_k=2, moe_ffn_dim=256, n_shared_experts=1, max_seq_len=2048,
    ),
    # Qwen3-30B-A3B (Hugging Face Qwen/Qwen3-30B-A3B config.json; torchtitan 0.3.0 qwen3 "30B-A3B"):
    # hidden 2048, 48 layers, 32 heads x head_dim 128, 4 kv heads, 128 experts top-8, moe_intermediate
    # 768, softmax + norm_topk_prob, vocab 151936, untied head. Not modelled: q_norm/k_norm (2 x 128
    # weights per layer). 30.53B parameters, 3.35B active (published: 30.5B / 3.3B).
    "qwen3-30b-a3b": MoEConfig(
        dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim_override=128, vocab_size=151936,
        num_experts=128, top_k=8, moe_ffn_dim=768, route_norm=True, rope_theta=1_000_000.0, max_seq_len=40960,
    ),
    # DeepSeek-V3 16B (torchtitan 0.3.0 deepseek_v3 "16B", i.e. deepseek-moe-16b): dim 2048, 27 layers,
    # 16 heads, 64 routed experts top-6 (moe_inter 1408), 2 shared experts, the first layer dense
    # (10944), softmax routing, vocab 102400. Our attention is grouped-query (here 16 kv heads of
    # 128), not DeepSeek's multi-head latent attention (q_lora_rank 0, kv_lora_rank 512, rope dim 64):
    # the attention weights differ (ours 16.8M per layer, MLA's 13.8M); the experts, ~93% of the
    # parameters, are the same. 15.79B parameters, 2.74B active. torchtitan uses 27 blocks; the Hugging
    # Face deepseek-moe-16b has 28 (16.4B / 2.8B published): `?layers=28` gives 16.38B / 2.83B.
    "deepseek-v3-16b": MoEConfig(
        dim=2048, n_layers=27, n_heads=16, vocab_size=102400, num_experts=64, top_k=6, moe_ffn_dim=1408,
        n_shared_experts=2, n_dense_layers=1, dense_ffn_dim=10944, max_seq_len=16384,
    ),
}

OVERRIDES = {"layers": "n_layers", "vocab": "vocab_size"}
"""`builtin:NAME?key=N` keys and the LlamaConfig field each one sets."""

MOE_OVERRIDES = {"experts": "num_experts", "top_k": "top_k"}
"""Further `builtin:NAME?key=N` keys of the MoE shapes."""

MAX_LAYERS = 4096
"""The most transformer blocks a model may have (the deepest trained transformers have about a thousand): planning,
the prediction and the run each do per-block work, so `?layers=N` and an hf: config's layers are checked against it
first. The schema bounds the keys that count blocks or stages by the same number."""

MAX_OVERRIDE = 2**31 - 1
"""The most any other `builtin:NAME?key=N` may be (a vocabulary, a number of experts): far beyond any model, and small
enough that every size computed from it stays an exact integer."""


@functools.lru_cache(maxsize=512)
def parse_builtin(spec: str) -> LlamaConfig | MoEConfig:
    """'builtin:NAME[?layers=N&vocab=M]' (or 'NAME...') -> the LlamaConfig (or, for an MoE
    shape, the MoEConfig; these also take experts=N and top_k=K) it names."""
    body = spec.removeprefix("builtin:")
    name, _, query = body.partition("?")
    known = {**SIZES, **MOE_SIZES}
    if name not in known:
        raise InputError(
            KEY,
            f"unknown builtin model '{_short(name)}'{did_you_mean(name, known)}",
            f"use one of: {', '.join('builtin:' + n for n in known)}",
        )
    options = {**OVERRIDES, **MOE_OVERRIDES} if name in MOE_SIZES else OVERRIDES
    changes = {}
    for item in filter(None, query.split("&")):
        k, _, v = item.partition("=")
        if k not in options:
            raise InputError(KEY, f"unknown option '{_short(k)}' in '{_short(spec, 80)}'{did_you_mean(k, options)}",
                             f"use {', '.join(f'{o}=N' for o in options)}")
        digits = v.lstrip("0")
        if not (v.isascii() and v.isdigit()) or not digits:
            raise InputError(KEY, f"'{_short(item)}' in '{_short(spec, 80)}' needs a positive integer",
                             f"write {k}=N with N >= 1, e.g. builtin:{name}?{k}=2")
        most = MAX_LAYERS if options[k] == "n_layers" else MAX_OVERRIDE
        if len(digits) > len(str(most)) or int(digits) > most:  # the length first: int() of 5000 digits raises
            raise InputError(KEY, f"'{k}={_short(v)}' in '{_short(spec, 80)}' is more than {most}", f"write {k}=N with N <= {most}")
        changes[options[k]] = int(digits)
    cfg = dataclasses.replace(known[name], **changes)
    if isinstance(cfg, MoEConfig) and cfg.top_k > cfg.num_experts:
        raise InputError(KEY, f"'{spec}' routes each token to top_k={cfg.top_k} of {cfg.num_experts} experts", "set top_k <= experts")
    return cfg


def _short(text: str, keep: int = 24) -> str:
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def builtin_config(model: str) -> LlamaConfig | MoEConfig | None:
    """The config a `builtin:` train.model names; None for hf: / py: models and for a bad builtin name (planning reports
    that itself, with did-you-mean)."""
    if not model.startswith("builtin:"):
        return None
    try:
        return parse_builtin(model)
    except InputError:
        return None


def is_moe(cfg) -> bool:
    """True for a Mixture-of-Experts shape."""
    return isinstance(cfg, MoEConfig)


def attention_params(cfg: LlamaConfig | MoEConfig) -> int:
    """Weights of one block's attention projections wq, wk, wv, wo."""
    q = cfg.n_heads * cfg.head_dim
    kv = cfg.kv_heads * cfg.head_dim
    return cfg.dim * q + 2 * cfg.dim * kv + q * cfg.dim


def moe_layer_params(cfg: MoEConfig, active: bool = False) -> int:
    """Weights of one MoE feed-forward: the router gate, the routed experts (all, or the top_k a
    token runs through when `active`) and the shared experts."""
    experts = cfg.top_k if active else cfg.num_experts
    return cfg.dim * cfg.num_experts + (experts + cfg.n_shared_experts) * 3 * cfg.dim * cfg.moe_ffn_dim


def moe_linear_params(cfg: MoEConfig, active: bool = False) -> int:
    """Weights of every matmul (blocks and output head; not the embedding): all experts, or the
    active ones (top_k routed + shared + router) when `active`."""
    dense = min(cfg.n_dense_layers, cfg.n_layers)
    return (
        cfg.n_layers * attention_params(cfg)
        + dense * 3 * cfg.dim * cfg.dense_ffn_dim
        + cfg.n_moe_layers * moe_layer_params(cfg, active)
        + cfg.dim * cfg.vocab_size
    )


def active_param_count(cfg: LlamaConfig | MoEConfig) -> int:
    """Parameters one token runs through (an MoE's top_k routed experts, shared experts and router;
    every parameter of a dense model)."""
    if not isinstance(cfg, MoEConfig):
        return param_count(cfg)
    return cfg.vocab_size * cfg.dim + moe_linear_params(cfg, active=True) + (2 * cfg.n_layers + 1) * cfg.dim


def param_count(cfg: LlamaConfig | MoEConfig) -> int:
    """Parameters of the built model (equals sum(p.numel() for p in Llama(cfg).parameters()), or
    MoETransformer(cfg)'s)."""
    if isinstance(cfg, MoEConfig):
        return cfg.vocab_size * cfg.dim + moe_linear_params(cfg) + (2 * cfg.n_layers + 1) * cfg.dim
    return cfg.vocab_size * cfg.dim + cfg.n_layers * (linear_params_per_layer(cfg) + 2 * cfg.dim) + cfg.dim + cfg.dim * cfg.vocab_size


def linear_params_per_layer(cfg: LlamaConfig | MoEConfig) -> int:
    """Weights of one block's Linear layers: wq, wk, wv, wo, w1, w2, w3 (no biases); for an MoE
    the mean over blocks of the attention, router, all experts and shared experts."""
    if isinstance(cfg, MoEConfig):
        return (moe_linear_params(cfg) - cfg.dim * cfg.vocab_size) // cfg.n_layers
    q = cfg.n_heads * cfg.head_dim
    kv = cfg.kv_heads * cfg.head_dim
    return cfg.dim * q + 2 * cfg.dim * kv + q * cfg.dim + 3 * cfg.dim * cfg.ffn_dim


def linear_params(cfg: LlamaConfig | MoEConfig) -> int:
    """Weights of every Linear layer (the blocks' and the output head; not the embedding); for an
    MoE those of every expert."""
    if isinstance(cfg, MoEConfig):
        return moe_linear_params(cfg)
    return cfg.n_layers * linear_params_per_layer(cfg) + cfg.dim * cfg.vocab_size
