"""The batch of an imported spec: train.micro_batch_size, train.grad_accum_steps and, where the source fixes a
global batch, distributed.global_batch_size, so that a change of the world size keeps it or is refused
(rule BATCH-MISMATCH: micro x accum x data-parallel ranks must equal it).

The accumulation follows from the data-parallel ranks the spec ends with (planning may change tensor_parallel),
so Draft.finish() asks entries() again at each planning round and replaces the entries tagged "batch".
"""

from __future__ import annotations

from dataclasses import dataclass

from .report import APPROXIMATED, MAPPED, Entry

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
    """The source's ranks that split a sequence or the layers (context / pipeline parallel) where the spec does not (a
    rule refuses it beside the rest of the spec, or the source's kind has no mapping for it): data-parallel ranks here.
    A batch the source does not fix grows with them."""
    split_what: str = ""
    """Those ranks in the source's words, e.g. "context_parallel_size 8"."""


def entries(b: Batch, *, micro: int | None, ranks: int, placeholder: bool) -> list[Entry]:
    """The batch's entries (tag "batch") for `ranks` data-parallel ranks (`placeholder`: of a placeholder world size); each
    entry's `sets` are the spec keys to write. `micro`: the spec's micro batch where the source gives none."""
    out: list[Entry] = []
    micro = b.micro or micro or 1
    if b.micro is not None:
        out.append(_entry(MAPPED, b.micro_source, b.micro, [("train.micro_batch_size", b.micro)]))
    where = f"{ranks} data-parallel ranks" + (" of the placeholder world size" if placeholder else "")
    if b.global_ is not None:
        out.append(_fixed(b, micro, ranks, where))
    elif b.accum is not None or b.split > 1:
        out.append(_follows(b, micro, ranks, where))
    return out


def hint(b: Batch, micro: int | None) -> str:
    """What the world-size placeholder's comment adds where the source fixes the global batch ('' where it does not)."""
    if b.global_ is None:
        return ""
    return (f"then set train.grad_accum_steps = {b.global_} / (micro_batch_size {b.micro or micro or 1} x data-parallel ranks): "
            "distributed.global_batch_size keeps the source's batch")


def _entry(status: str, source: str, value, sets: list, note: str = "", before: str = "", after: str = "") -> Entry:
    return Entry(source=source or "(batch)", status=status, value=value, sets=sets, note=note, before=before, after=after, tag=TAG)


def _fixed(b: Batch, micro: int, ranks: int, where: str) -> Entry:
    """A global batch the source fixes: grad_accum_steps from it, and distributed.global_batch_size."""
    g = b.global_
    sources = ", ".join(s for s in (b.global_source, b.accum_source) if s)
    if g < 1:  # DeepSpeed asserts train_batch_size > 0 too
        raise ValueError(f"{sources or 'the global batch'}: {g} sequences per step; a batch is at least 1")
    value = g if not b.accum_source else [g, b.accum]
    accum, rest = divmod(g, micro * ranks)
    split = f"; the source's {b.split_what} ranks are data-parallel ranks here" if b.split > 1 else ""
    if not rest and accum >= 1:
        sets = [("train.grad_accum_steps", accum), ("distributed.global_batch_size", g)]
        note = (f"{g} sequences per step = micro_batch_size {micro} x grad_accum_steps {accum} x {where}; "
                f"distributed.global_batch_size keeps it when the world size changes (rule BATCH-MISMATCH){split}")
        return _entry(MAPPED, sources, value, sets, note=note)
    accum = max(1, round(g / (micro * ranks)))
    got = micro * accum * ranks
    sets = [("train.grad_accum_steps", accum), ("distributed.global_batch_size", got)]
    return _entry(APPROXIMATED, sources, value, sets, before=f"{g} sequences per step",
                  after=f"{got} sequences per step (micro_batch_size {micro} x grad_accum_steps {accum} x {where})",
                  note=f"{g} is not a multiple of micro_batch_size x ranks: {got / g:.3g}x the sequences per optimizer step{split}")


def _follows(b: Batch, micro: int, ranks: int, where: str) -> Entry:
    """A batch of micro x accum per data-parallel rank: it follows the world size, as in the source; the source's
    context / pipeline parallel ranks, data-parallel here, make it larger unless the accumulation can shrink."""
    accum = b.accum or 1
    source = b.accum_source or b.micro_source
    if b.split <= 1:
        return _entry(MAPPED, b.accum_source, b.accum, [("train.grad_accum_steps", accum)])
    theirs = micro * accum * ranks // b.split
    if accum % b.split == 0:
        return _entry(MAPPED, source, accum, [("train.grad_accum_steps", accum // b.split)],
                      note=f"{theirs} sequences per step in both: the source's {b.split_what} ranks are data-parallel ranks "
                           f"here, so grad_accum_steps {accum} / {b.split} keeps the global batch")
    ours = micro * accum * ranks
    return _entry(APPROXIMATED, source, accum, [("train.grad_accum_steps", accum)],
                  before=f"{_seqs(theirs)} per step (micro_batch_size {micro} x grad_accum_steps {accum} x {ranks} / {b.split} "
                         f"data-parallel ranks: {b.split_what})",
                  after=f"{_seqs(ours)} per step (micro_batch_size {micro} x grad_accum_steps {accum} x {where})",
                  note=f"{b.split}x the sequences per optimizer step: the spec does not split the sequences or layers over "
                       f"those ranks ({b.split_what}), every rank trains on whole sequences of its own; lower the lr or "
                       "micro_batch_size to compensate")


def _seqs(n: int) -> str:
    return f"{n} sequence" + ("" if n == 1 else "s")
