"""Writing an export: safetensors shards and their index as transformers writes them, or one
torch.save file; in a temporary folder beside the target, renamed onto it when complete.

Shards follow huggingface_hub's split_torch_state_dict_into_shards (what save_pretrained calls):
tensors in model order fill a shard until the next would pass `max_shard_size` (a tensor larger
than that gets a shard of its own); one shard is `model.safetensors`, several are
`model-00001-of-0000N.safetensors` with `model.safetensors.index.json` ({"metadata": {"total_size",
"total_parameters"}, "weight_map": {name: file}}). Each shard's tensors are read from the checkpoint
when its turn comes, so memory holds one shard, not the model.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from launcher.errors import BackendMissing, EnvironmentProblem, InputError
from launcher.planning.install import INSTALL
from launcher.train.checkpoint import _fsync_dir, _fsync_tree

from . import MARKER, exported_files, is_export
from .read import Weights

SAFETENSORS, INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_FILE = "model.pt"


class Progress:
    """One line per unit of work: "export: shard 2/5 (...) | 410 MiB/s | 12 s left"."""

    def __init__(self, what: str, sizes: list[int], echo: Callable[[str], None]):
        self.what, self.sizes, self.echo = what, sizes, echo
        self.start = time.monotonic()
        self.done_bytes = 0

    def step(self, i: int, detail: str) -> None:
        self.done_bytes += self.sizes[i]
        elapsed = max(time.monotonic() - self.start, 1e-6)
        rate = self.done_bytes / elapsed
        left = (sum(self.sizes) - self.done_bytes) / rate if rate else 0.0
        self.echo(f"export: {self.what} {i + 1}/{len(self.sizes)} {detail} ({_size(self.sizes[i])}) | "
                  f"{_size(rate)}/s | {left:.1f} s left")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def out_dtype(entry_dtype: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """Floating tensors take the export's dtype; integer buffers keep theirs."""
    return dtype if entry_dtype.is_floating_point else entry_dtype


