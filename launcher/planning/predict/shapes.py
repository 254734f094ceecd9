"""The Linear layers of a model, from its shapes alone (torch-free): builtin sizes from
launcher/planning/models.py, `hf:` models from their config.json read as JSON.

A layer is listed once with `count` = how many identical copies the model has (one per block),
in module registration order, with the FQN of its first copy (e.g. `layers.0.attention.wq`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from launcher.errors import InputError
from launcher.planning import bounded
from launcher.planning.models import MAX_LAYERS, MAX_OVERRIDE, LlamaConfig, parse_builtin


@dataclass(frozen=True, slots=True)
class LinearShape:
    name: str
    """FQN of the first copy; `{i}` in it is the block index."""
    in_features: int
    out_features: int
    count: int
    """Copies in the model (blocks)."""
    parallel: str
    """Tensor-parallel style: "column" (out_features split), "row" (in_features split) or "none"."""


@dataclass(frozen=True, slots=True)
class ExpertShape:
    """The routed experts of an MoE model: `count` GroupedExperts modules (one per MoE block), each E SwiGLU
    experts (w1, w3: dim -> hidden; w2: hidden -> dim) run as grouped GEMMs over the tokens routed to them."""

    name: str
    """FQN of the first module, `{i}` the block index (e.g. `layers.{i}.moe.experts`)."""
    dim: int
    hidden: int
    num_experts: int
    top_k: int
    count: int
    first_block: int
    """The block index of the first MoE block (DeepSeek's first blocks are dense)."""

    @property
    def params(self) -> int:
        return 3 * self.dim * self.hidden * self.num_experts * self.count


@dataclass(frozen=True, slots=True)
class ModelShape:
    source: str
    """What the shapes were read from (builtin:NAME, a config.json path)."""
    dim: int
    n_layers: int
    n_heads: int
    kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    linears: tuple[LinearShape, ...]
    experts: ExpertShape | None = None
    """The routed experts of an MoE model (their grouped GEMMs are costed apart from the Linears)."""
    tied: bool = False
    """The output layer's weight is the embedding's (tie_word_embeddings): one parameter, two GEMM users."""

    @property
    def linear_params(self) -> int:
        return sum(s.in_features * s.out_features * s.count for s in self.linears)

    @property
    def params(self) -> int:
        """Linear weights + routed experts + the embedding (once where the output layer shares it) + norms (2 per
        block and a final one)."""
        experts = self.experts.params if self.experts else 0
        embedding = 0 if self.tied else self.vocab_size * self.dim
        return self.linear_params + experts + embedding + (2 * self.n_layers + 1) * self.dim

    @property
    def n_linears(self) -> int:
        return sum(s.count for s in self.linears)


def _attention(prefix: str, names: tuple[str, str, str, str], dim: int, q: int, kv: int, count: int,
               fused_qkv: bool = False) -> list[LinearShape]:
    """The q, k, v and o projections of `count` blocks (q, k and v as one Linear where fused)."""
    wq, wk, wv, wo = names
    qkv = ([LinearShape(f"{prefix}.{wq}", dim, q + 2 * kv, count, "column")] if fused_qkv else
           [LinearShape(f"{prefix}.{wq}", dim, q, count, "column"), LinearShape(f"{prefix}.{wk}", dim, kv, count, "column"),
            LinearShape(f"{prefix}.{wv}", dim, kv, count, "column")])
    return qkv + [LinearShape(f"{prefix}.{wo}", q, dim, count, "row")]


def _swiglu(prefix: str, names: tuple[str, str, str], dim: int, width: int, count: int,
            fused_gate_up: bool = False) -> list[LinearShape]:
    """A SwiGLU feed-forward of `count` blocks in registration order w1 (gate), w2 (down), w3 (up); gate and up as one
    Linear where fused."""
    w1, w2, w3 = names
    if fused_gate_up:
        return [LinearShape(f"{prefix}.{w1}", dim, 2 * width, count, "column"), LinearShape(f"{prefix}.{w2}", width, dim, count, "row")]
    return [LinearShape(f"{prefix}.{w1}", dim, width, count, "column"), LinearShape(f"{prefix}.{w2}", width, dim, count, "row"),
            LinearShape(f"{prefix}.{w3}", dim, width, count, "column")]


def _decoder(source: str, *, dim, n_layers, n_heads, kv_heads, head_dim, ffn_dim, vocab, prefix: str,
             names: tuple[str, ...], head: str, fused_qkv: bool = False, fused_gate_up: bool = False) -> ModelShape:
    """A Llama-style block: q, k, v, o projections and a SwiGLU MLP (gate, up, down), plus the output head."""
    attn = _attention(prefix, names[:4], dim, n_heads * head_dim, kv_heads * head_dim, n_layers, fused_qkv)
    mlp = _swiglu(prefix, names[4:], dim, ffn_dim, n_layers, fused_gate_up)
    return ModelShape(source, dim, n_layers, n_heads, kv_heads, head_dim, ffn_dim, vocab,
                      tuple(attn + mlp + [LinearShape(head, dim, vocab, 1, "column")]))


def builtin_shape(cfg: LlamaConfig, source: str) -> ModelShape:
    """The builtin Llama (launcher/train/models/llama.py): registration order wq, wk, wv, wo, w1, w2, w3, then output."""
    if getattr(cfg, "moe_ffn_dim", 0):
        return _moe_shape(cfg, source)
    return _decoder(source, dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads, kv_heads=cfg.kv_heads,
                    head_dim=cfg.head_dim, ffn_dim=_active_ffn_dim(cfg), vocab=cfg.vocab_size, prefix="layers.{i}",
                    names=("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                           "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"), head="output")


def _moe_shape(cfg, source: str) -> ModelShape:
    """The builtin MoE decoder (launcher/train/models/moe.py): per block the attention projections; the dense
    SwiGLU of the first n_dense_layers blocks; in every other block the router gate (kept in high precision),
    the shared experts (one dense SwiGLU) and the routed experts (grouped GEMMs, `experts`); then the head."""
    n, dense, moe = cfg.n_layers, cfg.n_dense_layers, cfg.n_layers - cfg.n_dense_layers
    p = "layers.{i}"
    attn = _attention(p, ("attention.wq", "attention.wk", "attention.wv", "attention.wo"), cfg.dim, cfg.n_heads * cfg.head_dim,
                      cfg.kv_heads * cfg.head_dim, n)
    ffn = _swiglu(p, ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3"), cfg.dim, cfg.dense_ffn_dim, dense) if dense else []
    ffn.append(LinearShape(f"{p}.moe.router.gate", cfg.dim, cfg.num_experts, moe, "none"))
    if cfg.n_shared_experts:
        ffn += _swiglu(p, ("moe.shared_experts.w1", "moe.shared_experts.w2", "moe.shared_experts.w3"), cfg.dim,
                       cfg.moe_ffn_dim * cfg.n_shared_experts, moe)
    experts = ExpertShape("layers.{i}.moe.experts", cfg.dim, cfg.moe_ffn_dim, cfg.num_experts, cfg.top_k, moe, dense)
    return ModelShape(source, cfg.dim, n, cfg.n_heads, cfg.kv_heads, cfg.head_dim, _active_ffn_dim(cfg), cfg.vocab_size,
                      tuple(attn + ffn + [LinearShape("output", cfg.dim, cfg.vocab_size, 1, "column")]), experts)


def _active_ffn_dim(cfg) -> int:
    """The feed-forward width a token meets (the elementwise SwiGLU work): for a builtin MoE shape
    (launcher/planning/models.py MoEConfig), its top_k routed experts plus its shared ones."""
    moe_ffn = getattr(cfg, "moe_ffn_dim", 0)
    if not moe_ffn:
        return cfg.ffn_dim
    return moe_ffn * (cfg.top_k + cfg.n_shared_experts)


HF_FUSED_QKV = {"phi3"}
"""Model types whose attention projects q, k, v with one Linear (qkv_proj) and gate/up with one (gate_up_proj)."""


def hf_shape(config: dict, source: str) -> ModelShape | None:
    """A decoder-only Hugging Face config (Llama, Mistral, Qwen2, Gemma, Phi-3 ...); None when it does not
    describe a Llama-style block (e.g. GPT-2, whose projections are Conv1D, or a config without the sizes). Raises
    ValueError for sizes beyond what a model may have (more than MAX_LAYERS blocks: planning works block by block)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        dim, n_layers, n_heads = _size(text, "hidden_size"), _size(text, "num_hidden_layers", MAX_LAYERS), _size(
            text, "num_attention_heads")
        ffn, vocab = _size(text, "intermediate_size"), _size(text, "vocab_size")
        kv = _size(text, "num_key_value_heads") if text.get("num_key_value_heads") else n_heads
        head_dim = _size(text, "head_dim") if text.get("head_dim") else dim // n_heads
    except (KeyError, TypeError):
        return None
    if head_dim < 1:
        return None
    fused = text.get("model_type") in HF_FUSED_QKV
    shape = _decoder(source, dim=dim, n_layers=n_layers, n_heads=n_heads, kv_heads=kv, head_dim=head_dim, ffn_dim=ffn,
                     vocab=vocab, prefix="model.layers.{i}",
                     names=("self_attn.qkv_proj" if fused else "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                            "self_attn.o_proj", "mlp.gate_up_proj" if fused else "mlp.gate_proj", "mlp.down_proj", "mlp.up_proj"),
                     head="lm_head", fused_qkv=fused, fused_gate_up=fused)
    # transformers' default is tied embeddings (PretrainedConfig.tie_word_embeddings = True) unless the config says otherwise
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)))
    return dataclasses.replace(shape, tied=tied) if shape is not None else None


def _size(config: dict, key: str, most: int = MAX_OVERRIDE) -> int:
    """config[key] as a size: a whole number from 1 to `most` (KeyError when absent, TypeError when not a number,
    ValueError past `most`)."""
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(key)
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()) or value < 1:
        raise TypeError(key)
    if value > most:
        raise ValueError(f"its {key} {value} is more than {most}")
    return int(value)


def model_shape(model: str, spec_dir: str = ".") -> tuple[ModelShape | None, str]:
    """(shape, "") for a builtin or hf: model; (None, why) when the shapes are unknown before the model is built."""
    kind = model.split(":", 1)[0]
    if kind == "builtin":
        try:
            return builtin_shape(parse_builtin(model), model), ""
        except InputError:
            return None, "unknown builtin model"
    if kind == "hf":
        path = model[3:]
        found = next((p for p in (path, os.path.join(spec_dir, path)) if os.path.exists(p)), None)
        if found is None:
            return None, f"{path} not found here"
        config_file = os.path.join(found, "config.json") if os.path.isdir(found) else found
        try:
            config = bounded.loads_json(bounded.read_bytes(config_file, bounded.CONFIG_BYTES).decode("utf-8-sig"), max_depth=64)
        except OSError as e:
            return None, f"cannot read {config_file}: {e.strerror or e.__class__.__name__}"
        except (ValueError, RecursionError) as e:
            return None, f"cannot read {config_file}: {e.__class__.__name__}"
        try:
            shape = hf_shape(config, model) if isinstance(config, dict) else None
        except ValueError as e:
            return None, f"{config_file} is beyond what planning sizes: {e}"
        return (shape, "") if shape else (None, f"{config_file} does not describe a Llama-style decoder")
    return None, f"{kind}: models are known only once built (a user factory); the prediction needs builtin: or hf:"
