"""The token stream a plan names (`train.data`), one per rank, resumable to the exact batch.

    synthetic             a learnable random stream (a fixed cyclic pattern plus noise)
    text:PATH             a local UTF-8 text file: the ids of train.tokenizer when set, else of
                          a tokenizer.json lying in the same folder, else bytes as tokens 0..255
    tokens:PATH           pre-tokenized ids, memory-mapped: .npy (any integer dtype),
                          .bin / .u16.bin (raw uint16), .u32.bin (raw uint32)
    megatron:PREFIX[?eos=ID|none]
                          a Megatron-Core indexed dataset (PREFIX.bin + PREFIX.idx), memory-mapped;
                          documents joined by ?eos=ID, else train.tokenizer's EOS (none: as they are)
    hf-dataset:PATH[?column=text]
                          a local Hugging Face dataset (a save_to_disk folder, or a .parquet / .jsonl /
                          .json / .arrow file), its column tokenized by train.tokenizer, documents
                          joined by the tokenizer's EOS (formats.py reads these two)
    py:module:function    a user factory returning an iterable of int64 (batch, seq + 1)

Every stream yields int64 tensors of shape (micro_batch_size, seq_len + 1) forever;
inputs are `[:, :-1]`, targets `[:, 1:]`. `state_dict()` records the position, and
`load_state_dict()` on a freshly built stream with the same plan makes it yield exactly
the batches the saved one would have yielded next.

Files (text, tokens, megatron, hf-dataset) are cut into windows of seq_len + 1 tokens that overlap by one
(window i starts at token i * seq_len). Each epoch shuffles the windows with the seed (the
same order on every rank), and rank r takes windows r, r + world_size, r + 2 * world_size,
... of that order: ranks never share a window within an epoch, and every rank gets the same
number of windows per epoch (the remainder of n_windows / world_size is skipped that epoch).
For the built-in kinds the state holds no rank, so every rank's state is the same.
eval.data takes the same forms: `build_data(key="eval.data")` names that key in its errors.
"""

from __future__ import annotations

import abc
import os

import numpy as np
import torch

from launcher.errors import InputError
from launcher.train.data.formats import JoinedCorpus, hf_dataset_corpus, megatron_corpus
from launcher.train.data.tokenizer import beside_text, load_tokenizer
from launcher.train.factory import load_factory, resolve_path

KEY = "train.data"
FULL_SCAN_LIMIT = 1 << 26
"""Corpora up to this many tokens are checked against the vocabulary when opened; larger ones batch by batch."""


class TokenStream(abc.ABC):
    """An endless iterator of int64 (micro_batch_size, seq_len + 1) batches for one rank."""

    kind: str = ""

    def __iter__(self) -> "TokenStream":
        return self

    @abc.abstractmethod
    def __next__(self) -> torch.Tensor: ...

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """The position (and what it depends on), as plain JSON-compatible values."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`, which a stream built from the same plan saved."""

    def _check_same(self, state: dict, fingerprint: dict) -> None:
        saved = {k: state.get(k) for k in fingerprint}
        if saved != fingerprint:
            diff = ", ".join(f"{k}: saved {saved[k]!r}, now {fingerprint[k]!r}" for k in fingerprint if saved[k] != fingerprint[k])
            raise InputError(
                "train.resume",
                f"the checkpoint's data position does not fit this run's data stream ({diff})",
                "resume with the same train.data, train.tokenizer, train.seq_len, train.micro_batch_size, train.seed and world size, "
                "or start a fresh run in a new train.output_dir",
            )


def check_vocab(batch: np.ndarray | torch.Tensor, vocab_size: int, source: str, key: str = KEY) -> None:
    """Raise naming `key` (train.data) and train.model when a token id falls outside [0, vocab_size)."""
    hi, lo = int(batch.max()), int(batch.min())
    if lo < 0:
        raise InputError(key, f"{source} holds the negative token id {lo}", "token ids must be >= 0; re-tokenize the data")
    if hi >= vocab_size:
        raise InputError(
            key,
            f"{source} holds token id {hi}, but the model (train.model) has only {vocab_size} ids",
            f"use a model whose vocabulary has at least {hi + 1} ids (builtin models take ?vocab=N), "
            "or data tokenized for this model",
        )


