"""Build the model a plan names (`train.model`) and find its repeated blocks.

    builtin:NAME[?layers=N&vocab=M]   the Llama-style decoder in a named size (see llama.SIZES), or
                                      the MoE decoder (moe.py; MOE_SIZES, also ?experts=E&top_k=K)
    hf:PATH                           a local Hugging Face causal LM folder or config.json
    py:module:function                a user factory, called with no arguments

The model comes back on the CPU (builtin, hf: in fp32), initialised from torch's global RNG
(the caller seeds it). Every model has an int `vocab_size`; its forward maps int64
(batch, seq) to logits (batch, seq, vocab), or to an object with `.logits` (Hugging Face
models): pass the output through `logits_of`.

The training entrypoint builds through `build_for_run` instead: on the meta device (no
storage), with the rule that initialises it later, rank by rank (launcher/train/materialize.py):

    builtin   built on meta; `Llama.init_module` per module
    hf:PATH   built from its config on meta; a folder with weights: each module's tensors read from
              the files when its turn comes (hf_weights.CheckpointInit; what the files lack: the
              model's `_init_weights`); a config alone: the model's own `_init_weights` per module.
    py:       the factory is called under torch.device("meta"); the model's `init_weights()`
              when it has one (called once on the sharded model), else each module's
              `reset_parameters()` per module. A factory that loads its own weights opts out
              with `factory.fp8launch_meta_init = False` (see OPT_OUT).

torch is imported only when a model is built, so `models.config` (sizes, parameter counts)
stays importable by planning code.
"""

from __future__ import annotations

import typing

from launcher.errors import InputError
from launcher.train.factory import load_factory

if typing.TYPE_CHECKING:
    from torch import nn

KEY = "train.model"
KINDS = ("builtin:", "hf:", "py:")
OPT_OUT = "fp8launch_meta_init"
"""A py: factory with this attribute set to False is called as it is (on the CPU, whole on every
rank), and its weights are kept: for factories that load their own weights. Costs one full copy
of the model in host memory per process before sharding (what meta-device init avoids)."""


def build_for_run(spec: str, spec_dir: str):
    """(model, initializer) for the training entrypoint: the model on the meta device and the
    launcher.train.materialize Initializer that sets its weights later, or (model, None) for a
    model built with its weights (a py: factory that opted out)."""
    import torch

    from . import materialize_rules as rules

    if spec.startswith("builtin:"):
        with torch.device("meta"):
            model = _build_builtin(spec)
        return model, model.init_module
    if spec.startswith("hf:"):
        from .hf import build_hf, locate

        model = build_hf(spec[3:], spec_dir, meta=True)
        weights = locate(spec[3:], spec_dir)[2]
        if weights is None:
            return model, rules.hf_initializer(model)
        from .hf_weights import CheckpointInit, CheckpointReader

        return model, CheckpointInit(CheckpointReader(weights), model, fallback=rules.hf_initializer(model))
    if spec.startswith("py:"):
        from launcher.train.factory import import_factory

        factory = import_factory(spec, spec_dir, KEY)
        if getattr(factory, OPT_OUT, True) is False:
            return _checked_user_model(factory(), spec), None
        with torch.device("meta"):
            model = _checked_user_model(factory(), spec)
        return model, (rules.user_initializer(model) if rules.is_meta_model(model) else None)
    return build_model(spec, spec_dir), None


def build_model(spec: str, spec_dir: str) -> "nn.Module":
    """The model `spec` (plan.train.model) names. `spec_dir` is the spec's folder, where
    relative hf: paths and py: modules are also looked for (after the current directory)."""
    if spec.startswith("builtin:"):
        return _build_builtin(spec)
    if spec.startswith("hf:"):
        from .hf import build_hf

        return build_hf(spec[3:], spec_dir)
    if spec.startswith("py:"):
        return _checked_user_model(load_factory(spec, spec_dir, KEY), spec)
    raise InputError(KEY, f"'{spec}' starts with none of {', '.join(KINDS)}", "write builtin:NAME, hf:PATH or py:module:function")


