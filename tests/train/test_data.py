"""The data layer: shapes, learnable synthetic data, rank-disjoint shuffled windows over
files, exact resume from state_dict, vocabulary bounds, and errors naming train.data."""

from __future__ import annotations

import itertools
import json
import textwrap

import numpy as np
import pytest
import torch

from launcher.errors import InputError
from launcher.train.data import SyntheticStream, build_data


def stream(spec, tmp_path=None, **kw):
    args = dict(seq_len=8, micro_batch_size=2, vocab_size=4096, rank=0, world_size=1, seed=0, spec_dir=str(tmp_path or "."))
    return build_data(spec, **{**args, **kw})


def take(s, n):
    return [next(s) for _ in range(n)]


@pytest.fixture
def counting_corpus(tmp_path):
    """tokens:PATH of ids 0..N-1, so every window tells where it came from."""
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(8 * 20 + 1, dtype=np.int32))  # exactly 20 windows of 9 tokens at seq_len 8
    return f"tokens:{path}"


# --- synthetic ---------------------------------------------------------------------------------


def test_synthetic_shape_dtype_and_range():
    batch = next(stream("synthetic", seq_len=128, micro_batch_size=4, vocab_size=2048))
    assert batch.shape == (4, 129) and batch.dtype == torch.int64
    assert 0 <= batch.min() and batch.max() < 2048


def test_synthetic_is_seeded_per_rank():
    a, b = take(stream("synthetic", seed=1), 3), take(stream("synthetic", seed=1), 3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    other_rank = next(stream("synthetic", seed=1, rank=1, world_size=2))
    other_seed = next(stream("synthetic", seed=2))
    assert not torch.equal(a[0], other_rank) and not torch.equal(a[0], other_seed)


def test_synthetic_next_token_is_mostly_a_function_of_the_current_one():
    s = stream("synthetic", seq_len=256, micro_batch_size=8, vocab_size=2048, seed=5)
    successor = {int(a): int(b) for a, b in zip(s.pattern, np.roll(s.pattern, -1))}
    batch = next(s)
    cur, nxt = batch[:, :-1].flatten().tolist(), batch[:, 1:].flatten().tolist()
    hits = sum(successor.get(a) == b for a, b in zip(cur, nxt)) / len(cur)
    # Both tokens unchanged by noise: (1 - 0.1)^2 = 0.81.
    assert hits == pytest.approx((1 - SyntheticStream.NOISE) ** 2, abs=0.03)
    assert len(set(cur)) < 2048  # concentrated on the pattern: the unigram alone is learnable


def test_synthetic_resumes_exactly():
    s = stream("synthetic", seed=3)
    take(s, 4)
    state = json.loads(json.dumps(s.state_dict()))  # survives a JSON round trip
    expected = take(s, 3)
    resumed = stream("synthetic", seed=3)
    resumed.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(expected, take(resumed, 3)))


# --- files -------------------------------------------------------------------------------------


def test_windows_are_contiguous_slices_overlapping_by_one(counting_corpus):
    batch = next(stream(counting_corpus, vocab_size=1000))
    assert batch.shape == (2, 9)
    for row in batch:
        assert row[0] % 8 == 0
        assert torch.equal(row, torch.arange(row[0], row[0] + 9))


