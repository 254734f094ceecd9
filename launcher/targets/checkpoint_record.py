"""What a checkpoint holds, recorded when it is completed, and the check of it before anything reads it.

COMPLETE.json's "files": every file under the checkpoint folder but COMPLETE.json itself, by its path
relative to the folder ("/"-separated), with its size and a CRC-32 of its bytes:

    "files": {"model/__0_0.distcp": {"bytes": 52488, "crc32": "8e1f02a7"}, "rank-00000.pt": {...}, ...}

A checkpoint is intact when every recorded file is there with its recorded size and checksum. Files
added to the folder later are not looked at. A checkpoint written before checkpoints recorded their
files has no "files": nothing to check it against (`Candidate.unchecked`).

Who hashes what (launcher/train/checkpoint's CheckpointManager runs the collectives):
- at a save, each rank the files it wrote (`owner`: DCP's `__R_N.distcp`, the rank files, DeepSpeed's
  `zero_pp_rank_R_*`), read back from its page cache; rank 0 also the files whose writer the name does
  not tell (DCP's `.metadata`, DeepSpeed's model states and scripts) and any nobody reported;
- at a resume, each rank a share of the files balanced by bytes (`share`), and every rank decides from
  what all of them found, so all take the same checkpoint;
- `fp8launch export`, its one process, the files the weights are read from (`weights_part`).

CRC-32 (zlib's, in the standard library) because a checkpoint guards against torn and flipped bytes,
not against an adversary, and it is the fastest checksum the standard library has:
benchmarks/checkpoint_record.py measures it against SHA-256, BLAKE2b and Adler-32.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MARKER = "COMPLETE.json"
"""Written last into a checkpoint; a folder without it is not a checkpoint."""
CHECKSUM = "crc32"
"""The checksum a save records (the key beside "bytes" in each file's entry)."""
STEP_DIR = re.compile(r"^step-(\d+)$")
_CHUNK = 4 << 20
"""Bytes read at a time: the per-call cost vanishes, the memory stays small whatever the file."""
_OWNED = re.compile(r"^(?:__(\d+)_\d+\.distcp|rank-(\d+)\.pt|(?:bf16_)?zero_pp_rank_(\d+)_.*)$")
"""File names that say which rank wrote them (DCP's data files, the rank files, DeepSpeed's ZeRO partitions)."""


class _Crc:
    """hashlib's interface over a running zlib checksum."""

    def __init__(self, fn: Callable[[bytes, int], int], start: int):
        self._fn, self._value = fn, start

    def update(self, data) -> None:
        self._value = self._fn(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


ALGORITHMS: dict[str, Callable[[], object]] = {
    "crc32": lambda: _Crc(zlib.crc32, 0),
    "adler32": lambda: _Crc(zlib.adler32, 1),
    "sha256": hashlib.sha256,
    "blake2b": hashlib.blake2b,
}
"""Checksums a record may hold, by name; a save records CHECKSUM (the others are measured against it)."""


def digest(path: str, algorithm: str = CHECKSUM) -> tuple[int, str]:
    """(size in bytes, checksum) of the file at `path`, read once."""
    h = ALGORITHMS[algorithm]()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


# -- recording ---------------------------------------------------------------------------

def listing(folder: str) -> list[str]:
    """Every file under `folder` but the marker, as "/"-separated paths relative to it, sorted."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        rel = os.path.relpath(root, folder)
        for name in names:
            if rel == "." and name == MARKER:
                continue
            found.append(name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}")
    return sorted(found)


def owner(name: str, world_size: int) -> int | None:
    """The rank that wrote file `name` (a relative path), where its name tells; else None."""
    m = _OWNED.match(name.rsplit("/", 1)[-1])
    if m is None:
        return None
    rank = int(next(g for g in m.groups() if g is not None))
    return rank if rank < world_size else None


def owned(folder: str, rank: int, world_size: int) -> list[str]:
    """The files of `folder` this rank describes at a save: those it wrote; rank 0 also those of no known writer."""
    return [n for n in listing(folder) if owner(n, world_size) == rank or (rank == 0 and owner(n, world_size) is None)]


def describe(folder: str, names: Iterable[str], algorithm: str = CHECKSUM) -> dict[str, dict]:
    """{name: {"bytes": size, algorithm: checksum}} of files `names` (relative to `folder`)."""
    out = {}
    for name in names:
        size, value = digest(os.path.join(folder, name), algorithm)
        out[name] = {"bytes": size, algorithm: value}
    return out


def merge(folder: str, parts: Iterable[dict[str, dict]]) -> dict[str, dict]:
    """The ranks' descriptions as one record, sorted; files of `folder` nobody described are described here."""
    files: dict[str, dict] = {}
    for part in parts:
        files.update(part)
    missing = [n for n in listing(folder) if n not in files]
    files.update(describe(folder, missing))
    return dict(sorted(files.items()))


# -- checking ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Candidate:
    """A `step-N` folder of a checkpoints folder, as its marker describes it."""

    step: int
    path: str
    marker: dict | None
    """COMPLETE.json, or None where `problem` says why there is none to use."""
    problem: str | None = None

    @property
    def files(self) -> dict[str, dict] | None:
        """The record of its files; None for a checkpoint written before checkpoints recorded them."""
        return self.marker.get("files") if self.marker is not None else None

    @property
    def unchecked(self) -> bool:
        return self.marker is not None and self.files is None


def candidates(folder: str) -> list[Candidate]:
    """Every `step-N` folder in checkpoints folder `folder`, newest first, with its marker or what is wrong with it."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        m = STEP_DIR.match(name)
        path = os.path.join(folder, name)
        if m and os.path.isdir(path):
            found.append(candidate(path, int(m.group(1))))
    return sorted(found, key=lambda c: c.step, reverse=True)


def complete(folder: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint in checkpoints folder `folder` (a `step-N` folder whose COMPLETE.json
    names step N), oldest first; intact or not is `check`'s question. The launcher asks it too (the newest complete
    checkpoint a failure line names): this module imports nothing of torch."""
    return [(c.step, c.path) for c in reversed(candidates(folder)) if c.marker is not None]


def candidate(path: str, step: int | None = None) -> Candidate:
    """Checkpoint folder `path` (step `step`, else the marker's) as a Candidate."""
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except FileNotFoundError:
        return Candidate(step or 0, path, None, f"no {MARKER} (a save that did not finish, or a damaged checkpoint)")
    except (OSError, ValueError) as e:
        return Candidate(step or 0, path, None, f"{MARKER} is unreadable ({_first_line(e)})")
    saved = marker.get("step") if isinstance(marker, dict) else None
    if not isinstance(saved, int) or (step is not None and saved != step):
        return Candidate(step or 0, path, None, f"{MARKER} is not this checkpoint's (it says step {saved!r})")
    files = marker.get("files")
    if files is not None and not _well_formed(files):
        return Candidate(saved, path, None, f"{MARKER}'s record of the files is malformed")
    return Candidate(saved, path, marker)


def _well_formed(files) -> bool:
    return isinstance(files, dict) and all(
        isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("bytes"), int) and any(a in v for a in ALGORITHMS)
        for k, v in files.items())


def weights_part(marker: dict) -> str:
    """The sub-folder an export reads the weights from: DCP's model/, or DeepSpeed's deepspeed/ (its fp32
    weights are rebuilt from the optimizer partitions)."""
    return "deepspeed/" if marker.get("format") == "deepspeed" else "model/"


def share(files: dict[str, dict], rank: int, world_size: int) -> list[str]:
    """The files `rank` of `world_size` checks: the biggest first, each to the rank with the fewest bytes so far
    (the same split on every rank)."""
    load = [0] * world_size
    mine = []
    for name in sorted(files, key=lambda n: (-files[n]["bytes"], n)):
        r = load.index(min(load))
        load[r] += files[name]["bytes"]
        if r == rank:
            mine.append(name)
    return mine


def check(folder: str, files: dict[str, dict], names: Iterable[str] | None = None) -> list[str]:
    """What is wrong with files `names` (default: all) of checkpoint `folder` against their record, one line
    each, in name order; empty when they are intact. Sizes are compared before any byte is read."""
    problems = []
    for name in sorted(files if names is None else names):
        want = files[name]
        path = os.path.join(folder, name)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            problems.append(f"{name} is missing")
            continue
        except OSError as e:
            problems.append(f"{name} cannot be read ({_first_line(e)})")
            continue
        if size != want["bytes"]:
            problems.append(f"{name} is {size:,} bytes, the record says {want['bytes']:,}")
            continue
        algorithm = next(a for a in ALGORITHMS if a in want)
        try:
            size, value = digest(path, algorithm)
        except OSError as e:
            problems.append(f"{name} cannot be read ({_first_line(e)})")
            continue
        if size != want["bytes"] or value != want[algorithm]:
            problems.append(f"{name} does not match its checksum ({algorithm} {value}, the record says {want[algorithm]})")
    return problems


def summary(problems: list[str]) -> str:
    """Problems as one clause: the first, and how many more."""
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more file{'s' if more > 1 else ''})" if more else "")


