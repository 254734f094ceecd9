"""The whole path of issue 20 through the real CLI: train on a Megatron-Core indexed dataset (written by
megatron-core's own IndexedDatasetBuilder) with a tokenizer, evaluate on the held-out split of a folder of parquet
shards as a Hub download leaves it (issue 31), through `datasets`, follow it in TensorBoard and in an offline W&B run
that `wandb = true` gets from WANDB_MODE in the environment (issue 31), export the checkpoint, load it in
transformers, and find there the held-out loss the run reported. 2 processes (FSDP2), 2 steps, a tiny model: ~40 s."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tests.e2e.helpers import run, write_spec

pytestmark = pytest.mark.slow

WORDS = [f"w{i}" for i in range(200)]


def _tokenizer(folder):
    """A WordLevel tokenizer over WORDS with an EOS (<|endoftext|>) the data readers and the export recognise."""
    import tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return tok, path


def _documents(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[(start + k) % 50] for k in range(int(rng.integers(20, 60)))) for start in rng.integers(0, 50, n)]


def test_megatron_data_held_out_parquet_tensorboard_export_and_transformers_agree(tmp_path):
    import datasets
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tok, tokenizer = _tokenizer(tmp_path)
    builder = IndexedDatasetBuilder(str(tmp_path / "corpus.bin"), dtype=np.uint16)
    for text in _documents(0, 200):
        ids = tok.encode(text, add_special_tokens=False).ids
        builder.add_document(torch.tensor(ids), [len(ids)])
    builder.finalize(str(tmp_path / "corpus.idx"))
    held_out = _documents(1, 40)
    hub = tmp_path / "hub" / "data"  # repo/data/{train,validation}-0000i-of-0000n.parquet, as `huggingface-cli download` leaves it
    hub.mkdir(parents=True)
    (hub.parent / "README.md").write_text("---\nlicense: mit\n---\n")
    datasets.Dataset.from_dict({"text": _documents(2, 10)}).to_parquet(str(hub / "train-00000-of-00001.parquet"))
    for i in (0, 1):
        datasets.Dataset.from_dict({"text": held_out[20 * i:20 * (i + 1)]}).to_parquet(str(hub / f"validation-0000{i}-of-00002.parquet"))

    out = tmp_path / "runs" / "path"
    spec = write_spec(tmp_path, "path", **{
        "precision.mode": "fp32", "distributed.strategy": "fsdp2", "train.steps": 2, "train.seq_len": 32,
        "train.model": "builtin:llama-debug?layers=1&vocab=256", "train.data": f"megatron:{tmp_path / 'corpus'}",
        "train.tokenizer": str(tokenizer), "train.output_dir": str(out), "eval.data": f"hf-dataset:{tmp_path / 'hub'}?split=validation",
        "eval.every": 1, "eval.steps": 2, "log.tensorboard": True, "log.wandb": True})
    home = tmp_path / "wandb-home"  # W&B offline from the environment, its folders here, its server a closed local port
    wandb_env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_API_KEY": "",
                 "WANDB_CONFIG_DIR": str(home / "config"), "WANDB_CACHE_DIR": str(home / "cache"), "WANDB_DATA_DIR": str(home / "data"),
                 "WANDB_ERROR_REPORTING": "false", "WANDB_PROJECT": "fp8launch-e2e"}
    r, _ = run(tmp_path, "run", str(spec), extra_env=wandb_env)
    assert r.returncode == 0, r.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [rec for rec in records if rec["event"] == "eval"]
    assert [e["step"] for e in evals] == [1, 2] and evals[1]["eval_loss"] < evals[0]["eval_loss"]
    assert "eval after step 2/2 | eval loss" in r.stdout

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(out / "tensorboard"))
    board.Reload()
    assert [(s.step, s.value) for s in board.Scalars("eval_loss")] == [(e["step"], pytest.approx(e["eval_loss"], rel=1e-6)) for e in evals]
    from tests.train.test_trackers import wandb_run

    (folder,) = sorted((out / "wandb").glob("offline-run-*"))  # `wandb = true` and WANDB_MODE=offline: offline, not a failed login
    run_id, config, history = wandb_run(folder)
    assert history[2]["eval_loss"] == pytest.approx(evals[1]["eval_loss"], rel=1e-6)
    assert records[0]["trackers"]["wandb"].startswith("offline run")

    r, _ = run(tmp_path, "export", str(out), "--dtype", "fp32", "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr[-3000:]
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    # the held-out batches the run evaluated: the parquet texts tokenized, joined with EOS, in seq_len + 1 windows
    # shuffled with the seed, rank r taking windows r, r + 2, ...; the run's eval loss is their mean loss on the
    # exported model
    from launcher.planning.plan import load_plan
    from launcher.train.evaluate import eval_stream

    plan = load_plan(str(out / "plan" / "plan.json"))
    losses = []
    for rank in (0, 1):
        stream = eval_stream(plan, vocab_size=256, dp_rank=rank, dp_size=2, spec_dir=str(tmp_path))
        for _ in range(plan.eval.steps):
            batch = next(stream)
            with torch.no_grad():
                logits = model(batch[:, :-1]).logits
            losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item())
    assert sum(losses) / len(losses) == pytest.approx(evals[-1]["eval_loss"], rel=1e-4)
    assert math.exp(evals[-1]["eval_loss"]) == pytest.approx(evals[-1]["eval_perplexity"])
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
