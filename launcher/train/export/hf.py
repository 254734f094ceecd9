"""What a run's model becomes in a Hugging Face folder: the class, its config, and which of our
weights goes under which of its names.

builtin:NAME -> LlamaForCausalLM. The builtin decoder (launcher/train/models/llama.py) rotates query
and key by halves (`rotate_half`: cos/sin of angles `cat(freqs, freqs)`, x1 = first half of the head,
x2 = second half), which is Hugging Face's layout: its q_proj / k_proj take wq / wk as they are.
Meta's original checkpoints rotate interleaved pairs instead, which is why transformers'
convert_llama_weights_to_hf permutes their rows; ours need no permutation (tests/test_export.py
shows equal logits). The rest is renaming:

    tok_embeddings                  model.embed_tokens
    layers.N.attention_norm         model.layers.N.input_layernorm
    layers.N.attention.wq/wk/wv/wo  model.layers.N.self_attn.q_proj/k_proj/v_proj/o_proj
    layers.N.ffn_norm               model.layers.N.post_attention_layernorm
    layers.N.feed_forward.w1/w3/w2  model.layers.N.mlp.gate_proj/up_proj/down_proj
    norm                            model.norm
    output                          lm_head

hf:PATH -> the class its config.json names, with that config (as the run read it) and its own
state-dict names: the run trained the Hugging Face module itself, so our clean names are its names.
Tied weights (tie_word_embeddings) are written once, under the name transformers keeps; buffers
transformers recomputes (rotary inv_freq) and Transformer Engine's `_extra_state` are dropped.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch

from launcher.errors import BackendMissing, InputError
from launcher.planning.install import INSTALL

from .read import Entry

KEY = "train.model"
RECOMPUTED = ("inv_freq", "original_inv_freq", "_extra_state")
"""Name endings of tensors that are no weights: rotary frequencies (recomputed), TE's FP8 scaling state."""

_TOP = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}
_BLOCK = {"attention_norm": "input_layernorm", "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
          "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
          "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj"}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")


@dataclass
class Target:
    """A Hugging Face model to write: its config, and our name -> its name for every weight it holds."""

    architecture: str
    config: object
    """A transformers PretrainedConfig, dtype set."""
    names: dict[str, str]
    """Our clean name -> the Hugging Face name, in the Hugging Face model's order."""
    dropped: list[str] = field(default_factory=list)
    """Our names left out: tied copies, recomputed buffers, TE extra state."""
    generation_config: object | None = None
    """A GenerationConfig to write, or None."""
    copies: list[tuple[str, str]] = field(default_factory=list)
    """(source file, name in the folder): generation_config.json of an hf: folder, tokenizer files."""


def transformers_module():
    try:
        import transformers
    except ImportError as e:
        raise BackendMissing("transformers", INSTALL["transformers"]) from e
    return transformers


def builtin_name(ours: str) -> str | None:
    """Our builtin Llama name -> LlamaForCausalLM's, or None for a name it has no place for."""
    head, _, last = ours.rpartition(".")
    if head in _TOP and last == "weight":
        return f"{_TOP[head]}.weight"
    m = _LAYER.match(ours)
    if m and m.group(2) in _BLOCK and m.group(3) == "weight":
        return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.weight"
    return None


def builtin_moe(spec: str) -> bool:
    """Whether builtin model `spec` is the MoE decoder (launcher/train/models/moe.py)."""
    from launcher.planning.models import is_moe, parse_builtin

    return is_moe(parse_builtin(spec))


def builtin_config(spec: str, dtype: torch.dtype, eos: int | None = None):
    """LlamaForCausalLM's config for builtin model `spec` (train.model); `eos`: the run's tokenizer's EOS id."""
    from launcher.planning.models import parse_builtin

    cfg = parse_builtin(spec)
    transformers = transformers_module()
    config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, hidden_act="silu",
        rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_seq_len,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=eos,
        pad_token_id=None,
    )
    _set_dtype(config, dtype)
    return config


def builtin_target(spec: str, entries: dict[str, Entry], dtype: torch.dtype, eos: int | None = None) -> Target:
    """LlamaForCausalLM for builtin model `spec`, checked against the checkpoint's names and shapes; `eos`: the
    EOS id of the run's tokenizer, for config.json and generation_config.json (the builtin knows no tokens)."""
    from launcher.train.models.llama import build_llama

    with torch.device("meta"):
        ours = {k: Entry(tuple(v.shape), v.dtype) for k, v in build_llama(spec).state_dict().items()}
    check_names(ours, entries, what=f"the model {spec}")
    config = builtin_config(spec, dtype, eos)
    model = _meta_model(config)
    config.architectures = [type(model).__name__]
    expected = _expected(model)
    names = {o: builtin_name(o) for o in ours}
    unmapped = [o for o, h in names.items() if h is None]
    mapped = {h: ours[o].shape for o, h in names.items() if h is not None}
    if unmapped or mapped != {h: e.shape for h, e in expected.items()}:  # the table above is incomplete or wrong
        raise InputError(KEY, f"{spec} does not map onto LlamaForCausalLM (unmapped: {', '.join(unmapped) or 'none'}; "
                         f"LlamaForCausalLM expects {len(expected)} tensors, the mapping gives {len(mapped)})",
                         "export with --format torch (our own names)")
    order = {h: i for i, h in enumerate(expected)}
    names = dict(sorted(names.items(), key=lambda kv: order[kv[1]]))
    return Target(architecture=type(model).__name__, config=config, names=names, generation_config=_generation_config(model),
                  dropped=[n for n in entries if n.endswith(RECOMPUTED)])


