"""The batch of an imported spec: train.micro_batch_size, train.grad_accum_steps and, where the source fixes a
global batch, distributed.global_batch_size, so that a change of the world size keeps it or is refused
(rule BATCH-MISMATCH: micro x accum x data-parallel ranks must equal it).

The accumulation follows from the data-parallel ranks the spec ends with (planning may change tensor_parallel),
so the entries are made again at each planning round (tag "batch").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .report import APPROXIMATED, MAPPED, Entry

if TYPE_CHECKING:
    from .draft import Draft

TAG = "batch"


@dataclass(slots=True)
class Batch:
    """What the source says about its batch."""

    micro: int | None = None
    micro_source: str = ""
    accum: int | None = None
    accum_source: str = ""
    global_: int | None = None
    """Sequences per optimizer step, where the source fixes them (DeepSpeed train_batch_size, Megatron and torchtitan
    global_batch_size): the spec keeps them, whatever the world size."""
    global_source: str = ""
    split: int = 1
    """The source's ranks that split a sequence or the layers (context / pipeline parallel): fp8launch has neither, so
    they are data-parallel ranks here. A batch the source does not fix grows with them."""
    split_what: str = ""
    """Those ranks in the source's words, e.g. "context_parallel_size 8"."""


def finish(d: Draft) -> None:
    """Make the batch entries again for the spec as it stands, where the source read its batch (Draft.batch_at)."""
    d.report.entries = [e for e in d.report.entries if e.tag != TAG]
    at = len(d.report.entries) if d.batch_at is None else min(d.batch_at, len(d.report.entries))
    before, after = d.report.entries[:at], d.report.entries[at:]
    d.report.entries = before
    try:
        _entries(d)
    finally:
        d.report.entries += after


def _add(d: Draft, status: str, source: str, value, sets: list, note: str = "", before: str = "", after: str = "") -> None:
    for key, v in sets:
        d.set(key, v)
    d.report.add(Entry(source=source or "(batch)", status=status, value=value, sets=sets, note=note, before=before, after=after, tag=TAG))


def _entries(d: Draft) -> None:
    b = d.batch
    micro = b.micro or d.value("train.micro_batch_size") or 1
    if b.micro is not None:
        _add(d, MAPPED, b.micro_source, b.micro, [("train.micro_batch_size", b.micro)])
    dist = d.spec.get("distributed", {})
    world = dist.get("nodes", 1) * dist.get("procs_per_node", 8)
    tp = max(1, dist.get("tensor_parallel", 1))
    ranks = max(1, world // tp)
    where = f"{ranks} data-parallel ranks" + (" of the placeholder world size" if "distributed.procs_per_node" in d.placeholders else "")
    if b.global_ is not None:
        _fixed(d, b, micro, ranks, where)
    elif b.accum is not None or b.split > 1:
        _follows(d, b, micro, ranks, where)


def _fixed(d: Draft, b: Batch, micro: int, ranks: int, where: str) -> None:
    """A global batch the source fixes: grad_accum_steps from it, and distributed.global_batch_size."""
    g = b.global_
    sources = ", ".join(s for s in (b.global_source, b.accum_source) if s)
    value = g if not b.accum_source else [g, b.accum]
    accum, rest = divmod(g, micro * ranks)
    split = f"; the source's {b.split_what} ranks are data-parallel ranks here" if b.split > 1 else ""
    if not rest and accum >= 1:
        sets = [("train.grad_accum_steps", accum), ("distributed.global_batch_size", g)]
        note = (f"{g} sequences per step = micro_batch_size {micro} x grad_accum_steps {accum} x {where}; "
                f"distributed.global_batch_size keeps it when the world size changes (rule BATCH-MISMATCH){split}")
        _add(d, MAPPED, sources, value, sets, note=note)
        _hint(d, g, micro)
        return
    accum = max(1, round(g / (micro * ranks)))
    got = micro * accum * ranks
    sets = [("train.grad_accum_steps", accum), ("distributed.global_batch_size", got)]
    _add(d, APPROXIMATED, sources, value, sets, before=f"{g} sequences per step",
         after=f"{got} sequences per step (micro_batch_size {micro} x grad_accum_steps {accum} x {where})",
         note=f"{g} is not a multiple of micro_batch_size x ranks: {got / g:.3g}x the sequences per optimizer step{split}")
    _hint(d, got, micro)


def _follows(d: Draft, b: Batch, micro: int, ranks: int, where: str) -> None:
    """A batch of micro x accum per data-parallel rank: it follows the world size, as in the source; the source's
    context / pipeline parallel ranks, data-parallel here, make it larger unless the accumulation can shrink."""
    accum = b.accum or 1
    source = b.accum_source or b.micro_source
    if b.split <= 1:
        _add(d, MAPPED, b.accum_source, b.accum, [("train.grad_accum_steps", accum)])
        return
    theirs = micro * accum * ranks // b.split
    if accum % b.split == 0:
        _add(d, MAPPED, source, accum, [("train.grad_accum_steps", accum // b.split)],
             note=f"{theirs} sequences per step in both: the source's {b.split_what} ranks are data-parallel ranks here, "
                  f"so grad_accum_steps {accum} / {b.split} keeps the global batch")
        return
    ours = micro * accum * ranks
    _add(d, APPROXIMATED, source, accum, [("train.grad_accum_steps", accum)],
         before=f"{_seqs(theirs)} per step (micro_batch_size {micro} x grad_accum_steps {accum} x {ranks} / {b.split} "
                f"data-parallel ranks: {b.split_what})",
         after=f"{_seqs(ours)} per step (micro_batch_size {micro} x grad_accum_steps {accum} x {where})",
         note=f"{b.split}x the sequences per optimizer step: fp8launch has no context / pipeline parallelism, every rank "
              "trains on whole sequences of its own; lower the lr or micro_batch_size to compensate")


def _hint(d: Draft, g: int, micro: int) -> None:
    """The world-size placeholder's comment says how to keep the global batch when it is filled in."""
    key = "distributed.procs_per_node"
    if key in d.placeholders and "global_batch_size" not in d.placeholders[key]:
        d.placeholders[key] += (f"; then set train.grad_accum_steps = {g} / (micro_batch_size {micro} x data-parallel ranks): "
                                "distributed.global_batch_size keeps the source's batch")


def _seqs(n: int) -> str:
    return f"{n} sequence" + ("" if n == 1 else "s")
