"""megatron: and hf-dataset: data, and train.tokenizer: Megatron-Core indexed datasets written by megatron-core
itself, read back by their on-disk format; local Hugging Face datasets (parquet, jsonl, save_to_disk) tokenized
by a tokenizer trained here; both packed into the same shuffled, rank-disjoint, resumable windows as tokens:."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch

from launcher.errors import EXIT_INVALID, InputError
from launcher.train.data import build_data
from launcher.train.data import formats as data_formats
from launcher.train.data.formats import JoinedCorpus
from launcher.train.data.tokenizer import load_tokenizer

tokenizers = pytest.importorskip("tokenizers")
datasets = pytest.importorskip("datasets")

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
TEXTS = [f"w{i} " + " ".join(WORDS[(i * 5 + j * 7) % len(WORDS)] for j in range(i % 5 + 1)) for i in range(40)] + [""]
"""Each document starts with a word of its own and has at most 6 tokens, so every 9-token window is unique."""
EOS = 1


def stream(spec, spec_dir, **kw):
    args = dict(seq_len=8, micro_batch_size=2, vocab_size=4096, rank=0, world_size=1, seed=0, spec_dir=str(spec_dir))
    return build_data(spec, **{**args, **kw})


def take(s, n):
    return [next(s) for _ in range(n)]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def joined(docs, eos):
    """The reference corpus: documents end to end with `eos` between them (none after the last)."""
    out = []
    for i, doc in enumerate(docs):
        out += ([eos] if i and eos is not None else []) + list(doc)
    return np.asarray(out, dtype=np.int64)


def reference_stream(tmp_path, corpus, **kw):
    """A tokens: stream over `corpus` saved as .npy: the windows every other form must reproduce."""
    np.save(tmp_path / "reference.npy", corpus)
    return stream(f"tokens:{tmp_path / 'reference.npy'}", tmp_path, **kw)


def train_tokenizer(folder, special=("[UNK]", "</s>")):
    """A WordLevel tokenizer over TEXTS' words; [UNK] = 0 and </s> = 1 (the EOS) when `special` says so."""
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, tokenizers.trainers.WordLevelTrainer(special_tokens=list(special)))
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return tok


@pytest.fixture
def tok_dir(tmp_path):
    train_tokenizer(tmp_path / "tok")
    return tmp_path / "tok"


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """datasets' cache in tmp_path; every attempt to reach the network recorded (and refused)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("the network is off in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", lambda self, *a: refuse(*a))
    return attempts


# --- megatron: ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def builder_class():
    return pytest.importorskip("megatron.core.datasets.indexed_dataset").IndexedDatasetBuilder


def write_megatron(builder_class, prefix, docs, dtype, split_first=False):
    """PREFIX.bin/.idx written by megatron-core's own IndexedDatasetBuilder, one document per entry of `docs`
    (the first one as two sequences when `split_first`, as preprocess_data.py --split-sentences writes)."""
    builder = builder_class(f"{prefix}.bin", dtype=dtype)
    for i, doc in enumerate(docs):
        lengths = [2, len(doc) - 2] if split_first and i == 0 else [len(doc)]
        builder.add_document(torch.tensor(doc, dtype=torch.int64), lengths)
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def megatron_docs(high, count=30, seed=1):
    """`count` documents of 1..11 ids in [2, high), and one empty one."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(2, high, size=int(rng.integers(1, 12))).tolist() for _ in range(count)]
    return docs[:5] + [[]] + docs[5:]


