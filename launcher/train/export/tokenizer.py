"""The tokenizer a run used, for its Hugging Face export: which files to copy, and its EOS id.

In order: `train.tokenizer` (a tokenizer.json, or a folder with one: launcher/train/data/tokenizer.py reads it
as the run did); else the tokenizer files of an hf: model's folder; else the tokenizer.json beside text:
data (which text: tokenizes with). With the tokenizer.json come the other tokenizer files of its folder
(tokenizer_config.json, special_tokens_map.json, ...), which say its special tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from launcher.errors import InputError, with_fix
from launcher.train.data.tokenizer import beside_text, load_tokenizer
from launcher.train.factory import resolve_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "vocab.txt", "spiece.model", "chat_template.jinja", "chat_template.json")
"""The files a Hugging Face tokenizer folder may hold; those present are copied."""


@dataclass
class RunTokenizer:
    copies: list[tuple[str, str]] = field(default_factory=list)
    """(source file, name in the export folder)."""
    eos: int | None = None
    """Its EOS id where fp8launch reads one (train.tokenizer, text:'s tokenizer.json); None otherwise."""
    notes: list[str] = field(default_factory=list)
    """Warnings for the user (a tokenizer gone since the run)."""


def run_tokenizer(plan, spec_dir: str) -> RunTokenizer:
    t = plan.train
    if t.tokenizer:
        try:
            tok = load_tokenizer(t.tokenizer, spec_dir)
        except InputError as e:
            return RunTokenizer(notes=["warning: " + with_fix(f"{e.key}: {e.detail}; the export has no tokenizer files", e.fix)])
        return RunTokenizer(copies=_with_folder(tok.file), eos=tok.eos)
    if t.model.startswith("hf:"):
        from launcher.train.models.hf import locate

        found, config_file, _ = locate(t.model[3:], spec_dir)
        folder = found if os.path.isdir(found) else os.path.dirname(config_file)
        copies = [(os.path.join(folder, n), n) for n in TOKENIZER_FILES if os.path.isfile(os.path.join(folder, n))]
        if copies:
            return RunTokenizer(copies=copies)  # the model's own config.json and generation_config.json name its tokens
    if t.data.startswith("text:"):
        try:
            beside = beside_text(resolve_path(t.data[5:], spec_dir, "train.data"))
        except InputError:
            return RunTokenizer()
        if beside:
            tok = load_tokenizer(beside, spec_dir, "train.data")
            return RunTokenizer(copies=_with_folder(tok.file), eos=tok.eos)
    return RunTokenizer()


def _with_folder(tokenizer_json: str) -> list[tuple[str, str]]:
    """The tokenizer.json (under that name) and the other tokenizer files beside it."""
    folder = os.path.dirname(os.path.abspath(tokenizer_json))
    return [(tokenizer_json, "tokenizer.json")] + [
        (os.path.join(folder, n), n) for n in TOKENIZER_FILES[1:] if os.path.isfile(os.path.join(folder, n))]
