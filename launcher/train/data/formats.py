"""Megatron-Core indexed datasets and local Hugging Face datasets as 1-D token corpora (for data.WindowStream).

    megatron:PREFIX[?eos=ID|none]   PREFIX.idx + PREFIX.bin, read by their on-disk format with numpy (no
                                    megatron import); the .bin is memory-mapped, never copied
    hf-dataset:PATH[?column=text&split=NAME]
                                    a folder Dataset.save_to_disk wrote; a folder of .parquet / .jsonl / .json /
                                    .arrow shards (a Hub download, or its data/ folder: ?split= picks that split's
                                    files, default train where they are split); or one such file; the column is
                                    tokenized by train.tokenizer in this process

Documents are laid end to end with one EOS id between consecutive ones (none after the last), so a window
may span documents. megatron:'s EOS is ?eos=ID, else train.tokenizer's EOS; ?eos=none joins them with
nothing (data preprocessed with --append-eod already ends each document with one). hf-dataset: uses
train.tokenizer's EOS, and joins with nothing when the tokenizer has none (launcher/train/data/tokenizer.py
says how the EOS is found). Texts are encoded without the tokenizer's special tokens (no BOS), as text: is.

The Megatron index (.idx), as megatron/core/datasets/indexed_dataset.py (_IndexWriter) writes it, all
little-endian: 9 bytes b"MMIDIDX\\x00\\x00"; version u64 = 1; dtype code u8 (DTYPES); sequence count N u64;
document-index count D u64; then int32 sequence_lengths[N], int64 sequence_pointers[N] (byte offsets into
the .bin), int64 document_indices[D] (0, then the sequence index where each document ends; D - 1
documents); a multimodal index adds int8 sequence_modes[N], which is refused here (nothing in the header
says so: the file's size does).

Cost: megatron: reads the index once per rank (a check of every sequence pointer, chunked; ~0.15 s per 10M
sequences) and pages in only the windows it takes. hf-dataset: loads the data through `datasets` (a
single file is converted into datasets' cache, HF_DATASETS_CACHE, once; later ranks and runs reuse it)
and then every rank tokenizes the whole column itself and holds its ids in memory (4 bytes a token):
deterministic, nothing shared between ranks, but each rank pays the tokenization (docs/data.md has
measured rates). For corpora of billions of tokens, tokenize once offline into megatron: or tokens:.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import struct

import numpy as np

from launcher.errors import BackendMissing, InputError
from launcher.planning.install import INSTALL
from launcher.planning.suggest import did_you_mean
from launcher.train.data.tokenizer import load_tokenizer
from launcher.train.factory import resolve_path

HEADER = b"MMIDIDX\x00\x00"
HEADER_BYTES = 34
"""Magic (9), version (8), dtype code (1), sequence count (8), document-index count (8)."""
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
"""Megatron-Core's DType codes (indexed_dataset.DType)."""
CHUNK = 1 << 22
"""Sequences checked per step of the pointer check (bounds its memory)."""
TOKENIZE_BATCH = 1024
"""Texts per encode_batch_fast call."""
HF_FILES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
"""File suffix -> the `datasets` packaged builder that reads it."""


class JoinedCorpus:
    """Documents stored back to back in `tokens`, read as one 1-D corpus with `sep` between consecutive ones.

    Nothing is copied: a slice [a:b] gathers its tokens and separators on demand. `ends` holds, for each
    document but the last, the offset in `tokens` where it ends. Holds what WindowStream needs of a corpus:
    len(), contiguous slices, min() and max().
    """

    def __init__(self, tokens: np.ndarray, ends: np.ndarray, sep: int):
        self.tokens, self.sep = tokens, int(sep)
        self._seps = np.asarray(ends, dtype=np.int64) + np.arange(len(ends), dtype=np.int64)
        """Where each separator sits in the joined corpus (increasing)."""

    def __len__(self) -> int:
        return len(self.tokens) + len(self._seps)

    def __getitem__(self, item: slice) -> np.ndarray:
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("a JoinedCorpus takes contiguous slices only")
        a, b, _ = item.indices(len(self))
        b = max(a, b)
        k0, k1 = (int(k) for k in np.searchsorted(self._seps, [a, b]))  # separators before a, before b
        is_sep = np.zeros(b - a, dtype=bool)
        is_sep[self._seps[k0:k1] - a] = True
        out = np.empty(b - a, dtype=np.int64)
        out[is_sep] = self.sep
        out[~is_sep] = self.tokens[a - k0 : b - k1]
        return out

    def max(self) -> int:
        return max(int(self.tokens.max()), self.sep) if len(self._seps) else int(self.tokens.max())

    def min(self) -> int:
        return min(int(self.tokens.min()), self.sep) if len(self._seps) else int(self.tokens.min())


