"""The DeepSpeed half of checkpoint.py: DeepSpeed saves and loads its own checkpoint, under clean
parameter names (no wrapper prefixes), like the DCP half's FQNs."""

from __future__ import annotations

import os
import pickle
import zipfile
from contextlib import contextmanager

from launcher.targets.checkpoint_record import UnreadableFile
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


@contextmanager
def _naming_reads(engine, root: str):
    """DeepSpeed's reads of its checkpoint files while it loads: one that cannot be read (torn, flipped, cut
    short) raises UnreadableFile naming it (relative to checkpoint folder `root`). A missing file stays
    DeepSpeed's own FileNotFoundError: it looks for optional ones."""
    reads = getattr(engine, "checkpoint_engine", None)
    if reads is None or not callable(getattr(reads, "load", None)):
        yield
        return
    own = "load" in vars(reads)
    load = reads.load

    def naming_load(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except (EOFError, pickle.UnpicklingError, OSError, RuntimeError, zipfile.BadZipFile) as e:
            raise UnreadableFile.of(os.path.relpath(path, root).replace(os.sep, "/"), e) from e

    reads.load = naming_load
    try:
        yield
    finally:
        if own:
            reads.load = load
        else:
            del reads.load