@pytest.mark.parametrize("dtype, high, vocab", [(np.uint16, 60_000, 65_536), (np.int32, 150_000, 200_000)])
def test_megatron_windows_equal_windows_of_the_joined_reference(tmp_path, monkeypatch, builder_class, dtype, high, vocab):
    monkeypatch.setattr(data_formats, "CHUNK", 5)  # the pointer check runs over several chunks
    docs = megatron_docs(high)
    prefix = write_megatron(builder_class, tmp_path / "corpus_text_document", docs, dtype, split_first=True)
    ref = joined(docs, eos=7)
    s = stream(f"megatron:{prefix}?eos=7", tmp_path, vocab_size=vocab, micro_batch_size=3, seed=4)
    assert len(s.corpus) == sum(map(len, docs)) + len(docs) - 1  # one EOS between each pair of the 31 documents
    batches = take(s, 2 * s.per_rank // 3 + 2)  # into the second epoch
    assert same(batches, take(reference_stream(tmp_path, ref, vocab_size=vocab, micro_batch_size=3, seed=4), len(batches)))
    first = int(np.random.default_rng([4, 0]).permutation(s.n_windows)[0])
    assert batches[0][0].tolist() == ref[first * 8 : first * 8 + 9].tolist()
    assert f"megatron:{prefix} ({np.dtype(dtype)}, 31 documents, EOS id 7 (?eos) between documents)" == s.source


def test_joined_corpus_slices_equal_the_concatenation_everywhere():
    docs = [[5, 6], [], [7], [8, 9, 10], [], []]
    corpus = JoinedCorpus(np.asarray([t for d in docs for t in d]), np.cumsum([len(d) for d in docs])[:-1], 0)
    ref = joined(docs, eos=0)
    assert len(corpus) == len(ref) == 11
    for a in range(len(ref) + 1):
        for b in range(a, len(ref) + 2):
            assert corpus[a:b].tolist() == ref[a:b].tolist(), (a, b)
    assert (corpus.min(), corpus.max()) == (0, 10)


def test_megatron_eos_none_reads_the_documents_as_they_are(tmp_path, builder_class):
    docs = megatron_docs(1000)
    prefix = write_megatron(builder_class, tmp_path / "eod", docs, np.uint16)
    s = stream(f"megatron:{prefix}?eos=none", tmp_path, seed=2)
    assert len(s.corpus) == sum(map(len, docs)) and s.state_dict()["eos"] is None
    assert same(take(s, 6), take(reference_stream(tmp_path, joined(docs, eos=None), seed=2), 6))


def test_megatron_eos_comes_from_train_tokenizer(tmp_path, builder_class, tok_dir):
    docs = megatron_docs(40)
    prefix = write_megatron(builder_class, tmp_path / "c", docs, np.uint16)
    s = stream(f"megatron:{prefix}", tmp_path, tokenizer="tok", seed=3)  # relative to the spec's folder
    assert s.state_dict()["eos"] == EOS and "EOS id 1 (train.tokenizer)" in s.source
    assert same(take(s, 5), take(reference_stream(tmp_path, joined(docs, eos=EOS), seed=3), 5))


def test_tokenizer_eos_comes_from_its_config_then_its_special_tokens(tmp_path):
    train_tokenizer(tmp_path / "plain")
    assert load_tokenizer(str(tmp_path / "plain"), ".").eos == 1  # </s> among the special tokens
    assert load_tokenizer(str(tmp_path / "plain" / "tokenizer.json"), ".").eos == 1  # the file itself
    (tmp_path / "plain" / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "[UNK]"}}))
    assert load_tokenizer(str(tmp_path / "plain"), ".").eos == 0  # tokenizer_config.json names it
    train_tokenizer(tmp_path / "none", special=("[UNK]",))
    assert load_tokenizer(str(tmp_path / "none"), ".").eos is None


def megatron_error_setups(tmp_path, builder_class):
    docs = megatron_docs(100)
    good = write_megatron(builder_class, tmp_path / "good", docs, np.uint16)
    (tmp_path / "bad.bin").write_bytes(b"\0" * 8)
    (tmp_path / "bad.idx").write_bytes(b"NOTANIDX!" + (tmp_path / "good.idx").read_bytes()[9:])
    (tmp_path / "short.bin").write_bytes((tmp_path / "good.bin").read_bytes()[:-2])
    (tmp_path / "short.idx").write_bytes((tmp_path / "good.idx").read_bytes())
    index = (tmp_path / "good.idx").read_bytes()
    n = int.from_bytes(index[18:26], "little")  # the sequence count
    second = 34 + 4 * n + 8  # where sequence_pointers[1] sits
    moved = (int.from_bytes(index[second : second + 8], "little") + 2).to_bytes(8, "little")
    for name, data in (("trunc", index[:-8]), ("gap", index[:second] + moved + index[second + 8 :])):
        (tmp_path / f"{name}.idx").write_bytes(data)
        (tmp_path / f"{name}.bin").write_bytes((tmp_path / "good.bin").read_bytes())
    mm = builder_class(str(tmp_path / "mm.bin"), dtype=np.uint16, multimodal=True)
    mm.add_document(torch.tensor([3, 4, 5]), [3], modes=[0])
    mm.finalize(str(tmp_path / "mm.idx"))
    train_tokenizer(tmp_path / "no-eos", special=("[UNK]",))
    return good