def _build_builtin(spec: str) -> "nn.Module":
    """The Llama-style decoder, or the MoE decoder (launcher/train/models/moe.py) for an MoE shape."""
    from launcher.planning.models import is_moe, parse_builtin

    if is_moe(parse_builtin(spec)):
        from .moe import build_moe

        return build_moe(spec)
    from .llama import build_llama

    return build_llama(spec)


def _checked_user_model(model, spec: str) -> "nn.Module":
    from torch import nn

    if not isinstance(model, nn.Module):
        raise InputError(
            KEY, f"factory {spec} returned a {type(model).__name__}, not a torch.nn.Module",
            "return the model (an nn.Module) from the factory",
        )
    vocab = getattr(model, "vocab_size", None)
    if vocab is None:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        if vocab is None:
            raise InputError(
                KEY,
                f"the model from {spec} has neither `vocab_size` nor `config.vocab_size`",
                "set model.vocab_size = <vocabulary size> in the factory",
            )
        model.vocab_size = int(vocab)
    if not isinstance(model.vocab_size, int) or isinstance(model.vocab_size, bool) or model.vocab_size < 1:
        raise InputError(KEY, f"the model from {spec} has vocab_size {model.vocab_size!r}", "make vocab_size a positive int")
    return model


def logits_of(output):
    """The logits tensor of a model's output: the output itself, or its `.logits` (Hugging Face)."""
    logits = getattr(output, "logits", None)
    return output if logits is None else logits


def edge_units(model: "nn.Module", *, stage: bool = False) -> tuple["nn.Module | None", list["nn.Module"]]:
    """(the token embedding, [the final norm, the output head]) that FSDP2 shards as units of their
    own (torchtitan), so that neither is gathered for the whole step with the root. builtin:
    tok_embeddings, norm, output; Hugging Face models: get_input_embeddings(), their base model's
    `norm`, get_output_embeddings(). (None, []) for a model that names neither, or that ties the
    embedding to the head (a shared parameter lives in one unit: the root's). A pipeline stage of the builtin decoder
    (`stage`: launcher/train/parallel/pipeline.py cut it) gives what it holds of the two."""
    from torch import nn

    embedding, head = getattr(model, "tok_embeddings", None), [getattr(model, "norm", None), getattr(model, "output", None)]
    if not isinstance(embedding, nn.Module) and callable(getattr(model, "get_input_embeddings", None)):
        try:
            embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
        except (NotImplementedError, AttributeError):
            return None, []
        base = getattr(model, getattr(model, "base_model_prefix", "") or "", None)
        head = [getattr(base, "norm", None), output]
    head = [m for m in head if isinstance(m, nn.Module) and any(True for _ in m.parameters())]
    if stage:  # a stage holds the embedding, the head, one of them or neither
        return (embedding if isinstance(embedding, nn.Module) else None), head
    if not isinstance(embedding, nn.Module) or not head:
        return None, []
    if {id(q) for q in embedding.parameters()} & {id(q) for m in head for q in m.parameters()}:
        return None, []
    return embedding, head


def transformer_blocks(model: "nn.Module") -> list["nn.Module"]:
    """The repeated blocks to shard, compile or checkpoint one by one, in order.

    builtin: `model.layers`; Hugging Face models: `model.model.layers` (their base model's
    `layers`) or else the first ModuleList of same-class blocks; any other model:
    `model.layers` when it is a ModuleList, Sequential or ModuleDict, else [].
    """
    from torch import nn

    from .hf import hf_blocks

    layers = getattr(model, "layers", None)
    if isinstance(layers, (nn.ModuleList, nn.Sequential)):
        return list(layers)
    if isinstance(layers, nn.ModuleDict):
        return list(layers.values())
    if hasattr(model, "base_model_prefix") and hasattr(model, "config"):
        return hf_blocks(model)
    return []
