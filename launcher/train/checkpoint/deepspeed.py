"""The DeepSpeed half of checkpoint.py: DeepSpeed saves and loads its own checkpoint, under clean
parameter names (no wrapper prefixes), like the DCP half's FQNs."""

from __future__ import annotations

from contextlib import contextmanager

from launcher.train.fqn import clean_fqn

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
