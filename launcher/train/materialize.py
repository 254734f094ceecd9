"""Meta-device initialisation: build the model without storage, shard it, then give each rank
storage for only what it keeps and initialise that, the way torchtitan does.

    with build_device(plan, spec):               # torch.device("meta") unless the model opts out
        model = build_model(...)
    apply_precision(...)                          # torchao's convert_to_float8_training works on meta
    # tensor parallel: parallelize(model, plan, mesh) goes here (between precision and AC/compile)
    prepare_blocks(...)                           # activation checkpointing, compile
    fully_shard(...)                              # FSDP2 (DDP: nothing)
    materialize(model, device, initializer)       # to_empty(device) + initialise each rank's shard

World-size independence: each module's own parameters and buffers are initialised by the model's
own rule (builtin: `Llama.init_module`; hf: the model's `_init_weights`; py: `reset_parameters()`)
on a full-size CPU copy of that one module, under a seed derived from the run's seed and the
module's name; each rank then keeps its slice of every tensor (a DTensor's local shard, or the
whole tensor). The initial weights are therefore the same at every world size, on CPU and GPU, and
no rank ever holds more than one module's full tensors at once. The cost is time: every rank draws
every parameter's random numbers (for Llama-3-8B about a minute per rank on one CPU thread).
"""

from __future__ import annotations

import contextlib
import copy
import zlib
from typing import Callable, Iterator

import torch
from torch import nn

from launcher.errors import LauncherError

Initializer = Callable[[str, nn.Module], None]
"""(clean module name, module) -> initialises the parameters and buffers the module holds itself
(not its children's), in place."""

class WholeModelInit:
    """A model-level `init_weights()` (a py: model that defines one): called once, on the
    materialised model as it is then (FSDP2: DTensor shards), under torch.manual_seed(seed).
    Random draws then follow the sharding: such weights may differ between world sizes."""

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn


WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")
"""Name parts wrappers (activation checkpointing, torch.compile, FSDP1) add to a module's name."""


def clean_name(fqn: str) -> str:
    """A module's name as the model defines it, whatever wrappers were applied since."""
    return ".".join(p for p in fqn.split(".") if p not in WRAPPER_PARTS)


def module_seed(seed: int, fqn: str) -> int:
    """The seed one module is initialised under: the run's seed and the module's clean name."""
    return (int(seed) * 1_000_003 + zlib.crc32(clean_name(fqn).encode())) % (2**63)


def is_meta(model: nn.Module) -> bool:
    """Whether any parameter or buffer of `model` has no storage yet."""
    return any(_local(t).is_meta for t in _tensors(model))


