"""The dataset of a NeMo 1.x / Megatron-Bridge config, read as Megatron-Bridge builds it (NVIDIA-NeMo/Megatron-Bridge
067f987df03b8355b03192d88d70f1709fedf51a):

- GPTDatasetConfig (training/config.py): `blend` ([prefixes], [weights] | null), `blend_per_split` ([train, valid, test] of
  blends), or `data_path` (a string split on spaces, or a list, weights interleaved: finalize() -> get_blend_from_list);
  NeMo 1.x: `model.data.data_prefix` (a list, a weighted list, or {train, validation, test}). Indexed datasets,
  PREFIX.bin + PREFIX.idx: fp8launch reads one as `megatron:PREFIX`.
- no blend, no blend_per_split, no data_path: mock data (MockGPTDatasetConfig; recipes/common.py _pretrain_common's
  GPTDatasetConfig(blend=None, "Mock data mode")): fp8launch's `synthetic`.
- GPTSFTDatasetConfig / FinetuningDatasetConfig (data/builders/gpt_sft.py: `dataset_root` of training.jsonl, `hf_dataset` an
  HFDatasetSourceConfig by `dataset_name` preset or `path_or_dataset`), the older HFDatasetConfig (`dataset_name`), and the
  SFT / PEFT recipes an override file extends (recipes/common.py _sft_common, _peft_common: default_squad_config, SQuAD as
  prompt-completion, loss on the answer only: datasets/gpt_sft.py answer_only_loss, True by default): fine-tuning rows with a
  loss mask. fp8launch trains on every token of a stream: a placeholder that says so.
"""

from __future__ import annotations

import os

from .draft import Draft

PREFIXES = ("model.data.data_prefix", "dataset.data_path", "dataset.blend", "dataset.blend_per_split")
SFT_CLASSES = ("FinetuningDatasetConfig", "GPTSFTDatasetConfig", "HFDatasetConfig", "DirectHFSFTDatasetConfig")
SFT_KEYS = ("dataset_root", "hf_dataset", "dataset_name", "packed_sequence_specs", "offline_packing_specs", "preprocessing",
            "process_example_fn", "hf_output_root")
FINETUNE_HINTS = ("peft", "checkpoint.pretrained_checkpoint", "optimizer.finetune_lr", "checkpoint.finetune")
NEED = ("fp8launch trains on every token of a token stream, with no loss mask: to train on it, write its rows as text (prompt "
        'and answer joined) and set train.data = "hf-dataset:FILE?column=text" and train.tokenizer; the loss then also counts '
        "the prompt tokens, which the source masks out")


def read(d: Draft) -> None:
    prefix = next((k for k in PREFIXES if d.has(k)), None)
    cls = str(d.get("dataset._target_") or "").rsplit(".", 1)[-1]
    sft = [f"dataset.{k}" for k in SFT_KEYS if d.has(f"dataset.{k}")]
    real = tuple(k for k in ("dataset.mock", "model.data.mock_dataset") if d.get(k) is False)
    mock_keys = tuple(k for k in ("dataset.mock", "model.data.mock_dataset") if d.has(k))
    if prefix is None and d.has("model.data.train_ds.file_names"):
        _nemo_sft(d)
    elif prefix is None and (cls in SFT_CLASSES or sft):
        _sft(d, tuple(sft) or "dataset._target_", cls)
    elif prefix is None and real:
        d.placeholder(real, "train.data", "synthetic", "real data (mock = false) that this file does not name (no data_path / blend: "
                      "the recipe's Python or the command line sets it)", '"megatron:PREFIX" of your data')
    elif prefix is None and _finetune_override(d):
        hints = tuple(k for k in FINETUNE_HINTS if d.has(k))
        d.placeholder(("dataset",) if d.has("dataset") else "(dataset)", "train.data", "synthetic",
                      f"a Megatron-Bridge fine-tuning override ({', '.join(hints)}) names no dataset: its SFT / PEFT recipe's is "
                      "SQuAD (recipes/common.py default_squad_config: Hugging Face 'squad' as prompt and answer, the loss on the "
                      f"answer tokens only, answer_only_loss); {NEED}", "your fine-tuning rows as hf-dataset:FILE?column=text")
    elif prefix is None and (d.get("dataset.mock") is True or d.get("model.data.mock_dataset") is True or d.has("dataset")):
        d.mapped(mock_keys or "(dataset)", ("train.data", "synthetic"),
                 note="mock data (no blend, blend_per_split or data_path: Megatron-Core's MockGPTDataset)")
    elif prefix is not None:
        _indexed(d, prefix)
    for key in ("model.tokenizer.model", "tokenizer.tokenizer_model"):
        if d.has(key) and key not in d.taken:
            d.none(key, "fp8launch reads a tokenizer.json (train.tokenizer), for megatron: data only the EOS id (megatron:PREFIX?eos=ID)")