class SyntheticStream(TokenStream):
    """Seeded random tokens that a model can learn in a few dozen steps.

    A fixed pattern of PATTERN_LEN distinct token ids (drawn with `seed`, the same on every
    rank) repeats cyclically; each row starts at a random point of the cycle and each token
    is replaced by a uniformly random id with probability NOISE. So the next token is
    (mostly) a function of the current one: the loss falls from ln(vocab) towards the noise
    floor. Batch i of rank r is drawn from a generator seeded with (seed, r, i), so
    resuming needs only the batch count.
    """

    kind = "synthetic"
    PATTERN_LEN = 256
    NOISE = 0.1

    def __init__(self, *, seq_len: int, micro_batch_size: int, vocab_size: int, rank: int, seed: int):
        self.seq_len, self.micro_batch_size, self.vocab_size = seq_len, micro_batch_size, vocab_size
        self.rank, self.seed = rank, seed % (1 << 64)
        length = min(vocab_size, self.PATTERN_LEN)
        self.pattern = np.random.default_rng([self.seed, 0x5EED]).permutation(vocab_size)[:length]
        self.batches = 0

    def __next__(self) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, self.rank, self.batches])
        shape = (self.micro_batch_size, self.seq_len + 1)
        starts = rng.integers(0, len(self.pattern), size=(shape[0], 1))
        tokens = self.pattern[(starts + np.arange(shape[1])) % len(self.pattern)]
        noisy = rng.random(shape) < self.NOISE
        tokens = np.where(noisy, rng.integers(0, self.vocab_size, size=shape), tokens)
        self.batches += 1
        return torch.from_numpy(tokens.astype(np.int64))

    def _fingerprint(self) -> dict:
        return {
            "kind": self.kind, "seq_len": self.seq_len, "micro_batch_size": self.micro_batch_size,
            "vocab_size": self.vocab_size, "seed": self.seed,
        }

    def state_dict(self) -> dict:
        return {**self._fingerprint(), "batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self._check_same(state, self._fingerprint())
        self.batches = int(state["batches"])


class WindowStream(TokenStream):
    """Shuffled, rank-disjoint windows of seq_len + 1 tokens over a 1-D corpus (see the module doc).

    The corpus is an array, or anything with len(), contiguous slices, min() and max() (a JoinedCorpus);
    `identity` adds what else identifies it (the EOS, the documents, ...) to the resume fingerprint.
    """

    def __init__(
        self, corpus: np.ndarray | JoinedCorpus, *, kind: str, source: str, seq_len: int, micro_batch_size: int,
        vocab_size: int, rank: int, world_size: int, seed: int, key: str = KEY, identity: dict | None = None,
    ):
        self.corpus, self.kind, self.source, self.key = corpus, kind, source, key
        self.identity = dict(identity or {})
        self.seq_len, self.micro_batch_size, self.vocab_size = seq_len, micro_batch_size, vocab_size
        self.rank, self.world_size, self.seed = rank, world_size, seed % (1 << 64)
        self.n_windows = max(len(corpus) - 1, 0) // seq_len
        self.per_rank = self.n_windows // world_size
        if self.per_rank < 1:
            raise InputError(
                key,
                f"{source} has {len(corpus)} tokens: {self.n_windows} windows of seq_len + 1 = {seq_len + 1} tokens, "
                f"fewer than the {world_size} ranks need (one each at least)",
                "use more data, or lower train.seq_len",
            )
        if len(corpus) <= FULL_SCAN_LIMIT:
            check_vocab(corpus, vocab_size, source, key)
        self.windows = 0
        """Windows this rank has taken so far, over all epochs."""
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def _window(self, count: int) -> np.ndarray:
        epoch, j = divmod(count, self.per_rank)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
        start = int(self._order[self.rank + j * self.world_size]) * self.seq_len
        return self.corpus[start : start + self.seq_len + 1]

    def __next__(self) -> torch.Tensor:
        batch = np.stack([self._window(self.windows + i) for i in range(self.micro_batch_size)]).astype(np.int64)
        self.windows += self.micro_batch_size
        if len(self.corpus) > FULL_SCAN_LIMIT:
            check_vocab(batch, self.vocab_size, self.source, self.key)
        return torch.from_numpy(batch)

    def _fingerprint(self) -> dict:
        return {
            "kind": self.kind, "tokens": len(self.corpus), "seq_len": self.seq_len,
            "world_size": self.world_size, "seed": self.seed, **self.identity,
        }

    def state_dict(self) -> dict:
        return {**self._fingerprint(), "windows": self.windows}

    def load_state_dict(self, state: dict) -> None:
        self._check_same(state, self._fingerprint())
        self.windows = int(state["windows"])


class FactoryStream(TokenStream):
    """A user factory's iterable, checked batch by batch and re-iterated when it ends.

    Resuming: an iterable with state_dict()/load_state_dict() of its own (torchdata's
    StatefulDataLoader, say) is resumed by those; any other is replayed from its start,
    skipping the batches already taken (exact when the factory is deterministic).
    """

    kind = "py"

    def __init__(self, iterable, *, ref: str, seq_len: int, micro_batch_size: int, vocab_size: int, key: str = KEY):
        self.key = key
        try:
            self._it = iter(iterable)
        except TypeError:
            raise InputError(
                key, f"factory {ref} returned a {type(iterable).__name__}, which is not iterable",
                "return an iterable of int64 (batch, seq_len + 1) tensors",
            ) from None
        self.iterable, self.ref = iterable, ref
        self.shape = (micro_batch_size, seq_len + 1)
        self.vocab_size = vocab_size
        self.batches = 0

    @property
    def _one_shot(self) -> bool:
        return self._it is self.iterable

    def _next_raw(self):
        for restarted in (False, True):
            try:
                return next(self._it)
            except StopIteration:
                if self._one_shot or restarted or self.batches == 0:
                    raise InputError(
                        self.key,
                        f"the iterable from {self.ref} ended after {self.batches} batches",
                        "return something that can be iterated again (a list, a DataLoader) or an endless generator",
                    ) from None
                self._it = iter(self.iterable)

    def __next__(self) -> torch.Tensor:
        raw = self._next_raw()
        try:
            batch = raw if isinstance(raw, torch.Tensor) else torch.as_tensor(np.asarray(raw))
        except (TypeError, ValueError, RuntimeError):
            raise InputError(self.key, f"{self.ref} yielded a {type(raw).__name__}, not a tensor of token ids",
                             "yield int64 tensors") from None
        if batch.is_floating_point() or batch.is_complex() or batch.dtype == torch.bool:
            raise InputError(self.key, f"{self.ref} yielded a {batch.dtype} tensor", "yield integer token ids (int64)")
        if tuple(batch.shape) != self.shape:
            raise InputError(
                self.key,
                f"{self.ref} yielded a batch of shape {tuple(batch.shape)}; this run needs "
                f"(train.micro_batch_size, train.seq_len + 1) = {self.shape}",
                "yield batches of that shape, or change train.micro_batch_size / train.seq_len",
            )
        check_vocab(batch, self.vocab_size, self.ref, self.key)
        self.batches += 1
        return batch.to(torch.int64)

    def state_dict(self) -> dict:
        state = {"kind": self.kind, "ref": self.ref, "batches": self.batches}
        if hasattr(self.iterable, "state_dict"):
            state["inner"] = self.iterable.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self._check_same(state, {"kind": self.kind, "ref": self.ref})
        if "inner" in state and hasattr(self.iterable, "load_state_dict"):
            self.iterable.load_state_dict(state["inner"])
            self._it, self.batches = iter(self.iterable), int(state["batches"])
            return
        if self._one_shot and self.batches:
            raise InputError(
                "train.resume", f"the iterator from {self.ref} cannot be rewound to replay it", "resume into a freshly built stream"
            )
        if not self._one_shot:
            self._it, self.batches = iter(self.iterable), 0
        for _ in range(int(state["batches"]) - self.batches):
            next(self)


def _text_corpus(path: str, vocab_size: int, *, tokenizer: str, spec_dir: str, key: str) -> tuple[np.ndarray, str]:
    """A text file as token ids: train.tokenizer decides, else a tokenizer.json beside it, else its bytes do."""
    beside = beside_text(path)
    if tokenizer or beside:
        tok = load_tokenizer(tokenizer, spec_dir) if tokenizer else load_tokenizer(beside, spec_dir, key=key)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise InputError(key, f"text file {path} is not valid UTF-8 ({e})", "convert it to UTF-8") from e
        ids = tok.tokenizer.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=np.int64), f"text:{path} (tokenized by {tok.file})"
    if vocab_size < 256:
        raise InputError(
            key,
            f"text:{path} is read as bytes (ids 0..255: no train.tokenizer, no tokenizer.json beside it), "
            f"but the model (train.model) has only {vocab_size} ids",
            "use a model with vocab_size >= 256, or set train.tokenizer to the model's tokenizer.json",
        )
    return np.memmap(path, dtype=np.uint8, mode="r"), f"text:{path} (bytes)"