def _tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def local_slice(t: torch.Tensor) -> tuple[slice, ...] | None:
    """The slice of the full tensor that this rank's part of `t` holds (None: all of it)."""
    if not hasattr(t, "device_mesh") or not hasattr(t, "placements"):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def _own(module: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """(kind, name, tensor) of the parameters and buffers `module` holds itself."""
    out = [("param", n, p) for n, p in module._parameters.items() if p is not None]
    out += [("buffer", n, b) for n, b in module._buffers.items() if b is not None]
    return out


def full_copy(module: nn.Module) -> nn.Module:
    """A shallow copy of `module` whose own parameters and buffers are new full-size fp32/own-dtype
    CPU tensors (children are shared, not copied: the initializer only touches the module's own)."""
    clone = copy.copy(module)
    clone._parameters = {n: None for n, p in module._parameters.items() if p is None}  # bias=None stays None
    clone._buffers = {n: None for n, b in module._buffers.items() if b is None}
    for kind, name, t in _own(module):
        full = torch.empty(tuple(t.shape), dtype=t.dtype, device="cpu")
        if full.is_floating_point():
            full.fill_(float("nan"))  # what no initializer writes stays NaN, and `_check_initialised` names it
        if kind == "param":
            clone._parameters[name] = nn.Parameter(full, requires_grad=t.requires_grad)
        else:
            clone._buffers[name] = full
    return clone


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device | str, initializer: Initializer | WholeModelInit | None, *, seed: int) -> None:
    """Give `model` (built on meta, possibly sharded by FSDP2) storage on `device` and initialise it.

    `initializer` None: storage only (a resumed run: the checkpoint overwrites every tensor).
    Buffers that already have storage (computed when the model was built) keep their values."""
    kept = {name: b.detach().clone() for name, b in model.named_buffers() if not _local(b).is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, value in kept.items():
            model.get_buffer(name).copy_(value)
    if initializer is None:
        return
    if isinstance(initializer, WholeModelInit):
        for name, p in model.named_parameters():
            if _local(p).is_floating_point():
                _local(p).fill_(float("nan"))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            initializer.fn()
        for name, p in model.named_parameters():
            _check_initialised(name, _local(p), type(model))
        return
    done: set[int] = set()
    for fqn, module in model.named_modules():
        own = [(k, n, t) for k, n, t in _own(module) if id(t) not in done and not (k == "buffer" and n in _short(kept, fqn))]
        if not own:
            continue
        clone = full_copy(module)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(module_seed(seed, fqn))
            initializer(clean_name(fqn), clone)
        for kind, name, t in own:
            done.add(id(t))
            full = (clone._parameters if kind == "param" else clone._buffers)[name]
            if kind == "param":
                _check_initialised(f"{clean_name(fqn)}.{name}" if fqn else name, full, type(module))
            where = local_slice(t)
            part = full if where is None else full[where]
            _local(t).copy_(part.to(dtype=t.dtype))


def _short(kept: dict, fqn: str) -> set[str]:
    """Names (within the module at `fqn`) of the buffers that kept their built values."""
    prefix = f"{fqn}." if fqn else ""
    return {k[len(prefix):] for k in kept if k.startswith(prefix) and "." not in k[len(prefix):]}


def reset_parameters_initializer(name: str, module: nn.Module) -> None:
    """Each module's own `reset_parameters()` (torch's layers, most user modules), or the private
    `_reset_parameters()` some of torch's own use (nn.MultiheadAttention, nn.Transformer); others keep nothing."""
    reset = getattr(module, "reset_parameters", None)
    if not callable(reset):
        reset = getattr(module, "_reset_parameters", None)
    if callable(reset):
        reset()


def _check_initialised(name: str, tensor: torch.Tensor, owner: type) -> None:
    """A parameter no initializer wrote still holds the NaN it was filled with: training from it would
    stop at step 1 with a non-finite loss that points nowhere near the cause."""
    if tensor.is_floating_point() and tensor.numel() and bool(torch.isnan(tensor).any()):
        raise LauncherError(
            f"parameter {name} ({owner.__module__}.{owner.__qualname__}) was built on the meta device and nothing "
            "initialised it (its module has no reset_parameters() and the model no init_weights()); fix: give the "
            "module a reset_parameters() or the model an init_weights(), or set `build.fp8launch_meta_init = False` "
            "on the factory so it is called on a real device")


@contextlib.contextmanager
def meta_device() -> Iterator[None]:
    """Build under torch.device("meta"): parameters and buffers get shapes, no storage."""
    with torch.device("meta"):
        yield


class Pending:
    """What a meta-built model still needs: storage on a device and its initial weights. The
    engine calls it once the model is sharded (FSDP2) or at once (DDP, DeepSpeed)."""

    def __init__(self, initializer: Initializer | WholeModelInit | None, *, seed: int):
        self.initializer = initializer
        """None: storage only (a resumed run: the checkpoint sets every tensor)."""
        self.seed = seed

    def __call__(self, model: nn.Module, device: torch.device | str) -> None:
        materialize(model, device, self.initializer, seed=self.seed)


def needs_weights_before_precision(plan) -> bool:
    """Transformer Engine and MS-AMP replace modules by copying their weights: the model gets
    its storage (on the training device, never a CPU copy first) before they convert it."""
    p = plan.precision
    return bool(p.fp8 and p.backend in ("te", "msamp"))
