"""Transformer Engine's FP8 scaling state in a checkpoint, as plain tensors.

Delayed scaling computes each step's FP8 scales from the amax history of the steps before it: a
resumed run that lost that history would train on other scales than the uninterrupted one. TE 2.x
keeps it in each module's `fp8_meta` (module/base.py, TransformerEngineBaseModule):

    fp8_meta["scaling_fwd"].scale          (3 x num_gemms,)   input, weight, output of each GEMM
    fp8_meta["scaling_fwd"].amax_history   (amax_history_len, 3 x num_gemms)
    fp8_meta["scaling_bwd"].scale          (2 x num_gemms,)   grad_output, grad_input
    fp8_meta["scaling_bwd"].amax_history   (amax_history_len, 2 x num_gemms)

and saves it as `_extra_state`: `torch.frombuffer(pickle.dumps({...}), uint8)`, which its own
`set_extra_state` refuses to unpickle unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1
(module/_extra_state.py, should_load_extra_state_pickle: "Refusing to load pickled Transformer Engine
extra state ..."). Stateless recipes (current, block, mxfp8, nvfp4) save an empty payload.

So fp8launch never checkpoints TE's pickle: `scaling_state` reads the tensors through TE's own
`get_fp8_meta_tensors()` into the rank file (plain tensors, read back with weights_only), and
`restore_scaling_state` puts them back the way TE's set_extra_state does (the recipe into
`fp8_meta`, `init_fp8_meta_tensors(recipe)`) and copies them in with TE's `reset_fp8_meta_tensors`.
At the first forward TE keeps them (set_meta_tensor returns early for an initialised delayed-scaling
state) and sets the run's own recipe. The modules' `_extra_state` entries are saved empty
(`empty_extra_state`), the payload TE ignores.

te.DotProductAttention under Float8CurrentScaling with fp8_dpa (attention/dot_product_attention/
dot_product_attention.py, init_fp8_metadata and set_meta_tensor, NVTE_DPA_FP8_RECIPE unset) keeps the run's recipe for
Q/K/V, O, dO, dQKV and a DelayedScaling (amax_history_len 1, "most_recent") for S and dP: its recipes are
[current, delayed] with num_gemms [2, 1], and fp8_meta holds the delayed one's state, one GEMM's worth (scale (3,),
(2,)) under num_gemms 3. That state is restored with the same two recipes: allocated for three GEMMs, as one recipe
would, its 3 scales would not fit the 9 slots, and TE would keep delayed-scaling quantizers for Q/K/V at the first
forward (set_meta_tensor returns early for the delayed state it finds).

Duck-typed on those TE methods: no TE import here (the tests' stand-in has the same methods).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn

from launcher.train.fqn import clean_fqn

REFUSAL = "Refusing to load pickled Transformer Engine extra state"
"""How TE 2.x's set_extra_state starts its refusal (module/_extra_state.py, extra_state_pickle_advisory)."""
UNSAFE_PICKLE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"

_TENSORS = ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")
_TE_METHODS = ("get_fp8_meta_tensors", "reset_fp8_meta_tensors", "init_fp8_meta_tensors", "get_extra_state")


