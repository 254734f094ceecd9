"""A complete checkpoint of a run -> its high-precision weights by name, read in this one process,
without a process group, a few tensors at a time (`Weights.load`), never the optimizer moments.

    weights = open_weights("runs/NAME/checkpoints/step-500")
    weights.entries                    # clean name -> Entry(shape, dtype), as saved
    weights.load(["output.weight"])    # {name: plain CPU tensor}

- DDP and FSDP2 (tensor parallel or not): `model/` is a DCP checkpoint of the full-precision weights
  (checkpoint/dcp.py saved torchao's wrapper subclasses as the plain tensors they wrap). Its metadata
  gives every tensor's global shape; `torch.distributed.checkpoint.load(..., no_dist=True)` fills
  plain full-size tensors from every rank's shards (DCP reshards), in this process only.
- DeepSpeed ZeRO 1-3: DeepSpeed's own fp32 reconstruction from the optimizer partitions
  (`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`, lazy: ZeRO-3 tensors are
  gathered one at a time). ZeRO-0 has no partitions: the bf16/fp16 optimizer's fp32 copies (in the
  order of `module.parameters()`, which build_optimizer keeps, or its two groups with
  train.weight_decay_exclude), else the module's own weights.
  DeepSpeed pickles its own objects: reading needs deepspeed and unpickles the run's own files, as
  DeepSpeed's zero_to_fp32.py does.

Names are the model's own: `clean_fqn` removes what wrappers insert (compile's `_orig_mod`,
activation checkpointing, FSDP1), and DDP's `module.` when every name has it. TE's `_extra_state`
is never a weight: DCP keeps it out of `model/`, and it is dropped wherever else it shows up.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from launcher.errors import BackendMissing, InputError
from launcher.planning.install import INSTALL
from launcher.targets.checkpoint_record import UnreadableFile, unreadable_in
from launcher.train.checkpoint import DS_TAG, read_marker
from launcher.train.checkpoint.dcp import load_naming, naming_reader
from launcher.train.fqn import clean_fqn

from . import KEY

MASTER = "master_param"
"""The optimizer-state key of Transformer Engine FusedAdam's fp32 master copy (master_weights=True)."""
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""dtypes of high-precision weights; anything else (FP8 storage, packed bytes) cannot be exported as weights."""


@dataclass(frozen=True, slots=True)
class Entry:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Weights:
    """The weights of one checkpoint: `entries` (clean name -> Entry, in saved order) and `load`."""

    kind = ""
    """dcp | deepspeed"""

    def __init__(self, path: str, raw: dict[str, Entry]):
        self.path = path
        self.raw = raw
        """saved name -> Entry"""
        self._raw_of: dict[str, str] = {}
        self.entries: dict[str, Entry] = {}
        for raw_name, clean in _clean_names(raw).items():
            if clean.endswith("_extra_state"):
                continue
            if clean in self.entries:
                raise InputError(KEY, f"{path}: two tensors of the checkpoint are both named {clean} once wrapper names are removed",
                                 "export with --format torch from a checkpoint whose names are unique")
            self._raw_of[clean] = raw_name
            self.entries[clean] = raw[raw_name]

    def load(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """{name: plain CPU tensor of the saved dtype} for `names` (clean names of `entries`)."""
        raw = self._load([self._raw_of[n] for n in names])
        return {n: _plain(raw[self._raw_of[n]]) for n in names}

    def _load(self, raw_names: list[str]) -> dict[str, torch.Tensor]:
        raise NotImplementedError


def open_weights(checkpoint: str) -> Weights:
    """The weights of complete checkpoint folder `checkpoint` (`<output_dir>/checkpoints/step-N`)."""
    marker = read_marker(checkpoint)
    if marker is None:
        raise InputError(KEY, f"{checkpoint} is not a complete checkpoint (no readable COMPLETE.json)", "pick a complete one with --step")
    if marker.get("format", "dcp") == "deepspeed":
        return DeepSpeedWeights(os.path.join(checkpoint, "deepspeed"))
    return DcpWeights(os.path.join(checkpoint, "model"))


def _clean_names(raw: Iterable[str]) -> dict[str, str]:
    """raw name -> the model's own name (wrapper parts removed; DDP's `module.` when every name has it)."""
    names = list(raw)
    ddp = bool(names) and all(n.startswith("module.") for n in names)
    return {n: clean_fqn(n.removeprefix("module.") if ddp else n) for n in names}


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: torchao's training wrappers (float8 all-gather's WeightWithDynamicFloat8CastTensor,
    MX training's MXFP8TrainingWeightWrapperTensor) hold the high-precision weight in `_tensor` / `_data`."""
    while type(t) not in (torch.Tensor, torch.nn.Parameter):
        inner = getattr(t, "_tensor", None)
        if inner is None:
            inner = getattr(t, "_data", None)
        if not (isinstance(inner, torch.Tensor) and inner.shape == t.shape and inner.dtype == t.dtype):
            break
        t = inner
    return t.detach()


