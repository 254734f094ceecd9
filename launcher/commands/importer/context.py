"""Context parallel's key / value exchange, as the sources name it: torch's rotate method (set_rotate_method), which
torchtitan's `context_parallel_rotate_method` and Accelerate's `cp_comm_strategy` choose. fp8launch runs torch's
default, "allgather" (torch 2.13 _context_parallel/_attention.py _ContextParallelOptions); no spec key chooses it."""

from __future__ import annotations

from .draft import Draft

DEFAULT = "allgather"


def rotate_method(d: Draft, key: str, method: str) -> None:
    """The source's rotate method at `key`: mapped where it is torch's default, else approximated to it."""
    if method == DEFAULT:
        d.mapped(key, note="torch's default rotation, which fp8launch runs: every rank all-gathers the key / value shards")
    else:
        d.approximated(key, before=f"key / value shards exchanged by {method} (torch's set_rotate_method)",
                       after='all-gathered ("allgather", torch\'s default: no spec key chooses the rotation)',
                       effect="the same attention; another collective, so the speed and memory differ")