def te_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name as built, module) of every module holding TE FP8 metadata (te.Linear, te.DotProductAttention, ...)."""
    return [(clean_fqn(fqn), m) for fqn, m in model.named_modules()
            if isinstance(getattr(m, "fp8_meta", None), dict) and all(callable(getattr(m, a, None)) for a in _TE_METHODS)]


def _delayed(meta: dict) -> bool:
    """TE's _has_delayed_scaling_state for the built-in recipes: the module's recipe is DelayedScaling
    (te.DotProductAttention keeps one for its softmax even under current scaling) and its state exists."""
    recipe = meta.get("recipe")
    delayed = getattr(recipe, "delayed", None)
    return bool(callable(delayed) and delayed()) and all(
        isinstance(getattr(meta.get(k), "amax_history", None), torch.Tensor) for k in ("scaling_fwd", "scaling_bwd"))


def scaling_state(model: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """{module name: {scale_fwd, amax_history_fwd, scale_bwd, amax_history_bwd, num_gemms}} as CPU tensors, for
    every TE module whose recipe keeps delayed-scaling state and that has run an FP8 forward; empty otherwise."""
    out = {}
    for fqn, m in te_modules(model):
        if not _delayed(m.fp8_meta):
            continue
        tensors = m.get_fp8_meta_tensors()
        if tensors is None:
            continue
        (scale_fwd, hist_fwd), (scale_bwd, hist_bwd) = tensors["scaling_fwd"], tensors["scaling_bwd"]
        out[fqn] = {"scale_fwd": scale_fwd.detach().cpu(), "amax_history_fwd": hist_fwd.detach().cpu(),
                    "scale_bwd": scale_bwd.detach().cpu(), "amax_history_bwd": hist_bwd.detach().cpu(),
                    "num_gemms": torch.tensor(int(m.fp8_meta.get("num_gemms", scale_fwd.numel() // 3)))}
    return out


def restore_scaling_state(model: nn.Module, saved: dict[str, dict[str, torch.Tensor]],
                          delayed_recipe: Callable[[int], object], run_recipe: object = None) -> int:
    """Put `saved` (from `scaling_state`) back into the model's TE modules, before their first forward.
    `delayed_recipe(amax_history_len)` builds the DelayedScaling recipe TE allocates the state for (the run's
    own recipe replaces it at the first forward; only its format and history length matter here). A state of fewer
    GEMMs than its module's num_gemms is DotProductAttention's under current scaling: allocated as TE does, for
    [`run_recipe`, that DelayedScaling]. Raises ValueError when the checkpoint holds state of modules this model does not
    have. Returns how many modules."""
    if not saved:
        return 0
    modules = dict(te_modules(model))
    missing = sorted(set(saved) - set(modules))
    if missing:
        raise ValueError(f"the checkpoint holds Transformer Engine FP8 scaling state of {len(missing)} module(s) this model does "
                         f"not have as TE modules (first: {missing[0]})")
    for fqn, t in saved.items():
        if set(_TENSORS) - set(t):
            raise ValueError(f"the FP8 scaling state of {fqn} in the checkpoint lacks {sorted(set(_TENSORS) - set(t))}")
        m = modules[fqn]
        recipe = delayed_recipe(int(t["amax_history_fwd"].shape[0]))
        num_gemms, delayed_gemms = int(t["num_gemms"]), t["scale_fwd"].numel() // 3
        recipes = recipe
        if delayed_gemms != num_gemms:  # DotProductAttention under current scaling: S and dP only
            if run_recipe is None or getattr(run_recipe, "delayed", lambda: False)():
                raise ValueError(f"the FP8 scaling state of {fqn} in the checkpoint covers {delayed_gemms} of its {num_gemms} "
                                 "GEMMs (FP8 attention under current scaling), and this run's recipe is not current scaling")
            recipes = [run_recipe, recipe]
        m.fp8_meta["num_gemms"] = num_gemms
        m.fp8_meta["recipe"] = recipe
        m.init_fp8_meta_tensors(recipes)
        m.reset_fp8_meta_tensors({"scaling_fwd": [t["scale_fwd"], t["amax_history_fwd"]],
                                  "scaling_bwd": [t["scale_bwd"], t["amax_history_bwd"]]})
    return len(saved)


@contextlib.contextmanager
def empty_extra_state(model: nn.Module) -> Iterator[int]:
    """While inside, every TE module's state_dict holds an empty `_extra_state` (the payload TE's set_extra_state
    ignores) instead of TE's pickle: for checkpoints written by another library (DeepSpeed's save_checkpoint),
    next to which `scaling_state` goes into the rank file. Yields how many modules."""
    modules = [m for _, m in te_modules(model)]
    for m in modules:
        m.get_extra_state = _empty  # an instance attribute: nn.Module.state_dict calls self.get_extra_state()
    try:
        yield len(modules)
    finally:
        for m in modules:
            m.__dict__.pop("get_extra_state", None)


def _empty() -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def empty_payloads(keys) -> dict[str, torch.Tensor]:
    """An empty `_extra_state` for each key: what TE's set_extra_state ignores."""
    return {k: _empty() for k in keys}


def is_te_refusal(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is TE refusing to unpickle delayed-scaling extra state."""
    while error is not None:
        if REFUSAL in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False