def _finetune_override(d: Draft) -> bool:
    """An override file (no `_target_`) of a fine-tuning recipe: LoRA (`peft`), a pretrained checkpoint to start from."""
    return not d.has("dataset._target_") and any(d.has(k) for k in FINETUNE_HINTS)


def _sft(d: Draft, sources: str | tuple[str, ...], cls: str) -> None:
    name = (d.get("dataset.hf_dataset.dataset_name") or d.get("dataset.hf_dataset.path_or_dataset") or d.get("dataset.dataset_name"))
    root = d.get("dataset.dataset_root")
    if isinstance(name, str):
        what = f"the Hugging Face dataset {name}"
    elif isinstance(root, str):
        what = "the JSONL files (training.jsonl, validation.jsonl) of dataset_root"
    else:
        what = "the recipe's fine-tuning dataset"
    mask = d.get("dataset.dataset_kwargs.answer_only_loss", True) is not False
    loss = "the loss on the answer tokens only (answer_only_loss)" if mask else "the loss on every token (answer_only_loss false)"
    d.placeholder(sources, "train.data", "synthetic",
                  f"Megatron-Bridge's {cls or 'fine-tuning dataset'} trains on {what}, as prompt and answer rows, {loss}, each "
                  f"row padded or packed to the sequence; {NEED}", "your fine-tuning rows as hf-dataset:FILE?column=text")


def _nemo_sft(d: Draft) -> None:
    """NeMo 1.x fine-tuning / PEFT (NeMo-Framework-Launcher conf/fine_tuning, conf/peft; NeMo's GPTSFTDataset): JSONL rows of
    model.data.train_ds.context_key / label_key (not quoted: hidden.py takes `*_key` for secrets), the loss on the answer
    only where model.answer_only_loss."""
    ds = "model.data.train_ds."
    only = d.get("model.answer_only_loss", False) is True
    loss = "the loss on the answer tokens only (answer_only_loss)" if only else "the loss on every token"
    sources = tuple(k for k in (ds + "file_names", "model.answer_only_loss") if d.has(k))
    d.placeholder(sources, "train.data", "synthetic",
                  "NeMo's fine-tuning dataset (GPTSFTDataset) trains on JSONL rows of a prompt and an answer (the columns context_key "
                  f"and label_key name), "
                  f"{loss}; {NEED}", "your fine-tuning rows as hf-dataset:FILE?column=text")


def _indexed(d: Draft, prefix: str) -> None:
    value = d.get(prefix)
    paths = paths_of(value, prefix)
    interpolated = any("${" in p for p in paths)
    if len(paths) == 1 and not interpolated:
        path = paths[0]
        base = os.path.dirname(os.path.abspath(d.path))
        here = next((p for p in (path, os.path.join(base, path)) if os.path.isfile(p + ".idx") and os.path.isfile(p + ".bin")), None)
        if here:
            d.mapped(prefix, ("train.data", f"megatron:{here}"), note="a Megatron-Core indexed dataset (PREFIX.bin + PREFIX.idx)")
        else:
            d.placeholder(prefix, "train.data", f"megatron:{path}", "a Megatron-Core indexed dataset (PREFIX.bin + PREFIX.idx) that is "
                          "not on this machine (a cluster path): fp8launch reads it as megatron:PREFIX: copy it here or run "
                          "where it is, and set the prefix", '"megatron:PREFIX" where PREFIX.bin and PREFIX.idx are')
    else:
        d.placeholder(prefix, "train.data", "synthetic", f"a blend of {len(paths)} Megatron datasets"
                      + (" with ${...} interpolations" if interpolated else "")
                      + ': fp8launch reads one "megatron:PREFIX": merge them (Megatron\'s tools/merge_datasets.py) or pick one',
                      '"megatron:PREFIX" of your data')


def paths_of(value, key: str = "") -> list[str]:
    """The training dataset prefixes of a data_prefix / data_path / blend / blend_per_split: a string (data_path: split on
    spaces), [w, p, w, p...] or [p, p...], [[prefixes], [weights] | null] (blend), [train, valid, test] (blend_per_split),
    or {train: [...], ...} (NeMo)."""
    if key.endswith("blend_per_split") and isinstance(value, list):
        value = value[0] if value else []
    if isinstance(value, dict):
        value = value.get("train", [])
    if isinstance(value, str):
        value = value.split() if key.endswith("data_path") else [value]
    if isinstance(value, list):
        out: list[str] = []
        for x in value:
            if isinstance(x, str):
                out += [x]
            elif isinstance(x, list):
                out += [y for y in x if isinstance(y, str)]
        return [p for p in out if not _number(p)]
    return []


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