@pytest.mark.parametrize(
    "spec, kw, key, pattern",
    [
        ("megatron:missing?eos=1", {}, "train.data",
         r"megatron:missing needs missing\.idx, which does not exist \(tried .*missing\.idx.*\); fix: give the path prefix"),
        ("megatron:good.bin?eos=1", {}, "train.data",
         r"needs good\.bin\.idx, .*; fix: name the prefix without its extension: megatron:good$"),
        ("megatron:bad?eos=1", {}, "train.data",
         r"bad\.idx is not a Megatron-Core index: it does not start with the bytes b'MMIDIDX\\x00\\x00'; fix: point megatron: at"),
        ("megatron:good", {}, "train.data",
         r"neither \?eos=ID nor train\.tokenizer gives one; fix: add \?eos=ID .* or set train\.tokenizer"),
        ("megatron:good", {"tokenizer": "no-eos"}, "train.data",
         r"train\.tokenizer \(.*no-eos/tokenizer\.json\) has no EOS token; fix: add \?eos=ID"),
        ("megatron:good", {"key": "eval.data"}, "eval.data", r"^error: eval\.data: megatron:good joins its documents with an EOS id"),
        ("megatron:good?eos=x", {}, "train.data", r"\?eos=x in megatron:good\?eos=x is not a token id; fix: write \?eos=ID"),
        ("megatron:good?eso=1", {}, "train.data",
         r"'eso=1' in megatron:good\?eso=1 is not an option of megatron: \(did you mean 'eos'\?\); "
         r"fix: write megatron:PATH with the options \?eos="),
        ("megatron:short?eos=1", {}, "train.data",
         r"short\.bin has \d+ bytes; .*short\.idx describes \d+; fix: use the \.bin and \.idx that were written together"),
        ("megatron:trunc?eos=1", {}, "train.data",
         r"trunc\.idx has \d+ bytes and 31 sequences in 31 documents; its header needs \d+ bytes .*truncated or empty"),
        ("megatron:gap?eos=1", {}, "train.data",
         r"gap\.idx's sequences are not stored back to back in the \.bin \(sequence 1 does not start where the one before it ends\)"),
        ("megatron:mm?eos=1", {}, "train.data", r"mm\.idx is a multimodal Megatron-Core index .*; fix: write a text-only dataset"),
        ("megatron:good?eos=5000", {"vocab_size": 200}, "train.data",
         r"its EOS holds token id 5000, but the model \(train\.model\) has only 200 ids"),
        ("megatron:good?eos=1", {"vocab_size": 50}, "train.data",
         r"megatron:.*good \(uint16.* holds token id 99, but the model \(train\.model\) has only 50 ids; fix: use a model"),
        ("megatron:good", {"tokenizer": "nothing-here"}, "train.tokenizer", r"^error: train\.tokenizer: 'nothing-here' does not exist"),
    ],
)
def test_megatron_errors_name_the_key_and_exit_2(tmp_path, builder_class, spec, kw, key, pattern):
    megatron_error_setups(tmp_path, builder_class)
    if spec.startswith("megatron:good?eos=1") and "vocab_size" in kw:  # make 99 the largest id
        write_megatron(builder_class, tmp_path / "good", [[2, 99], [3, 4, 5] * 10], np.uint16)
    with pytest.raises(InputError) as e:
        stream(spec, tmp_path, world_size=1, **kw)
    assert e.value.key == key and e.value.exit_code == EXIT_INVALID == 2
    assert e.match(pattern)


# --- hf-dataset: -------------------------------------------------------------------------------------------


@pytest.fixture
def hf_files(tmp_path):
    """The same texts as a parquet file, a jsonl file and a save_to_disk folder (column "other": reversed)."""
    ds = datasets.Dataset.from_dict({"text": TEXTS, "other": TEXTS[::-1], "n": list(range(len(TEXTS)))})
    ds.to_parquet(str(tmp_path / "texts.parquet"))
    ds.to_json(str(tmp_path / "texts.jsonl"))
    ds.save_to_disk(str(tmp_path / "saved"))
    return tmp_path


def tokenized(tok, texts, eos):
    return joined([tok.encode(t, add_special_tokens=False).ids for t in texts], eos)


def test_hf_dataset_parquet_jsonl_and_save_to_disk_give_the_same_windows(hf_files, tok_dir, offline):
    tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    ref = tokenized(tok, TEXTS, EOS)
    expected = take(reference_stream(hf_files, ref, seed=5), 8)
    for path in ("texts.parquet", "texts.jsonl", "saved"):
        s = stream(f"hf-dataset:{path}", hf_files, tokenizer=str(tok_dir), seed=5)
        assert len(s.corpus) == len(ref) and s.state_dict()["documents"] == len(TEXTS), path
        assert same(take(s, 8), expected), path
    assert offline == []  # datasets never reached for the network


