"""Local Hugging Face causal LMs: `hf:PATH` names a model folder or a config.json file.

Nothing is ever downloaded. A folder with weights is loaded with
`from_pretrained(local_files_only=True)`; a config alone (a folder without weights, or a
config.json file) is built with random init by `from_config`, seeded by the caller. The
training entrypoint builds either from its config on the meta device and reads the weights one
module at a time later (hf_weights.py). The
model keeps its Hugging Face module names (so `precision.keep` globs read like the
model's own code) and returns its usual output object; `logits_of` takes the logits out.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

from launcher.errors import BackendMissing, InputError
from launcher.planning.install import INSTALL
from launcher.train.factory import resolve_path

KEY = "train.model"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise BackendMissing("transformers", INSTALL["transformers"]) from e
    return transformers


def _dtype_kwargs(transformers) -> dict:
    """fp32 weights whatever the config says (transformers renamed torch_dtype to dtype in 4.56)."""
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    return {"dtype": torch.float32} if (major, minor) >= (4, 56) else {"torch_dtype": torch.float32}


def locate(path: str, spec_dir: str) -> tuple[str, str, str | None]:
    """(what `path` names, its config.json, the folder of its weights or None: a config alone)."""
    found = resolve_path(path, spec_dir, KEY)
    folder, config_file = (found, os.path.join(found, "config.json")) if os.path.isdir(found) else (os.path.dirname(found), found)
    if not os.path.isfile(config_file):
        raise InputError(
            KEY, f"'{found}' has no config.json", "point hf: at a Hugging Face model folder (with config.json) or at a config.json file"
        )
    has_weights = os.path.isdir(found) and any(os.path.exists(os.path.join(folder, f)) for f in WEIGHT_FILES)
    return found, config_file, folder if has_weights else None


def build_hf(path: str, spec_dir: str, *, meta: bool = False) -> nn.Module:
    """The causal LM at local `path` (folder or config.json), in fp32 on the CPU, in train mode.
    `meta`: built from its config on the meta device (no storage), weights or not: its
    `_init_weights` or its weights files (launcher.train.models.hf_weights) initialise it later."""
    found, config_file, weights = locate(path, spec_dir)
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(config_file, local_files_only=True)
        config.use_cache = False  # training: no key/value cache
        if weights and not meta:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                weights, config=config, local_files_only=True, **_dtype_kwargs(transformers)
            )
        else:
            with torch.device("meta") if meta else contextlib.nullcontext():
                model = transformers.AutoModelForCausalLM.from_config(config, **_dtype_kwargs(transformers))
    except (OSError, ValueError, KeyError) as e:
        raise InputError(
            KEY,
            f"transformers cannot build a causal LM from '{found}': {e}",
            "use a config.json of a model type this transformers version knows (a *ForCausalLM architecture), "
            "or wrap the model in a factory and use py:module:function",
        ) from e
    model.train()
    model.vocab_size = int(config.vocab_size)
    return model


def hf_blocks(model: nn.Module) -> list[nn.Module]:
    """A Hugging Face model's repeated decoder blocks: `<base>.layers` where it exists,
    else the first ModuleList whose children are all of one class."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None) or model
    layers = getattr(base, "layers", None)
    if isinstance(layers, nn.ModuleList):
        return list(layers)
    return first_block_list(model)


def first_block_list(model: nn.Module) -> list[nn.Module]:
    """The first ModuleList (in module order) holding modules of one class that have parameters."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module):
            kinds = {type(m) for m in module}
            if len(kinds) == 1 and any(True for _ in module[0].parameters()):
                return list(module)
    return []