def test_ranks_take_disjoint_windows_and_each_epoch_covers_them_all(counting_corpus):
    starts = {}
    for rank in range(3):
        s = stream(counting_corpus, vocab_size=1000, micro_batch_size=1, rank=rank, world_size=3)
        starts[rank] = [int(next(s)[0, 0]) // 8 for _ in range(12)]  # 2 epochs of 20 // 3 = 6 windows
    first_epoch = [set(v[:6]) for v in starts.values()]
    assert all(len(w) == 6 for w in first_epoch)
    assert not (first_epoch[0] & first_epoch[1] or first_epoch[0] & first_epoch[2] or first_epoch[1] & first_epoch[2])
    assert len(set().union(*first_epoch)) == 18  # 20 windows, 2 left over this epoch
    assert starts[0][:6] != starts[0][6:]  # reshuffled each epoch


def test_file_streams_are_deterministic_and_depend_on_the_seed(counting_corpus):
    a, b = take(stream(counting_corpus, vocab_size=1000), 5), take(stream(counting_corpus, vocab_size=1000), 5)
    c = take(stream(counting_corpus, vocab_size=1000, seed=9), 5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_file_stream_resumes_exactly_across_epochs(counting_corpus):
    s = stream(counting_corpus, vocab_size=1000, micro_batch_size=3, rank=1, world_size=2)
    take(s, 5)  # 15 windows: into the second epoch of 10
    state = s.state_dict()
    expected = take(s, 6)
    resumed = stream(counting_corpus, vocab_size=1000, micro_batch_size=3, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(expected, take(resumed, 6)))


def test_resume_with_another_seq_len_is_refused(counting_corpus):
    state = stream(counting_corpus, vocab_size=1000).state_dict()
    with pytest.raises(InputError, match=r"train\.resume: .*seq_len: saved 8, now 4.*fix: resume with the same"):
        stream(counting_corpus, vocab_size=1000, seq_len=4).load_state_dict(state)


@pytest.mark.parametrize("name, dtype", [("ids.bin", np.uint16), ("ids.u16.bin", np.uint16), ("ids.u32.bin", np.uint32)])
def test_raw_bin_files(tmp_path, name, dtype):
    ids = (np.arange(200) * 997 % 70000).astype(dtype) if dtype == np.uint32 else (np.arange(200) * 7).astype(dtype)
    ids.tofile(tmp_path / name)
    s = stream(f"tokens:{name}", tmp_path, vocab_size=70000)
    for row in torch.cat(take(s, 3)):
        start = np.flatnonzero(ids == row[0].item())[0]
        assert row.tolist() == ids[start : start + 9].astype(np.int64).tolist()


def test_text_bytes_are_tokens(tmp_path, monkeypatch):
    text = "the quick brown fox jumps over the lazy dog; " * 10 + "héllo"
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    raw = text.encode("utf-8")
    for row in torch.cat(take(stream("text:corpus.txt", vocab_size=256, micro_batch_size=4, seq_len=16), 3)):
        assert bytes(row.tolist()) in raw


def test_text_with_a_tokenizer_json_beside_it(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i + 3 for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    text = " ".join(words[i % 8] for i in range(0, 300, 3))
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    ids = tok.encode(text).ids
    batch = next(stream(f"text:{tmp_path / 'corpus.txt'}", vocab_size=16, micro_batch_size=4, seq_len=8))
    assert 3 <= batch.min() and batch.max() <= 10
    for row in batch.tolist():
        assert any(ids[i : i + 9] == row for i in range(0, len(ids) - 8, 8))


# --- errors ------------------------------------------------------------------------------------


def test_token_ids_beyond_the_vocabulary_name_both_keys(counting_corpus):
    with pytest.raises(InputError, match=r"train\.data: .* holds token id 160, but the model \(train\.model\) has only 100 ids; "
                                         r"fix: use a model whose vocabulary has at least 161 ids"):
        stream(counting_corpus, vocab_size=100)


def test_byte_level_text_needs_256_ids(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 20)
    with pytest.raises(InputError, match=r"train\.data: .*read as bytes.*only 128 ids; fix: use a model with vocab_size >= 256"):
        stream(f"text:{tmp_path / 'a.txt'}", vocab_size=128)


@pytest.mark.parametrize(
    "setup, spec, pattern",
    [
        (None, "tokens:missing.npy",
         r"train\.data: 'missing\.npy' does not exist \(tried .*missing\.npy, .*missing\.npy\); fix: give an absolute path"),
        ("empty.bin", "tokens:empty.bin", r"train\.data: .*empty\.bin is empty"),
        ("ids.csv", "tokens:ids.csv", r"train\.data: cannot tell the format of .*ids\.csv.*fix: name it \*\.npy"),
        ("odd.bin", "tokens:odd.bin", r"train\.data: .*odd\.bin has 3 bytes, not a whole number of uint16 ids"),
        ("small.npy", "tokens:small.npy",
         r"train\.data: .*small\.npy has 10 tokens: 1 windows of seq_len \+ 1 = 9 tokens, fewer than the 2 ranks need"),
        ("floats.npy", "tokens:floats.npy", r"train\.data: .*floats\.npy holds float64 values, not integer token ids"),
        (None, "json:x", r"train\.data: 'json:x' is not a data source"),
    ],
)
def test_bad_data_sources_name_the_key_and_the_fix(tmp_path, setup, spec, pattern):
    if setup == "empty.bin":
        (tmp_path / setup).write_bytes(b"")
    elif setup == "odd.bin":
        (tmp_path / setup).write_bytes(b"abc")
    elif setup == "ids.csv":
        (tmp_path / setup).write_text("1,2,3")
    elif setup == "small.npy":
        np.save(tmp_path / setup, np.arange(10))
    elif setup == "floats.npy":
        np.save(tmp_path / setup, np.ones(100))
    with pytest.raises(InputError, match=pattern):
        stream(spec, tmp_path, world_size=2)


# --- py: factories -----------------------------------------------------------------------------

USER_DATA = """
import torch

def batches():
    # Re-iterable: a list, 3 batches of (2, 9).
    return [torch.full((2, 9), i) for i in range(3)]

def endless():
    def gen():
        i = 0
        while True:
            yield torch.full((2, 9), i % 50).numpy()
            i += 1
    return gen()

def short():
    return iter([torch.zeros(2, 9, dtype=torch.long)])

def wrong_shape():
    return [torch.zeros(2, 10, dtype=torch.long)]

def floats():
    return [torch.zeros(2, 9)]

def dicts():
    return [{"input_ids": torch.zeros(2, 9, dtype=torch.long)}]

class Stateful:
    def __init__(self):
        self.i = 0
    def __iter__(self):
        while True:
            self.i += 1
            yield torch.full((2, 9), self.i)
    def state_dict(self):
        return {"i": self.i}
    def load_state_dict(self, s):
        self.i = s["i"]

def stateful():
    return Stateful()
"""


@pytest.fixture
def user_data(tmp_path, isolated_imports):
    (tmp_path / "user_data_mod.py").write_text(textwrap.dedent(USER_DATA))
    return lambda fn, **kw: stream(f"py:user_data_mod:{fn}", tmp_path, **kw)


def test_factory_batches_are_checked_and_reiterated(user_data):
    values = [int(b[0, 0]) for b in itertools.islice(user_data("batches"), 7)]
    assert values == [0, 1, 2, 0, 1, 2, 0]
    batch = next(user_data("endless"))
    assert batch.dtype == torch.int64 and batch.shape == (2, 9)


def test_factory_resume_replays_or_delegates(user_data):
    for fn in ("batches", "endless", "stateful"):
        s = user_data(fn)
        take(s, 4)
        state = s.state_dict()
        expected = take(s, 3)
        resumed = user_data(fn)
        resumed.load_state_dict(state)
        assert [b.tolist() for b in take(resumed, 3)] == [b.tolist() for b in expected], fn
    assert "inner" in user_data("stateful").state_dict()


@pytest.mark.parametrize(
    "fn, pattern",
    [
        ("short", r"train\.data: the iterable from py:user_data_mod:short ended after 1 batches"),
        ("wrong_shape", r"train\.data: .* shape \(2, 10\); this run needs \(train\.micro_batch_size, train\.seq_len \+ 1\) = \(2, 9\)"),
        ("floats", r"train\.data: .* yielded a torch\.float32 tensor"),
        ("dicts", r"train\.data: py:user_data_mod:dicts yielded a dict, not a tensor of token ids"),
    ],
)
def test_factory_errors_name_the_key(user_data, fn, pattern):
    with pytest.raises(InputError, match=pattern):
        take(user_data(fn), 2)


def test_factory_ids_beyond_the_vocabulary(user_data):
    with pytest.raises(InputError, match=r"train\.data: py:user_data_mod:endless holds token id 30, .*only 30 ids"):
        take(user_data("endless", vocab_size=30), 40)