def split_options(raw: str, defaults: dict[str, str], *, key: str, form: str) -> tuple[str, dict[str, str]]:
    """'PATH?a=1&b=2' -> ('PATH', {a: '1', b: '2'} over `defaults`), refusing names not in `defaults`."""
    path, sep, query = raw.rpartition("?") if "?" in raw else (raw, "", "")
    options = dict(defaults)
    for pair in query.split("&") if sep else ():
        name, eq, value = pair.partition("=")
        if name not in defaults or not eq:
            known = ", ".join(f"?{n}=" for n in defaults)
            raise InputError(key, f"'{pair}' in {form}:{raw} is not an option of {form}:{did_you_mean(name, list(defaults))}",
                             f"write {form}:PATH with the options {known}" if defaults else f"write {form}:PATH with no options")
        options[name] = value
    if not path:
        raise InputError(key, f"{form}:{raw} names no path", f"write {form}:PATH")
    return path, options


# --- megatron: ---------------------------------------------------------------------------------------------


def _find_prefix(prefix: str, spec_dir: str, key: str) -> str:
    """The prefix whose .idx exists: as given (absolute, or from the current directory), else in the spec's folder."""
    prefix = os.path.expanduser(prefix)
    candidates = [prefix] + ([os.path.join(spec_dir, prefix)] if not os.path.isabs(prefix) else [])
    for candidate in candidates:
        if os.path.isfile(candidate + ".idx"):
            if not os.path.isfile(candidate + ".bin"):
                raise InputError(key, f"{candidate}.idx exists but {candidate}.bin does not",
                                 "put the .bin that Megatron-Core wrote with this .idx beside it")
            return candidate
    tried = ", ".join(os.path.abspath(c) + ".idx" for c in candidates)
    stem, ext = os.path.splitext(prefix)
    fix = (f"name the prefix without its extension: megatron:{stem}" if ext in (".bin", ".idx")
           else "give the path prefix of a PREFIX.bin + PREFIX.idx pair "
                "(absolute, or relative to the current directory or the spec's folder)")
    raise InputError(key, f"megatron:{prefix} needs {prefix}.idx, which does not exist (tried {tried})", fix)