def hf_target(path: str, spec_dir: str, entries: dict[str, Entry], dtype: torch.dtype) -> Target:
    """The class and config of hf:PATH, our names (its own) checked against what it expects."""
    from launcher.train.models.hf import locate

    found, config_file, _ = locate(path, spec_dir)
    transformers = transformers_module()
    try:
        config = transformers.AutoConfig.from_pretrained(config_file, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(KEY, f"transformers cannot read {config_file}: {e}", "export with --format torch (our own names)") from e
    model = _meta_model(config)
    _set_dtype(config, dtype)
    config.architectures = [type(model).__name__]
    expected = _expected(model)
    aliases = _tied_aliases(model)
    names, dropped = {}, []
    for ours in entries:
        if ours in expected:
            names[ours] = ours
        elif ours in aliases or ours.endswith(RECOMPUTED) or entries[ours].numel == 0:
            dropped.append(ours)
        else:
            raise InputError(KEY, f"the checkpoint holds {ours}, which {type(model).__name__} built from {config_file} has no "
                             "place for", "export with the plan the run was trained with (--plan), or with --format torch")
    missing = [h for h in expected if h not in names]
    if missing:
        raise InputError(KEY, f"{type(model).__name__} built from {config_file} expects {len(missing)} tensor(s) the checkpoint "
                         f"lacks: {', '.join(missing[:5])}",
                         "export with the plan the run was trained with (--plan), or with --format torch")
    wrong = [f"{h} {entries[h].shape} (expected {e.shape})" for h, e in expected.items() if entries[h].shape != e.shape]
    if wrong:
        raise InputError(KEY, f"shapes differ from {config_file}: {', '.join(wrong[:3])}",
                         "export with the plan the run was trained with (--plan)")
    folder = found if os.path.isdir(found) else os.path.dirname(config_file)
    copies = [(os.path.join(folder, "generation_config.json"), "generation_config.json")] \
        if os.path.isfile(os.path.join(folder, "generation_config.json")) else []
    order = {h: i for i, h in enumerate(expected)}
    return Target(architecture=type(model).__name__, config=config, names=dict(sorted(names.items(), key=lambda kv: order[kv[1]])),
                  dropped=dropped, generation_config=None if copies else _generation_config(model), copies=copies)


def check_names(expected: dict[str, Entry], entries: dict[str, Entry], *, what: str) -> None:
    """The checkpoint holds exactly the weights of the plan's model, in its shapes."""
    weights = {k: v for k, v in entries.items() if not k.endswith(RECOMPUTED)}
    missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    wrong = [f"{k} {weights[k].shape} (expected {e.shape})" for k, e in expected.items() if k in weights and weights[k].shape != e.shape]
    if missing or extra or wrong:
        parts = ([f"lacks {', '.join(missing[:4])}"] if missing else []) + ([f"has {', '.join(extra[:4])}"] if extra else []) + (
            [f"shapes differ: {', '.join(wrong[:3])}"] if wrong else [])
        raise InputError(KEY, f"the checkpoint does not hold {what}: it {'; '.join(parts)}",
                         "export with the plan the run was trained with (--plan), or with --format torch")


def _set_dtype(config, dtype: torch.dtype) -> None:
    """The dtype from_pretrained(dtype="auto") loads in: `dtype` (transformers >= 4.56), `torch_dtype` before."""
    from launcher.train.models.hf import _dtype_kwargs

    setattr(config, next(iter(_dtype_kwargs(transformers_module()))), dtype)


def _meta_model(config):
    """The model `config` builds, on the meta device (from_config sets the dtype it is given on its config: a copy)."""
    import copy

    from launcher.train.models.hf import _dtype_kwargs

    transformers = transformers_module()
    try:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), **_dtype_kwargs(transformers))
    except (OSError, ValueError, KeyError) as e:
        raise InputError(KEY, f"transformers cannot build a causal LM from this config: {e}",
                         "export with --format torch (our own names)") from e


def _expected(model) -> dict[str, Entry]:
    """The tensors a Hugging Face model's weights files hold: its state dict, tied copies once."""
    aliases = _tied_aliases(model)
    return {k: Entry(tuple(v.shape), v.dtype) for k, v in model.state_dict().items() if k not in aliases}


def _tied_aliases(model) -> set[str]:
    """Names of parameters that are another name's parameter (tied embeddings): all but the first."""
    seen: dict[int, str] = {}
    aliases = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases.add(name)
        else:
            seen[id(p)] = name
    return aliases


def _generation_config(model):
    return model.generation_config if callable(getattr(model, "can_generate", None)) and model.can_generate() else None
