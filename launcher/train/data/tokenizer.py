"""The tokenizer a plan names (`train.tokenizer`): a tokenizer.json, or a folder holding one (a Hugging Face
tokenizer folder, as `save_pretrained` writes it). Read with the `tokenizers` library, never transformers.

Its end-of-text id (EOS), which hf-dataset: and megatron: put between documents, is, in order:
the `eos_token` of tokenizer_config.json (else special_tokens_map.json) beside the tokenizer.json;
else the first special token of tokenizer.json named one of EOS_NAMES; else none.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from launcher.errors import BackendMissing, InputError
from launcher.planning.install import INSTALL
from launcher.train.factory import resolve_path

KEY = "train.tokenizer"
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")
"""Special tokens taken for the EOS when no tokenizer_config.json names one (GPT-2/Qwen, Llama 3, Llama 2/Mistral, Gemma, ...)."""
CONFIGS = ("tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer and the facts the data layer needs from it."""

    tokenizer: Any
    """The `tokenizers.Tokenizer`."""
    file: str
    """The tokenizer.json it was read from."""
    eos: int | None
    """The end-of-text id; None when the tokenizer has none."""
    digest: str
    """The first 16 hex digits of the tokenizer.json's sha256 (what a resume checks)."""

    def describe(self) -> str:
        return f"{self.file}, EOS id {self.eos}" if self.eos is not None else f"{self.file}, no EOS token"


def tokenizer_file(path: str, spec_dir: str, key: str = KEY) -> str:
    """The tokenizer.json `path` names: the file itself, or the tokenizer.json in the folder."""
    found = resolve_path(path, spec_dir, key)
    if os.path.isdir(found):
        inner = os.path.join(found, "tokenizer.json")
        if not os.path.isfile(inner):
            raise InputError(
                key, f"the folder {found} holds no tokenizer.json (a sentencepiece-only tokenizer.model is not read)",
                "point train.tokenizer at a tokenizer.json, or at a folder a fast tokenizer's save_pretrained() wrote",
            )
        return inner
    return found


def _configured_eos(folder: str, tok, key: str) -> tuple[bool, int | None]:
    """(whether a config file beside tokenizer.json names the EOS, its id)."""
    for name in CONFIGS:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError(key, f"cannot read {path} ({e})", f"fix or remove {name}") from e
        if not isinstance(config, dict) or "eos_token" not in config:
            continue
        token = config["eos_token"]
        token = token.get("content") if isinstance(token, dict) else token
        if token is None:
            return True, None
        token_id = tok.token_to_id(str(token))
        if token_id is None:
            raise InputError(key, f"{path} names eos_token {token!r}, which the tokenizer.json beside it does not hold",
                             f"correct eos_token in {name}, or use the tokenizer.json it was saved with")
        return True, token_id
    return False, None


def eos_id(tok, folder: str, key: str = KEY) -> int | None:
    """The EOS id of `tok` (a tokenizers.Tokenizer read from a tokenizer.json in `folder`); see the module doc."""
    named, token_id = _configured_eos(folder, tok, key)
    if named:
        return token_id
    special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return next((special[name] for name in EOS_NAMES if name in special), None)


def beside_text(text_path: str) -> str | None:
    """The tokenizer.json in the folder of a text: data file, which text: tokenizes with when train.tokenizer is unset."""
    path = os.path.join(os.path.dirname(os.path.abspath(text_path)), "tokenizer.json")
    return path if os.path.isfile(path) else None


def load_tokenizer(path: str, spec_dir: str, key: str = KEY) -> Tokenizer:
    """The tokenizer `path` (plan.train.tokenizer) names, resolved like every plan path (factory.resolve_path);
    its errors name `key` (train.data for text:'s tokenizer.json beside the text)."""
    file = tokenizer_file(path, spec_dir, key)
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError as e:
        raise BackendMissing("tokenizers", INSTALL["tokenizers"]) from e
    try:
        with open(file, "rb") as f:
            raw = f.read()
        tok = HFTokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises its own (pyo3) exception types for a bad file
        raise InputError(key, f"cannot read {file} as a tokenizer.json ({type(e).__name__}: {e})",
                         "use a tokenizer.json that a fast (Rust) tokenizer saved") from e
    return Tokenizer(tok, file, eos_id(tok, os.path.dirname(file), key), hashlib.sha256(raw).hexdigest()[:16])