def _read_index(idx: str, key: str) -> tuple[np.dtype, np.ndarray, np.ndarray, int]:
    """(token dtype, document_indices, sequence_pointers, .bin bytes the index describes) of a checked .idx."""
    fix = "point megatron: at the prefix of a .bin/.idx pair Megatron-Core's IndexedDatasetBuilder (preprocess_data.py) wrote"
    size = os.path.getsize(idx)
    with open(idx, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[: len(HEADER)] != HEADER:
        raise InputError(key, f"{idx} is not a Megatron-Core index: it does not start with the bytes {HEADER!r}", fix)
    version, code, n, d = struct.unpack("<QBQQ", head[len(HEADER) :])
    if version != 1:
        raise InputError(key, f"{idx} is a version {version} Megatron-Core index; only version 1 is read", fix)
    if code not in DTYPES or np.issubdtype(DTYPES[code], np.floating):
        what = f"{np.dtype(DTYPES[code])} values" if code in DTYPES else f"the unknown dtype code {code}"
        raise InputError(key, f"{idx} holds {what}, not integer token ids", fix)
    dtype = np.dtype(DTYPES[code])
    expected = HEADER_BYTES + 12 * n + 8 * d
    if size == expected + n and n:
        raise InputError(key, f"{idx} is a multimodal Megatron-Core index (it holds sequence modes), which is not read",
                         "write a text-only dataset (IndexedDatasetBuilder without multimodal=True)")
    if size != expected or n == 0 or d < 2:
        raise InputError(key, f"{idx} has {size} bytes and {n} sequences in {max(d - 1, 0)} documents; "
                         f"its header needs {expected} bytes and at least one document", f"{fix} (this one is truncated or empty)")
    lengths = np.memmap(idx, dtype=np.int32, mode="r", offset=HEADER_BYTES, shape=(n,))
    pointers = np.memmap(idx, dtype=np.int64, mode="r", offset=HEADER_BYTES + 4 * n, shape=(n,))
    documents = np.asarray(np.memmap(idx, dtype=np.int64, mode="r", offset=HEADER_BYTES + 12 * n, shape=(d,)))
    if documents[0] != 0 or documents[-1] != n or (np.diff(documents) < 0).any():
        raise InputError(key, f"{idx}'s document indices do not run from 0 to its {n} sequences in order", fix)
    # Documents are read as one run of the .bin: every sequence must start where the one before it ends.
    at = 0
    for start in range(0, n, CHUNK):
        chunk = np.asarray(lengths[start : start + CHUNK], dtype=np.int64)
        if chunk.min() < 0:
            raise InputError(key, f"{idx} holds a negative sequence length", fix)
        starts = at + (np.cumsum(chunk) - chunk) * dtype.itemsize
        wrong = np.flatnonzero(pointers[start : start + CHUNK] != starts)
        if len(wrong):
            raise InputError(key, f"{idx}'s sequences are not stored back to back in the .bin "
                             f"(sequence {start + wrong[0]} does not start where the one before it ends)", fix)
        at = int(starts[-1] + chunk[-1] * dtype.itemsize)
    return dtype, documents, pointers, at


def _megatron_eos(option: str, tokenizer: str, spec_dir: str, key: str, form: str) -> tuple[int | None, str]:
    """(the id between documents or None, where it comes from) for ?eos= and train.tokenizer."""
    if option == "none":
        return None, "?eos=none: documents joined as they are"
    if option:
        if not option.isdigit():
            raise InputError(key, f"?eos={option} in {form} is not a token id", "write ?eos=ID (an integer >= 0) or ?eos=none")
        return int(option), f"EOS id {option} (?eos) between documents"
    if tokenizer:
        tok = load_tokenizer(tokenizer, spec_dir)
        if tok.eos is None:
            raise InputError(key, f"{form} joins its documents with an EOS id, and train.tokenizer ({tok.file}) has no EOS token",
                             "add ?eos=ID to the data source, or ?eos=none when each document already ends with one (--append-eod)")
        return tok.eos, f"EOS id {tok.eos} (train.tokenizer) between documents"
    raise InputError(key, f"{form} joins its documents with an EOS id, and neither ?eos=ID nor train.tokenizer gives one",
                     "add ?eos=ID (the tokenizer's end-of-text id) to the data source, or set train.tokenizer, "
                     "or add ?eos=none when each document already ends with one (--append-eod)")


def megatron_corpus(raw: str, *, spec_dir: str, key: str, tokenizer: str) -> tuple[np.ndarray | JoinedCorpus, str, dict]:
    """(corpus, its description, what identifies it for a resume) of megatron:RAW."""
    prefix, options = split_options(raw, {"eos": ""}, key=key, form="megatron")
    form = f"megatron:{raw}"
    prefix = _find_prefix(prefix, spec_dir, key)
    eos, how = _megatron_eos(options["eos"], tokenizer, spec_dir, key, form)
    dtype, documents, pointers, nbytes = _read_index(prefix + ".idx", key)
    bin_size = os.path.getsize(prefix + ".bin")
    if bin_size != nbytes:
        raise InputError(key, f"{prefix}.bin has {bin_size} bytes; {prefix}.idx describes {nbytes}",
                         "use the .bin and .idx that were written together")
    tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r", shape=(nbytes // dtype.itemsize,))
    n_docs = len(documents) - 1
    source = f"megatron:{prefix} ({dtype}, {n_docs} documents, {how})"
    identity = {"eos": eos, "documents": n_docs}
    if eos is None or n_docs < 2:
        return tokens, source, identity
    following = documents[1:-1]  # the first sequence of each document after the first
    n = len(pointers)
    ends = np.where(following < n, pointers[np.minimum(following, n - 1)], nbytes) // dtype.itemsize
    return JoinedCorpus(tokens, ends, eos), source, identity


# --- hf-dataset: -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _offline(config):
    """datasets never reaches the network meanwhile (its load counter sends a HEAD request for packaged builders)."""
    saved = config.HF_HUB_OFFLINE, config.HF_UPDATE_DOWNLOAD_COUNTS
    config.HF_HUB_OFFLINE, config.HF_UPDATE_DOWNLOAD_COUNTS = True, False
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE, config.HF_UPDATE_DOWNLOAD_COUNTS = saved


NOT_DATA = frozenset({"dataset_info.json", "dataset_infos.json", "state.json", "dataset_dict.json", "config.json",
                      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
"""JSON files a dataset, model or tokenizer folder holds that are no data shards."""

SPLIT_NAME = re.compile(r"^(train|training|validation|valid|val|dev|test|testing|eval|evaluation)(?=$|[-_.\d])", re.I)
"""A split named at the start of a file name or folder, as the Hub's data files are (`data/train-00000-of-00004.parquet`,
`train/0000.parquet`; datasets' DEFAULT_PATTERNS_SPLIT_IN_FILENAME / _IN_DIR)."""


def data_shards(folder: str, split: str, key: str, form: str) -> list[str]:
    """The data files of a folder of shards (a Hub download, or its data/ folder) for `split` ("" = train where the
    files are split, else every file), in name order. One format; files under hidden folders (.cache, .git) left out."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, f) for f in sorted(files)
                  if os.path.splitext(f)[1].lower() in HF_FILES and f not in NOT_DATA]
    if not found:
        raise InputError(key, f"the folder {folder} holds no .parquet, .jsonl, .json or .arrow file "
                              "and is not one Dataset.save_to_disk wrote",
                         "point hf-dataset: at a Hub dataset's folder (or its data/ folder), a save_to_disk folder, or one data file")
    formats = {HF_FILES[os.path.splitext(f)[1].lower()] for f in found}
    if len(formats) > 1:
        raise InputError(key, f"the folder {folder} mixes {', '.join(sorted(formats))} files",
                         f"point {form} at the folder of one format's shards")

    def split_of(path: str) -> str | None:
        for part in os.path.relpath(path, folder).split(os.sep):
            m = SPLIT_NAME.match(part)
            if m:
                return {"training": "train", "valid": "validation", "val": "validation", "testing": "test",
                        "evaluation": "eval"}.get(m.group(1).lower(), m.group(1).lower())
        return None

    splits = {f: split_of(f) for f in found}
    named = sorted({s for s in splits.values() if s})
    want = split.lower() if split else ("train" if named else None)
    chosen = [f for f in found if want is None or splits[f] == want]
    if not chosen:
        raise InputError(key, f"the folder {folder} has no {want!r} files; its splits: {', '.join(named) or 'none named'}",
                         f"pick one with {form.partition('?')[0]}?split=NAME")
    return chosen


def _load_dataset(path: str, key: str, split: str = "", form: str = "hf-dataset:"):
    """The `datasets.Dataset` at `path`: a save_to_disk folder (a DatasetDict's "train" split), a folder of data-file
    shards (`data_shards`), or one data file."""
    try:
        import datasets
    except ImportError as e:
        raise BackendMissing("datasets", INSTALL["datasets"]) from e
    fix = ("point hf-dataset: at a folder Dataset.save_to_disk wrote, a folder of .parquet / .jsonl / .json / .arrow shards, "
           "or one such file")
    # data_files are glob patterns to datasets: escape the names so that [ ] * ? in them are literal.
    literal = lambda p: "".join(f"[{c}]" if c in "[]*?" else c for c in os.path.abspath(p))  # noqa: E731
    if os.path.isdir(path) and _saved_to_disk(path):
        if split:
            raise InputError(key, f"?split= picks data files; {path} is a save_to_disk folder", "drop ?split= (its 'train' split is read)")
        load = lambda: datasets.load_from_disk(path)  # noqa: E731
    elif os.path.isdir(path):
        shards = data_shards(path, split, key, form)
        builder = HF_FILES[os.path.splitext(shards[0])[1].lower()]
        load = lambda: datasets.load_dataset(builder, data_files=[literal(f) for f in shards], split="train")  # noqa: E731
    else:
        builder = HF_FILES.get(os.path.splitext(path)[1].lower())
        if builder is None:
            raise InputError(key, f"cannot tell the format of {path} from its name", fix)
        load = lambda: datasets.load_dataset(builder, data_files=literal(path), split="train")  # noqa: E731
    try:
        with _offline(datasets.config):
            ds = load()
    except InputError:
        raise
    except Exception as e:  # datasets and pyarrow raise many types for a file they cannot read
        raise InputError(key, f"datasets cannot read {path} ({type(e).__name__}: {e})".replace("\n", " "), fix) from e
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise InputError(key, f"{path} holds the splits {', '.join(ds)} and no 'train'",
                             "save the split to train on with Dataset.save_to_disk, or name a DatasetDict with a 'train' split")
        ds = ds["train"]
    return ds


def _text_column(ds, column: str, path: str, key: str, form: str):
    """`ds` with only `column`, checked to exist and to hold strings."""
    if column not in ds.column_names:
        raise InputError(key, f"{path} has no column '{column}'{did_you_mean(column, ds.column_names)}; "
                         f"its columns: {', '.join(ds.column_names)}",
                         f"name the text column: {form.partition('?')[0]}?column=NAME")
    feature = ds.features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise InputError(key, f"column '{column}' of {path} holds {feature}, not text",
                         f"name a column of strings with ?column=NAME (its columns: {', '.join(ds.column_names)})")
    return ds.select_columns([column])


def _tokenize(ds, column: str, tok, path: str, key: str) -> tuple[np.ndarray, int]:
    """(every text of `column` tokenized and laid end to end, with tok.eos between documents; the document count)."""
    pieces, rows = [], 0
    sep = [] if tok.eos is None else [tok.eos]
    for batch in ds.iter(batch_size=TOKENIZE_BATCH):
        texts = batch[column]
        if None in texts:
            raise InputError(key, f"row {rows + texts.index(None)} of {path} has no '{column}' (null)",
                             "drop or fill the rows without text (e.g. Dataset.filter)")
        encodings = tok.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        pieces.append(np.fromiter(itertools.chain.from_iterable(e.ids + sep for e in encodings), dtype=np.uint32))
        rows += len(texts)
    ids = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.uint32)
    return (ids[:-1] if sep and len(ids) else ids), rows  # separators between documents, not after the last


def hf_dataset_corpus(raw: str, *, spec_dir: str, key: str, tokenizer: str) -> tuple[np.ndarray, str, dict]:
    """(corpus, its description, what identifies it for a resume) of hf-dataset:RAW, tokenized by `tokenizer`."""
    raw_path, options = split_options(raw, {"column": "text", "split": ""}, key=key, form="hf-dataset")
    form, column = f"hf-dataset:{raw}", options["column"]
    path = resolve_path(raw_path, spec_dir, key)
    if not tokenizer:
        raise InputError("train.tokenizer", f"{key} = {form} is text, and train.tokenizer is not set to turn it into ids",
                         "set train.tokenizer to the model's tokenizer.json, or to a Hugging Face tokenizer folder holding one")
    tok = load_tokenizer(tokenizer, spec_dir)
    ds = _text_column(_load_dataset(path, key, options["split"], form), column, path, key, form)
    ids, rows = _tokenize(ds, column, tok, path, key)
    joined = f"EOS id {tok.eos} between documents" if tok.eos is not None else "no EOS in the tokenizer: documents joined as they are"
    source = f"hf-dataset:{path} (column '{column}', {rows} documents, tokenized by {tok.file}, {joined})"
    shards = data_shards(path, options["split"], key, form) if os.path.isdir(path) and not _saved_to_disk(path) else []
    identity = {"eos": tok.eos, "documents": rows, "column": column, "tokenizer": tok.digest}
    if shards:  # which files, in which order: a resume must read the same ones
        identity["files"] = [os.path.relpath(f, path) for f in shards]
    return ids, source, identity


def _saved_to_disk(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, n)) for n in ("state.json", "dataset_dict.json"))