def hub_folder(root):
    """A dataset as a Hub download leaves it: README, .gitattributes, data/train-0000x-of-00002.parquet (TEXTS in two
    shards, in order) and a validation shard (the reversed texts)."""
    (root / "data").mkdir(parents=True)
    (root / "README.md").write_text("---\nlicense: mit\n---\n")
    (root / ".gitattributes").write_text("*.parquet filter=lfs\n")
    half = len(TEXTS) // 2
    for i, part in enumerate((TEXTS[:half], TEXTS[half:])):
        datasets.Dataset.from_dict({"text": part}).to_parquet(str(root / "data" / f"train-0000{i}-of-00002.parquet"))
    datasets.Dataset.from_dict({"text": TEXTS[::-1]}).to_parquet(str(root / "data" / "validation-00000-of-00001.parquet"))
    return root


def test_hf_dataset_reads_a_hub_folder_of_parquet_shards_by_split(hf_files, tok_dir, offline):
    """hf-dataset: on a folder of shards (the repository folder or its data/ folder): the train split's files in name
    order by default, ?split= picks another; the same windows as one file of the same texts."""
    hub_folder(hf_files / "hub")
    tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    shards = [f"train-0000{i}-of-00002.parquet" for i in range(2)]
    for path, files in (("hub", [f"data/{f}" for f in shards]), ("hub/data", shards), ("hub?split=train", [f"data/{f}" for f in shards])):
        s = stream(f"hf-dataset:{path}", hf_files, tokenizer=str(tok_dir), seed=3)
        assert same(take(s, 6), take(reference_stream(hf_files, tokenized(tok, TEXTS, EOS), seed=3), 6)), path
        assert s.state_dict()["files"] == files  # what a resume checks it reads again
    s = stream("hf-dataset:hub?split=validation", hf_files, tokenizer=str(tok_dir), seed=3)
    assert same(take(s, 6), take(reference_stream(hf_files, tokenized(tok, TEXTS[::-1], EOS), seed=3), 6))
    assert s.state_dict()["documents"] == len(TEXTS) and offline == []


def test_hf_dataset_column_option(hf_files, tok_dir):
    tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    s = stream("hf-dataset:texts.parquet?column=other", hf_files, tokenizer=str(tok_dir), seed=1)
    assert same(take(s, 5), take(reference_stream(hf_files, tokenized(tok, TEXTS[::-1], EOS), seed=1), 5))
    assert s.state_dict()["column"] == "other"


def test_hf_dataset_joins_documents_with_nothing_when_the_tokenizer_has_no_eos(hf_files):
    tok = train_tokenizer(hf_files / "no-eos", special=("[UNK]",))
    s = stream("hf-dataset:saved", hf_files, tokenizer="no-eos", seed=1)
    ref = tokenized(tok, TEXTS, None)
    assert len(s.corpus) == len(ref) and "no EOS in the tokenizer" in s.source
    assert same(take(s, 4), take(reference_stream(hf_files, ref, seed=1), 4))


@pytest.mark.parametrize(
    "spec, kw, key, pattern",
    [
        ("hf-dataset:texts.jsonl?column=body", {}, "train.data",
         r"texts\.jsonl has no column 'body'; its columns: text, other, n; "
         r"fix: name the text column: hf-dataset:texts\.jsonl\?column=NAME"),
        ("hf-dataset:saved?column=txt", {"key": "eval.data"}, "eval.data",
         r"^error: eval\.data: .*saved has no column 'txt' \(did you mean 'text'\?\); its columns: text, other, n"),
        ("hf-dataset:texts.parquet?column=n", {}, "train.data", r"column 'n' of .* holds Value\('int64'\), not text"),
        ("hf-dataset:texts.parquet", {"tokenizer": ""}, "train.tokenizer",
         r"^error: train\.tokenizer: train\.data = hf-dataset:texts\.parquet is text, and train\.tokenizer is not set .*; "
         r"fix: set train\.tokenizer"),
        ("hf-dataset:texts.parquet", {"tokenizer": "tok/missing.json"}, "train.tokenizer",
         r"^error: train\.tokenizer: 'tok/missing\.json' does not exist"),
        ("hf-dataset:texts.parquet", {"tokenizer": "empty-folder"}, "train.tokenizer", r"empty-folder holds no tokenizer\.json"),
        ("hf-dataset:texts.parquet", {"tokenizer": "broken.json"}, "train.tokenizer", r"cannot read .*broken\.json as a tokenizer\.json"),
        ("hf-dataset:notes.txt", {}, "train.data",
         r"cannot tell the format of .*notes\.txt from its name; fix: point hf-dataset: at a folder"),
        ("hf-dataset:tok", {}, "train.data",
         r"the folder .*tok holds no \.parquet, \.jsonl, \.json or \.arrow file and is not one Dataset\.save_to_disk wrote"),
        ("hf-dataset:hub?split=test", {}, "train.data",
         r"the folder .*hub has no 'test' files; its splits: train, validation; fix: pick one with hf-dataset:hub\?split=NAME"),
        ("hf-dataset:texts.parquet", {"vocab_size": 10}, "train.data",
         r"hf-dataset:.* holds token id \d+, but the model \(train\.model\) has only 10 ids"),
    ],
)
def test_hf_dataset_errors_name_the_key_and_exit_2(hf_files, tok_dir, spec, kw, key, pattern):
    hub_folder(hf_files / "hub")
    (hf_files / "empty-folder").mkdir()
    (hf_files / "broken.json").write_text("{not json")
    (hf_files / "notes.txt").write_text("hello")
    with pytest.raises(InputError) as e:
        stream(spec, hf_files, **{"tokenizer": "tok", **kw})
    assert e.value.key == key and e.value.exit_code == EXIT_INVALID
    assert e.match(pattern)