# -- DCP (DDP, FSDP2) -------------------------------------------------------------------------

class DcpWeights(Weights):
    kind = "dcp"

    def __init__(self, model_dir: str):
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        try:
            metadata = naming_reader(model_dir).read_metadata()
        except FileNotFoundError as e:
            raise InputError(KEY, f"cannot read the weights of {os.path.dirname(model_dir)} ({type(e).__name__}: {e})",
                             "export another checkpoint with --step") from e
        except UnreadableFile as e:
            raise _unreadable(os.path.dirname(model_dir), e) from e
        raw = {name: Entry(tuple(md.size), md.properties.dtype) for name, md in metadata.state_dict_metadata.items()
               if isinstance(md, TensorStorageMetadata)}
        super().__init__(os.path.dirname(model_dir), raw)
        self.model_dir = model_dir
        self._master_of: dict[str, str] = {}
        """raw name -> its master copy's name in optim/ (use_masters)."""

    def use_masters(self) -> list[str]:
        """Read each weight that has an optimizer master copy (Transformer Engine's FusedAdam `master_param`, kept in fp32
        for precision.te.fp8_params) from that copy in `optim/`: `model/` holds the FP8 weight itself (TE's Float8Tensor,
        pickled: its FP8 rounding, which DCP cannot even read as a plain tensor). Returns the clean names redirected."""
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        optim_dir = os.path.join(os.path.dirname(self.model_dir), "optim")
        try:
            metadata = naming_reader(optim_dir).read_metadata().state_dict_metadata
        except (FileNotFoundError, UnreadableFile):
            return []
        redirected = []
        for clean, raw in self._raw_of.items():
            md = metadata.get(f"state.{raw}.{MASTER}")
            if isinstance(md, TensorStorageMetadata) and tuple(md.size) == self.raw[raw].shape:
                self._master_of[raw] = f"state.{raw}.{MASTER}"
                self.raw[raw] = Entry(tuple(md.size), md.properties.dtype)
                self.entries[clean] = self.raw[raw]
                redirected.append(clean)
        return redirected

    def _load(self, raw_names: list[str]) -> dict[str, torch.Tensor]:
        masters = {n: self._master_of[n] for n in raw_names if n in self._master_of}
        state = self._load_from(self.model_dir, {n: n for n in raw_names if n not in masters})
        state.update(self._load_from(os.path.join(os.path.dirname(self.model_dir), "optim"), masters))
        return state

    def _load_from(self, folder: str, names: dict[str, str]) -> dict[str, torch.Tensor]:
        """{raw name: tensor} read from DCP folder `folder`, where it is saved under names[raw name]."""
        from torch.distributed.checkpoint.api import CheckpointException

        if not names:
            return {}
        state = {saved: torch.empty(self.raw[n].shape, dtype=self.raw[n].dtype) for n, saved in names.items()}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore")
            try:
                load_naming(state, folder, no_dist=True)
            except (Exception, CheckpointException) as e:
                unreadable = unreadable_in(e)
                if unreadable is None:
                    raise
                raise _unreadable(os.path.dirname(self.model_dir), unreadable) from e
        return {n: state[saved] for n, saved in names.items()}


def _unreadable(checkpoint: str, error: UnreadableFile) -> InputError:
    """A file of the checkpoint cannot be read (written before checkpoints recorded their files, or damaged since)."""
    return InputError(KEY, f"{checkpoint}: {error}", "export another checkpoint with --step, or restore this one from a copy")