# -- reading ----------------------------------------------------------------------------

class UnreadableFile(RuntimeError):
    """A file of a checkpoint that could not be read back while loading (torn, flipped, cut short). Its args are
    strings: DCP sends a rank's error to the others."""

    def __init__(self, name: str, detail: str):
        super().__init__(name, detail)
        self.name = name
        """The file, relative to the checkpoint folder."""
        self.detail = detail

    @classmethod
    def of(cls, name: str, error: BaseException) -> "UnreadableFile":
        text = str(error)
        if _WEIGHTS_ONLY in text:  # torch.load's weights-only refusal: the cause follows a paragraph on pickle safety
            text = text.split(_WEIGHTS_ONLY, 1)[1]
        line = next((part.strip() for part in text.splitlines() if part.strip()), "")[:300]
        return cls(name, f"{type(error).__name__}{': ' + line if line else ''}")

    def __str__(self) -> str:
        return f"{self.name} cannot be read ({self.detail})"


_WEIGHTS_ONLY = "WeightsUnpickler error:"


def unreadable_in(error: BaseException | None) -> UnreadableFile | None:
    """The UnreadableFile behind `error`: its causes, and the per-rank failures a DCP CheckpointException carries."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, UnreadableFile):
            return error
        for failure in (getattr(error, "failures", None) or {}).values():  # DCP: {rank: (exception, traceback)}
            found = unreadable_in(failure[0] if isinstance(failure, tuple) else failure)
            if found is not None:
                return found
        error = error.__cause__ or error.__context__
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
