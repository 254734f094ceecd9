"""The DeepSpeed half of checkpoint.py: DeepSpeed saves and loads its own checkpoint, under clean
parameter names (no wrapper prefixes), like the DCP half's FQNs."""

from __future__ import annotations

from contextlib import contextmanager

_WRAPPER_NAMES = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
"""Module names that wrappers (torch.compile, checkpoint_wrapper, FSDP1) insert into parameter names."""


def clean_fqn(name: str) -> str:
    """A parameter name without the modules wrappers insert (`_orig_mod`, `_checkpoint_wrapped_module`,
    `_fsdp_wrapped_module`): the name the parameter has in the model as the user built it."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_NAMES)


# -- DeepSpeed ----------------------------------------------------------------------------

@contextmanager
def _clean_param_names(engine):
    """DeepSpeed names parameters in its checkpoint (and so in zero_to_fp32's output) by
    `module.named_parameters()`, wrappers included; give it the clean FQNs while it saves or loads."""
    names = getattr(engine, "param_names", None)
    clean = {p: clean_fqn(n) for p, n in names.items()} if isinstance(names, dict) else None
    if clean is None or len(set(clean.values())) != len(clean):
        yield
        return
    engine.param_names = clean
    try:
        yield
    finally:
        engine.param_names = names