# -- DeepSpeed ----------------------------------------------------------------------------------

class DeepSpeedWeights(Weights):
    kind = "deepspeed"

    def __init__(self, ds_dir: str):
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
        from launcher.train.engines.deepspeed_engine import without_mlflow

        try:
            with without_mlflow():
                from deepspeed.utils import zero_to_fp32
        except ImportError as e:
            raise BackendMissing("deepspeed", INSTALL["deepspeed"]) from e
        tag = _ds_tag(ds_dir)
        folder = os.path.join(ds_dir, tag)
        model_states = sorted(f for f in _listdir(folder) if f.endswith("_model_states.pt"))
        if not model_states:
            raise InputError(KEY, f"{folder} holds no DeepSpeed *_model_states.pt", "export another checkpoint with --step")
        first = _torch_load(os.path.join(folder, model_states[0]))
        if first.get("param_shapes") is None:  # ZeRO-0: no partitions to put together
            self._state = _zero0_state(first, folder)
        else:
            quiet = io.StringIO()  # zero_to_fp32 prints and draws tqdm bars; its errors still raise
            try:
                with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                    self._state = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(ds_dir, tag=tag, lazy_mode=True)
            except (OSError, ValueError, KeyError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
                raise InputError(KEY, f"DeepSpeed cannot rebuild the fp32 weights of {os.path.dirname(ds_dir)} ({e})",
                                 "export another checkpoint with --step") from e
        raw = {name: Entry(tuple(t.shape), t.dtype) for name, t in self._state.items()}
        super().__init__(os.path.dirname(ds_dir), raw)

    def _load(self, raw_names: list[str]) -> dict[str, torch.Tensor]:
        return {n: self._state[n].contiguous() for n in raw_names}  # ZeRO-3: a GatheredTensor put together here


def _ds_tag(ds_dir: str) -> str:
    try:
        with open(os.path.join(ds_dir, "latest"), encoding="utf-8") as f:
            return f.read().strip() or DS_TAG
    except OSError:
        return DS_TAG


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _torch_load(path: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)  # DeepSpeed pickles its own objects
    except Exception as e:
        raise InputError(KEY, f"cannot read {path} ({type(e).__name__}: {e})", "export another checkpoint with --step") from e


def _zero0_state(states: dict, folder: str) -> dict[str, torch.Tensor]:
    """ZeRO-0: the module's state dict, its parameters replaced by the bf16/fp16 optimizer's fp32 copies
    (`fp32_groups`, in build_optimizer's order: tied parameters once, buffers not at all). An fp32 run
    has no copies: its module weights are the weights."""
    module: dict[str, torch.Tensor] = states["module"]
    optimizer = states.get("optimizer")
    groups = optimizer.get("fp32_groups") if isinstance(optimizer, dict) else None
    if not groups:
        return dict(module)
    masters = [t for group in groups for t in group]
    buffers = set(states.get("buffer_names") or ())
    params, first_of = [], {}
    for name, t in module.items():
        if name in buffers:
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in first_of:  # a tied parameter: the optimizer holds it once
            continue
        first_of[ptr] = name
        params.append(name)
    # build_optimizer's order: module.parameters(), or with train.weight_decay_exclude its decaying group first and then
    # the one-dimensional parameters (launcher/train/optim.py param_groups; sorted() is stable)
    for order in (params, sorted(params, key=lambda n: module[n].ndim < 2)):
        fits = len(order) == len(masters) and all(
            module[n].shape == m.shape and torch.equal(m.to(module[n].dtype), module[n]) for n, m in zip(order, masters))
        if fits:
            params = order
            break
    if not fits:
        raise InputError(KEY, f"{folder}: the fp32 copies of DeepSpeed's ZeRO-0 optimizer do not line up with the module's parameters",
                         "read the bf16 weights the run trained with from the 'module' entry of mp_rank_00_model_states.pt "
                         "(torch.load(..., weights_only=False))")
    master_of = dict(zip(params, masters))
    return {name: master_of[first_of[t.untyped_storage().data_ptr()]] if name not in buffers else t for name, t in module.items()}
