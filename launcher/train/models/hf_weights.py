"""A Hugging Face folder's weights read one module at a time, so that a model built on the meta device
starts from them without any rank holding the whole checkpoint (launcher/train/materialize.py):

    reader = CheckpointReader(folder)                # the index only: which file holds which tensor
    init = CheckpointInit(reader, model)             # a materialize Initializer: name, module -> loads
    materialize(model, device, init, seed=...)       # each module's full tensors read, each rank keeps its part

safetensors files (one, or sharded with model.safetensors.index.json) are read tensor by tensor
with plain reads at the offsets their header gives (`SafetensorsFile`): memory-mapping them
(safetensors' safe_open) would leave every page read mapped into every rank, whose resident memory
then grows to the whole checkpoint (measured: 1.53x one fp32 copy per rank at world 4, against
0.52x from a config alone). pytorch_model.bin files (one or sharded) can only be memory-mapped
(torch.load(mmap=True, weights_only=True)): only what is copied is read, but those pages stay mapped
(shared page cache, which the kernel can reclaim, yet counted in each rank's resident memory). Parameters the files do
not have (a new head, a checkpoint of another variant) and buffers that are not saved (rotary
inv_freq) come from the model's own `_init_weights`, as `from_pretrained` does; what is missing or
left unused is said once (`notes`).
"""

from __future__ import annotations

import json
import os
from typing import Callable

import torch
from torch import nn

from launcher.errors import InputError

KEY = "train.model"
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


class CheckpointReader:
    """Which file of `folder` holds each tensor, and the tensor itself on demand (CPU, its saved dtype)."""

    def __init__(self, folder: str):
        self.folder = folder
        self._open: dict[str, object] = {}
        self.files: dict[str, str] = self._index()
        """tensor name -> file name (in `folder`)."""

    def _index(self) -> dict[str, str]:
        for index in (SAFETENSORS_INDEX, BIN_INDEX):
            path = os.path.join(self.folder, index)
            if os.path.isfile(path):
                try:
                    with open(path, encoding="utf-8") as f:
                        return dict(json.load(f)["weight_map"])
                except (OSError, ValueError, KeyError) as e:
                    raise InputError(KEY, f"'{path}' is not a weights index ({e})", "re-save the model with save_pretrained") from e
        for single in (SAFETENSORS, BIN):
            if os.path.isfile(os.path.join(self.folder, single)):
                return {name: single for name in self._handle(single).keys()}
        raise InputError(KEY, f"'{self.folder}' has no weights ({SAFETENSORS}, {BIN} or their index)",
                         "point hf: at a folder saved with save_pretrained, or at its config.json to start from random weights")

    def _handle(self, file: str):
        handle = self._open.get(file)
        if handle is None:
            path = os.path.join(self.folder, file)
            if file.endswith(".safetensors"):
                handle = SafetensorsFile(path)
            else:  # memory-mapped: a tensor is read when it is copied
                handle = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            self._open[file] = handle
        return handle

    def get(self, name: str) -> torch.Tensor:
        handle = self._handle(self.files[name])
        return handle.get_tensor(name) if hasattr(handle, "get_tensor") else handle[name]


class SafetensorsFile:
    """One .safetensors file: its header (8 bytes of length, then JSON: dtype, shape and byte offsets of
    each tensor), and each tensor read on its own into fresh memory, without mapping the file."""

    DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
        except (OSError, ValueError) as e:
            raise InputError(KEY, f"'{path}' is not a safetensors file ({e})", "re-save the model with save_pretrained") from e
        header.pop("__metadata__", None)
        self.header = header
        self.base = 8 + size

    def keys(self):
        return self.header.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        info = self.header[name]
        start, end = info["data_offsets"]
        dtype = self.DTYPES.get(info["dtype"])
        if dtype is None:
            raise InputError(KEY, f"{name} in {self.path} has dtype {info['dtype']}, which fp8launch does not read",
                             "re-save the model in fp32, bf16 or fp16")
        data = bytearray(end - start)
        with open(self.path, "rb") as f:
            f.seek(self.base + start)
            if f.readinto(data) != len(data):
                raise InputError(KEY, f"{self.path} ends inside {name}", "copy the weights again: the file is truncated")
        if not data:
            return torch.empty(info["shape"], dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(info["shape"])


class CheckpointInit:
    """A materialize Initializer: a module's own tensors from the checkpoint; what it lacks from the
    model's own `_init_weights` (called on the module only then). Names follow the model's state_dict;
    a checkpoint saved with or without the base model's prefix (`model.`) is read either way."""

    def __init__(self, reader: CheckpointReader, model: nn.Module, fallback: Callable[[str, nn.Module], None]):
        self.reader = reader
        self.fallback = fallback
        self.prefix = getattr(model, "base_model_prefix", "") or ""
        expected = _expected(model)
        self.keys = {name: self._find(name) for name in expected}
        missing = sorted(n for n, k in self.keys.items() if k is None)
        unused = sorted(set(reader.files) - {k for k in self.keys.values() if k})
        self.notes: list[str] = []
        if missing:
            self.notes.append(f"{KEY}: {len(missing)} parameter(s) are not in {reader.folder} and start from the model's own "
                              f"init: {_few(missing)}")
        if unused:
            self.notes.append(f"{KEY}: {len(unused)} tensor(s) of {reader.folder} belong to no parameter of the model and are "
                              f"not used: {_few(unused)}")

    def _find(self, name: str) -> str | None:
        p = self.prefix
        for key in (name, name[len(p) + 1:] if p and name.startswith(p + ".") else f"{p}.{name}" if p else name):
            if key in self.reader.files:
                return key
        return None

    def __call__(self, name: str, module: nn.Module) -> None:
        own = [(n, t) for n, t in list(module._parameters.items()) + list(module._buffers.items()) if t is not None]
        found = {n: self.keys.get(f"{name}.{n}" if name else n) for n, _ in own}
        if not all(found.values()):  # something the files do not hold: the model's rule first
            self.fallback(name, module)
        with torch.no_grad():
            for n, t in own:
                key = found[n]
                if key is not None:
                    saved = self.reader.get(key)
                    if tuple(saved.shape) != tuple(t.shape):
                        raise InputError(KEY, f"{key} in {self.reader.folder} has shape {tuple(saved.shape)}, the model built from "
                                         f"its config.json expects {tuple(t.shape)}", "use the config.json saved with these weights")
                    t.copy_(saved)


def _expected(model: nn.Module) -> list[str]:
    """The names a checkpoint holds for `model`: parameters (a tied one once, under its first name) and
    persistent buffers."""
    seen: set[int] = set()
    names = []
    for fqn, module in model.named_modules():
        for n, p in module._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                names.append(f"{fqn}.{n}" if fqn else n)
        for n, b in module._buffers.items():
            if b is not None and n not in module._non_persistent_buffers_set:
                names.append(f"{fqn}.{n}" if fqn else n)
    return names


def _few(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