def test_text_uses_train_tokenizer_when_set(tmp_path, tok_dir):
    (tmp_path / "corpus.txt").write_text(" ".join(TEXTS))
    tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    s = stream("text:corpus.txt", tmp_path, tokenizer="tok", seed=2)  # no tokenizer.json beside the text
    assert s.corpus.tolist() == tok.encode(" ".join(TEXTS), add_special_tokens=False).ids
    assert f"(tokenized by {tok_dir / 'tokenizer.json'})" in s.source


# --- both forms: ranks, resume -----------------------------------------------------------------------------


@pytest.fixture(params=["megatron", "hf-dataset"])
def source(request, tmp_path, tok_dir):
    """(spec, build_data keywords) of a corpus of either form, whose 9-token windows are all different."""
    if request.param == "megatron":
        builder_class = request.getfixturevalue("builder_class")
        prefix = write_megatron(builder_class, tmp_path / "m", [list(range(i * 10 + 2, i * 10 + 9)) for i in range(30)], np.int32)
        return f"megatron:{prefix}?eos=1", {}
    request.getfixturevalue("hf_files")
    return "hf-dataset:texts.parquet", {"tokenizer": "tok"}


def test_ranks_never_share_a_window_within_an_epoch(tmp_path, source):
    spec, kw = source
    windows = {}
    for rank in (0, 1):
        s = stream(spec, tmp_path, micro_batch_size=1, rank=rank, world_size=2, seed=6, **kw)
        windows[rank] = [tuple(next(s)[0].tolist()) for _ in range(2 * s.per_rank)]
    per_rank = s.per_rank
    everything = [tuple(s.corpus[i * 8 : i * 8 + 9].tolist()) for i in range(s.n_windows)]
    assert len(set(everything)) == s.n_windows  # windows are told apart by their tokens
    first = [set(windows[r][:per_rank]) for r in (0, 1)]
    assert len(first[0]) == len(first[1]) == per_rank and not first[0] & first[1]
    assert first[0] | first[1] <= set(everything) and len(first[0] | first[1]) == 2 * per_rank
    assert windows[0][:per_rank] != windows[0][per_rank:]  # reshuffled in the second epoch


def test_a_rebuilt_stream_resumes_with_exactly_the_next_batches(tmp_path, source):
    spec, kw = source
    build = lambda: stream(spec, tmp_path, micro_batch_size=3, rank=1, world_size=2, seed=8, **kw)  # noqa: E731
    s = build()
    take(s, s.per_rank // 3 + 1)  # past the first epoch's end
    state = json.loads(json.dumps(s.state_dict()))
    expected = take(s, 6)
    resumed = build()
    resumed.load_state_dict(state)
    assert same(take(resumed, 6), expected)
    # Another EOS (megatron:) or column (hf-dataset:) with the same token count: refused by the fingerprint.
    changed, pattern = ((spec.replace("eos=1", "eos=2"), r"eos: saved 1, now 2") if spec.startswith("megatron:")
                        else (spec + "?column=other", r"column: saved 'text', now 'other'"))
    with pytest.raises(InputError, match=r"train\.resume: .*" + pattern):
        stream(changed, tmp_path, micro_batch_size=3, rank=1, world_size=2, seed=8, **kw).load_state_dict(state)