def _token_corpus(path: str, key: str) -> np.ndarray:
    """A memory-mapped 1-D array of the ids in a .npy, .bin/.u16.bin (uint16) or .u32.bin (uint32) file."""
    name = os.path.basename(path).lower()
    if name.endswith(".npy"):
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise InputError(key, f"cannot read {path} as a .npy array ({e})", "save the ids with numpy.save(path, ids)") from e
        if not np.issubdtype(array.dtype, np.integer):
            raise InputError(
                key, f"{path} holds {array.dtype} values, not integer token ids", "save integer ids (e.g. ids.astype(numpy.uint32))"
            )
        return array.reshape(-1)
    if name.endswith(".bin"):
        dtype = np.dtype(np.uint32 if name.endswith(".u32.bin") else np.uint16)
        size = os.path.getsize(path)
        if size % dtype.itemsize:
            raise InputError(
                key, f"{path} has {size} bytes, not a whole number of {dtype} ids",
                "write raw uint16 ids to NAME.bin, or uint32 ids to NAME.u32.bin",
            )
        return np.memmap(path, dtype=dtype, mode="r")
    raise InputError(
        key, f"cannot tell the format of {path} from its name", "name it *.npy, *.bin or *.u16.bin (raw uint16), or *.u32.bin (raw uint32)"
    )


