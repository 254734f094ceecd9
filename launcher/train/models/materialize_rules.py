"""Which rule initialises a model built on the meta device (launcher/train/materialize.py): a
Hugging Face model's own `_init_weights`, a user model's `init_weights()` or its modules'
`reset_parameters()`."""

from __future__ import annotations

from torch import nn

from launcher.train.materialize import WholeModelInit, is_meta, reset_parameters_initializer


def is_meta_model(model: nn.Module) -> bool:
    return is_meta(model)


def hf_initializer(model: nn.Module):
    """Per module: the model's `_init_weights` (transformers 5 also recomputes rotary buffers there)."""
    init = model._init_weights

    def initialize(name: str, module: nn.Module) -> None:
        init(module)

    return initialize


def user_initializer(model: nn.Module):
    """`model.init_weights()` once on the sharded model when it has one, else `reset_parameters()`
    per module."""
    if callable(getattr(model, "init_weights", None)):
        return WholeModelInit(model.init_weights)
    return reset_parameters_initializer
