"""Module and parameter names as the model defines them, whatever wrappers were applied since."""

from __future__ import annotations

WRAPPER_PARTS = frozenset({"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"})
"""Name parts that wrappers insert: activation checkpointing's checkpoint_wrapper, torch.compile's
OptimizedModule, FSDP1."""


def clean_fqn(fqn: str) -> str:
    """`layers.0._orig_mod.attention.wq` -> `layers.0.attention.wq`: the name precision.keep, precision.rules,
    the precision report and checkpoints use."""
    return ".".join(part for part in fqn.split(".") if part not in WRAPPER_PARTS)
