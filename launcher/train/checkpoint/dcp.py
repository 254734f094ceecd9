"""The DCP half of checkpoint.py (DDP, FSDP2): weights and optimizer state through
torch.distributed.checkpoint, sharded, with plain tensors and the FP8 extra state kept apart."""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from launcher.targets.checkpoint_record import UnreadableFile, unreadable_in
from launcher.train.precision import te_state

# -- DCP (DDP, FSDP2) ---------------------------------------------------------------------

FLAT, NESTED = "flat", "nested"
"""How the optimizer state is laid out in `optim/` (the checkpoint marker's "optimizer_layout"; absent: nested). Nested
is torch's optimizer state_dict: "param_groups" a list, each group naming its parameters, which DCP writes once, from
one rank. A pipeline stage's groups hold its own parameters only, so under pipeline parallelism the state is flat
(StateDictOptions.flatten_optimizer_state_dict, as torchtitan saves it): every setting per parameter name, written by
the stage that holds it."""


def _optim_options(layout: str):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=layout == FLAT)


def _save_dcp(tmp: str, model, optimizer, layout: str = NESTED) -> tuple[bool, dict, str]:
    """Weights and optimizer state, sharded. Returns whether torchao float8 weights carried
    precomputed scales (loading recomputes them), this rank's modules' `_extra_state` (Transformer
    Engine modules' empty: their scaling state goes to the rank file as plain tensors, te_state.py;
    any other module's as it gives it), and the optimizer state's layout (FLAT or NESTED)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    with te_state.empty_extra_state(model):  # never TE's pickle, which TE 2.x refuses to load back
        state = get_model_state_dict(model)
    weights, extra_state = _split_extra_state(_plain(state))
    dcp.save(weights, checkpoint_id=os.path.join(tmp, "model"))
    if optimizer is not None:
        optim = get_optimizer_state_dict(model, optimizer, options=_optim_options(layout))
        dcp.save(_plain(optim), checkpoint_id=os.path.join(tmp, "optim"))
    scales = any(w._precomputed_scale is not None for w in _float8_weights(model))
    return scales, extra_state, layout


def _load_dcp(path: str, model, optimizer, extra_state: dict, float8_precomputed_scale: bool, layout: str = NESTED) -> None:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights, wanted = _split_extra_state(_plain(get_model_state_dict(model)))
    load_naming(weights, os.path.join(path, "model"))
    if wanted.keys() != extra_state.keys():
        raise ValueError(f"the model's FP8 extra state ({len(wanted)} modules) is not the saved one ({len(extra_state)} modules)")
    set_model_state_dict(model, {**weights, **extra_state})
    if optimizer is not None:
        options = _optim_options(layout)  # the layout the checkpoint was written in, whatever this run's
        state = _plain(get_optimizer_state_dict(model, optimizer, options=options))
        load_naming(state, os.path.join(path, "optim"))
        set_optimizer_state_dict(model, optimizer, state, options=options)
    _restore_float8_scales(model, float8_precomputed_scale)


def load_naming(state: dict, folder: str, **kwargs) -> None:
    """dcp.load of `state` from DCP folder `folder` (model/ or optim/); a file that cannot be read raises
    record.UnreadableFile naming it (inside DCP's CheckpointException, or as itself where DCP kept only its text)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = naming_reader(folder)
    try:
        dcp.load(state, storage_reader=reader, **kwargs)
    except (Exception, CheckpointException) as e:
        if reader.fs.failed is not None and unreadable_in(e) is None:  # e.g. the metadata: DCP re-raises its text only
            raise reader.fs.failed from e
        raise


def naming_reader(folder: str):
    """DCP's FileSystemReader of `folder`, whose read errors name the file (record.UnreadableFile,
    "model/__0_0.distcp cannot be read (...)"); the first is kept in `reader.fs.failed`."""
    from torch.distributed.checkpoint import FileSystemReader

    reader = FileSystemReader(folder)
    reader.fs = _NamingFileSystem(reader.fs, os.path.dirname(os.path.abspath(folder)))
    return reader


class _NamingFileSystem:
    """DCP's FileSystem; what goes wrong reading one of its files raises UnreadableFile (the path relative to the
    checkpoint). Not a missing file (DCP looks for optional ones) nor DCP's own AssertionError (shapes that differ)."""

    def __init__(self, fs, root: str):
        self._fs, self._root = fs, root
        self.failed: UnreadableFile | None = None

    def __getattr__(self, name):
        return getattr(self._fs, name)

    @contextmanager
    def create_stream(self, path, mode: str):
        try:
            with self._fs.create_stream(path, mode) as stream:
                yield stream
        except (FileNotFoundError, AssertionError):
            raise
        except Exception as e:  # torch.load and pickle.load raise many kinds on torn bytes
            if "r" not in mode:
                raise
            failed = UnreadableFile.of(os.path.relpath(path, self._root).replace(os.sep, "/"), e)
            self.failed = self.failed or failed
            raise failed from e


def _plain(tree):
    """State dict values as plain tensors (DTensors of plain tensors). torchao's float8 all-gather
    wraps FSDP2 weights in WeightWithDynamicFloat8CastTensor (its MX training every weight in
    MXFP8TrainingWeightWrapperTensor), which DCP would pickle as that class:
    the checkpoint would then need torchao (and weights_only=False) to read. The wrapper holds
    the high-precision weight itself in `_tensor`, same dtype and shape: save that, sharing memory."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map_only

    def inner(t: torch.Tensor) -> torch.Tensor:
        while type(t) not in (torch.Tensor, torch.nn.Parameter):
            # `_tensor`: float8's WeightWithDynamicFloat8CastTensor; `_data`: the MX training weight wrapper
            # (torchao/prototype/moe_training/tensor.py), which also holds the high-precision weight
            wrapped = getattr(t, "_tensor", None)
            if wrapped is None:
                wrapped = getattr(t, "_data", None)
            if not (isinstance(wrapped, torch.Tensor) and wrapped.dtype == t.dtype and wrapped.shape == t.shape):
                break  # a quantized container (e.g. TE's Float8Tensor) is not a wrapper: keep it
            t = wrapped
        return t

    def plain(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, DTensor):
            local = inner(t._local_tensor)
            if local is t._local_tensor:
                return t
            return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
        return inner(t)

    return tree_map_only(torch.Tensor, plain, tree)


def _split_extra_state(state: dict) -> tuple[dict, dict]:
    """(weights, extra state). Modules' `_extra_state` is per rank and may change size, which DCP cannot
    load into: it goes to the rank files, and `model/` holds the weights only."""
    weights = {k: v for k, v in state.items() if not k.endswith("._extra_state") and k != "_extra_state"}
    return weights, {k: v for k, v in state.items() if k not in weights}


def _float8_weights(model) -> list:
    """torchao WeightWithDynamicFloat8CastTensor locals of the model's FSDP2 parameters (float8 all-gather)."""
    from torch.distributed.tensor import DTensor

    out = []
    for p in model.parameters():
        local = p._local_tensor if isinstance(p, DTensor) else p
        if hasattr(local, "_precomputed_scale") and hasattr(local, "_tensor"):
            out.append(local)
    return out


def _restore_float8_scales(model, precomputed: bool) -> None:
    """Scales precomputed before the save are recomputed from the loaded weights (as the run did
    after its last optimizer step); stale scales from before the load are dropped."""
    weights = _float8_weights(model)
    for w in weights:
        w._precomputed_scale = None
    if weights and precomputed:
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)