def build_data(
    spec: str, *, seq_len: int, micro_batch_size: int, vocab_size: int, rank: int, world_size: int, seed: int, spec_dir: str,
    tokenizer: str = "", key: str = KEY,
) -> TokenStream:
    """The stream of rank `rank` (of `world_size`) for `spec` (plan.train.data, or plan.eval.data with
    key="eval.data": the key its errors name); `tokenizer` is plan.train.tokenizer ("" = none)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if spec == "synthetic":
        return SyntheticStream(seq_len=seq_len, micro_batch_size=micro_batch_size, vocab_size=vocab_size, rank=rank, seed=seed)
    if spec.startswith("py:"):
        iterable = load_factory(spec, spec_dir, key)
        return FactoryStream(iterable, ref=spec, seq_len=seq_len, micro_batch_size=micro_batch_size, vocab_size=vocab_size, key=key)
    kind, _, raw_path = spec.partition(":")
    windows = dict(seq_len=seq_len, micro_batch_size=micro_batch_size, vocab_size=vocab_size, rank=rank,
                   world_size=world_size, seed=seed, key=key)
    if kind in ("megatron", "hf-dataset") and raw_path:
        read = megatron_corpus if kind == "megatron" else hf_dataset_corpus
        corpus, source, identity = read(raw_path, spec_dir=spec_dir, key=key, tokenizer=tokenizer)
        if identity["eos"] is not None:  # checked now: a corpus too large to scan is checked batch by batch
            check_vocab(np.array([identity["eos"]]), vocab_size, f"{source}: its EOS", key)
        return WindowStream(corpus, kind=kind, source=source, identity=identity, **windows)
    if kind not in ("text", "tokens") or not raw_path:
        raise InputError(key, f"'{spec}' is not a data source",
                         "write synthetic, text:PATH, tokens:PATH, megatron:PREFIX, hf-dataset:PATH or py:module:function")
    path = resolve_path(raw_path, spec_dir, key)
    if not os.path.isfile(path):
        raise InputError(key, f"{path} is not a file", f"point {kind}: at a file")
    if os.path.getsize(path) == 0:
        raise InputError(key, f"{path} is empty", f"point {kind}: at a file with data in it")
    if kind == "text":
        corpus, source = _text_corpus(path, vocab_size, tokenizer=tokenizer, spec_dir=spec_dir, key=key)
    else:
        corpus, source = _token_corpus(path, key), f"tokens:{path}"
    return WindowStream(corpus, kind=kind, source=source, **windows)