def split(sizes: list[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Names in order -> shards, as huggingface_hub splits a state dict."""
    shards: list[list[str]] = []
    current: list[str] = []
    current_bytes = 0
    for name, n in sizes:
        if n > max_bytes:
            shards.append([name])
            continue
        if current and current_bytes + n > max_bytes:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(name)
        current_bytes += n
    if current:
        shards.append(current)
    return shards


def _converted(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of its own (no storage shared with the checkpoint's flat buffers), contiguous, in `dtype`."""
    return t.to(dtype=out_dtype(t.dtype, dtype), copy=True).contiguous()


def write_safetensors(folder: str, weights: Weights, names: dict[str, str], dtype: torch.dtype, max_bytes: int,
                      echo: Callable[[str], None], quantized: dict | None = None) -> list[str]:
    """Our name -> Hugging Face name `names`, read from `weights`, written as shards (+ index) into `folder`.
    `quantized`: {Hugging Face weight name: quant.Format} of the Linears written in FP8, each `weight` as float8 codes
    with its scale beside it (`weight_scale_inv` / `weight_scale`), computed from the fp32 of the weight read; the two
    always share a shard."""
    try:
        from safetensors.torch import save_file
    except ImportError as e:
        raise BackendMissing("safetensors", INSTALL["safetensors"]) from e
    quantized = quantized or {}
    ours_of = {hf: ours for ours, hf in names.items()}
    nbytes = {}
    for ours, hf in names.items():
        entry = weights.entries[ours]
        fmt = quantized.get(hf)
        if fmt is None:
            nbytes[hf] = entry.numel * out_dtype(entry.dtype, dtype).itemsize
            continue
        rows, cols = fmt.scale_shape(*entry.shape)
        nbytes[hf] = entry.numel + rows * cols * fmt.scale_dtype.itemsize  # one byte a code, and the scale
    shards = split([(hf, nbytes[hf]) for hf in names.values()], max_bytes)
    files = [SAFETENSORS] if len(shards) == 1 else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    progress = Progress("shard", [sum(nbytes[h] for h in shard) for shard in shards], echo)
    weight_map = {}
    for i, (file, shard) in enumerate(zip(files, shards)):
        loaded = weights.load([ours_of[h] for h in shard])
        tensors = {}
        for h in shard:
            fmt = quantized.get(h)
            if fmt is None:
                tensors[h] = _converted(loaded[ours_of[h]], dtype)
                continue
            codes, scale = fmt.quantize(loaded[ours_of[h]].to(torch.float32))
            tensors[h] = codes.contiguous()
            tensors[f"{h.removesuffix('weight')}{fmt.scale_name}"] = scale.contiguous()
        del loaded
        save_file(tensors, os.path.join(folder, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        del tensors
        progress.step(i, f"{file}, {len(shard)} tensors")
    if len(shards) > 1:
        parameters = sum(weights.entries[ours].numel for ours in names)
        index = {"metadata": {"total_parameters": parameters, "total_size": sum(nbytes.values())}, "weight_map": weight_map}
        write_json(os.path.join(folder, INDEX), index)
        files.append(INDEX)
    return files


def write_torch(folder: str, weights: Weights, names: list[str], dtype: torch.dtype, max_bytes: int,
                echo: Callable[[str], None]) -> list[str]:
    """One `model.pt`: torch.save of {our name: tensor}, read group by group."""
    nbytes = {n: weights.entries[n].numel * out_dtype(weights.entries[n].dtype, dtype).itemsize for n in names}
    groups = split([(n, nbytes[n]) for n in names], max_bytes)
    progress = Progress("tensor group", [sum(nbytes[n] for n in g) for g in groups], echo)
    state: dict[str, torch.Tensor] = {}
    for i, group in enumerate(groups):
        state.update({n: _converted(t, dtype) for n, t in weights.load(group).items()})
        progress.step(i, f"{len(group)} tensors")
    torch.save({n: state[n] for n in names}, os.path.join(folder, TORCH_FILE))
    echo(f"export: wrote {TORCH_FILE} ({_size(sum(nbytes.values()))})")
    return [TORCH_FILE]


def write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def check_target(out: str) -> None:
    """`out` may be written: absent, an empty folder, or an earlier export of ours holding only what that export wrote
    (its marker lists it), which is replaced whole. A link is refused: the folder replaces whatever is at `out`."""
    if os.path.islink(out):
        raise InputError("--out", f"{out} is a symbolic link (to {os.readlink(out)}), and an export replaces --out whole",
                         "give the folder it leads to, or a new path")
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise InputError("--out", f"{out} is a file", "give a folder path that does not exist yet")
    present = sorted(os.listdir(out))
    if present and not is_export(out):
        raise InputError("--out", f"{out} already holds files that are not an fp8launch export (no {MARKER})",
                         "give a new or empty folder, or remove that one")
    foreign = [name for name in present if name not in exported_files(out)]
    if foreign:
        raise InputError("--out", f"{out} holds an earlier export and {os.path.join(out, foreign[0])}, which that export did "
                         f"not write{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''}, and an export replaces "
                         "the folder whole", "move it away, or give a new or empty folder")


@contextmanager
def staged(out: str):
    """A temporary folder beside `out` to write into; renamed onto `out` when the block ends, removed
    (with the parent folders it created) when it raises. An earlier export in `out` is replaced."""
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    created = []
    probe = parent
    while not os.path.exists(probe):
        created.append(probe)
        probe = os.path.dirname(probe)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(out)}-", dir=parent)
    except OSError as e:
        raise EnvironmentProblem(f"cannot write into {parent} ({e}); fix: give --out a folder you can write to") from e
    try:
        yield tmp
        _fsync_tree(tmp)
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in created:  # innermost first
            try:
                os.rmdir(folder)
            except OSError:
                break
        raise


def _publish(tmp: str, out: str) -> None:
    check_target(out)
    old = None
    if os.path.isdir(out):
        if os.listdir(out):  # an earlier export of ours: moved aside, then removed
            old = tempfile.mkdtemp(prefix=f".trash-{os.path.basename(out)}-", dir=os.path.dirname(out))
            os.replace(out, os.path.join(old, "export"))
        else:
            os.rmdir(out)
    os.replace(tmp, out)
    _fsync_dir(os.path.dirname(out))
    if old:
        shutil.rmtree(old, ignore_errors=True)
