"""Meta-device initialisation: build the model without storage, shard it, then give each rank
storage for only what it keeps and initialise that, the way torchtitan does.

    with build_device(plan, spec):               # torch.device("meta") unless the model opts out
        model = build_model(...)
    apply_precision(...)                          # torchao's convert_to_float8_training works on meta
    # tensor parallel: parallelize(model, plan, mesh) goes here (between precision and AC/compile)
    prepare_blocks(...)                           # activation checkpointing, compile
    fully_shard(...)                              # FSDP2 (DDP: nothing)
    materialize(model, device, initializer)       # to_empty(device) + initialise each rank's shard
    # DeepSpeed ZeRO-3: materialize(..., partition=...) gives storage module by module and hands each
    # module's initialised parameters to deepspeed.zero.Init at once (engines/deepspeed_engine.py)

World-size independence: each module's own parameters and buffers are initialised by the model's
own rule (builtin: `Llama.init_module`; hf: the model's `_init_weights`, or its weights files read one
module at a time (models/hf_weights.py); py: `reset_parameters()`)
on a full-size copy of that one module, under a seed derived from the run's seed and the
module's name; each rank then keeps its slice of every tensor (a DTensor's local shard, or the
whole tensor). The initial weights are therefore the same at every world size, and no rank ever
holds more than one module's full tensors at once. The cost is time: every rank draws every
parameter's random numbers.

Where the values are drawn (`draw_device`): on the rank's GPU when the run trains on one (each module's
full copy there, then sliced; the largest module, an 8B's 2 GiB fp32 embedding, is the most it holds
beside its shards; a whole tensor on that GPU, DDP's or ZeRO-3's, is drawn into as it is), else on
the CPU, one thread. The time (launcher/planning/init_cost.py, which the plan prints) is memory traffic
on a GPU, under a second for an 8B; 12.7 s or more per billion parameters on a CPU thread.

torch's CUDA generator (Philox) and its CPU one (Mersenne Twister) draw different numbers from one
seed, and a CUDA draw's numbers also depend on the GPU's multiprocessor count (torch's distribution
kernels size their grid by it, aten/src/ATen/native/cuda/DistributionTemplates.h): the initial
weights are the same at every world size on one GPU model, and on CPUs; not between a CPU run and a
GPU run, nor between GPUs with different SM counts. DTensor's offset-based RNG (each rank drawing only
its shard, torch.distributed.tensor._random) is not used: it starts each shard's stream at its shard
index times the local size, so the numbers change with the mesh.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Callable, Iterator

import torch
from torch import nn

from launcher.errors import LauncherError
from launcher.planning.backends import BACKENDS
from launcher.train.fqn import clean_fqn

Initializer = Callable[[str, nn.Module], None]
"""(clean module name, module) -> initialises the parameters and buffers the module holds itself
(not its children's), in place."""


class WholeModelInit:
    """A model-level `init_weights()` (a py: model that defines one): called once, on the
    materialised model as it is then (FSDP2: DTensor shards), under torch.manual_seed(seed).
    Random draws then follow the sharding: such weights may differ between world sizes."""

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn


def module_seed(seed: int, fqn: str) -> int:
    """The seed one module is initialised under: the run's seed and the module's clean name."""
    return (int(seed) * 1_000_003 + zlib.crc32(clean_fqn(fqn).encode())) % (2**63)


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


def draw_device(storage: torch.device | str, draw_on: torch.device | str | None = None) -> torch.device:
    """Where each module's values are drawn: `draw_on` when given, else where the weights live when that is a
    GPU, else the CPU (see the module's docstring: a CUDA draw differs from a CPU one)."""
    device = torch.device(draw_on if draw_on is not None else storage)
    if draw_on is None and device.type != "cuda":
        return torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def full_copy(module: nn.Module, device: torch.device | str = "cpu",
              into: dict[tuple[str, str], torch.Tensor] | None = None) -> nn.Module:
    """A shallow copy of `module` whose own parameters and buffers are new full-size fp32/own-dtype
    tensors on `device` (children are shared, not copied: the initializer only touches the module's own).
    `into`: {(kind, name): tensor} drawn into as they are (whole tensors already on `device` in their
    dtype): no second full copy."""
    # Not copy.copy: FSDP2's unit classes (FSDPEmbedding, ...) construct themselves again in __new__.
    clone = object.__new__(type(module))
    clone.__dict__ = dict(module.__dict__)
    clone._parameters = {n: None for n, p in module._parameters.items() if p is None}  # bias=None stays None
    clone._buffers = {n: None for n, b in module._buffers.items() if b is None}
    for kind, name, t in _own(module):
        full = (into or {}).get((kind, name))
        if full is None:
            full = torch.empty(tuple(t.shape), dtype=t.dtype, device=device)
        if full.is_floating_point():
            full.fill_(float("nan"))  # what no initializer writes stays NaN, and `_check_initialised` names it
        if kind == "param":
            clone._parameters[name] = nn.Parameter(full, requires_grad=t.requires_grad)
        else:
            clone._buffers[name] = full
    return clone


Partition = Callable[[nn.Module, list[nn.Parameter]], None]
"""(module, its own parameters, just initialised) -> hands them to an engine that keeps only this
rank's part (DeepSpeed ZeRO-3); called module by module, children before their parent."""


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device | str, initializer: Initializer | WholeModelInit | None, *, seed: int,
                partition: Partition | None = None, draw_on: torch.device | str | None = None) -> None:
    """Give `model` (built on meta, possibly sharded by FSDP2) storage on `device` and initialise it.

    `initializer` None: storage only (a resumed run: the checkpoint overwrites every tensor).
    Buffers that already have storage (computed when the model was built) keep their values.
    `partition`: storage is given one module at a time (children first) and each module's own
    parameters are handed to it as soon as they hold their initial weights, so that a rank never
    holds more than one module's full tensors (DeepSpeed ZeRO-3); otherwise the whole model gets its
    storage first (its parameters are already this rank's shards, or the model is kept whole).
    `draw_on`: where each module's values are drawn (`draw_device`: by default on `device` if it is a GPU, else
    on the CPU)."""
    draw = draw_device(device, draw_on)
    kept = {name: b.detach().clone() for name, b in model.named_buffers() if not _local(b).is_meta}
    if partition is not None and isinstance(initializer, WholeModelInit):
        raise ValueError("a model-level init_weights() needs the whole model: materialize without partition")
    modules = list(model.named_modules())
    if partition is None:
        ties = _shared_parameters(model)
        model.to_empty(device=device)
        _retie(ties)
        for name, value in kept.items():
            model.get_buffer(name).copy_(value)
    else:
        modules.reverse()  # the reverse of pre-order visits every module's children before it
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
    # Who initialises each tensor: the first module that holds it in pre-order (a tied weight: the
    # first of its modules), whatever order storage is given in, so that the weights are the same.
    owner: dict[int, tuple[str, nn.Module, str, str]] = {}
    for fqn, module in model.named_modules():
        for kind, name, t in _own(module):
            owner.setdefault(id(t), (fqn, module, kind, name))
    done: set[int] = set()
    stored: dict[int, torch.Tensor] = {}
    for fqn, module in modules:
        owners = {(k, n): owner[id(t)] for k, n, t in _own(module)}
        if partition is not None:
            _own_storage(module, device, stored)
        own = [(k, n, t) for k, n, t in _own(module) if id(t) not in done and not (k == "buffer" and n in _short(kept, fqn))]
        if not own:
            continue
        if initializer is not None:
            for (ofqn, omodule), tensors in _by_owner(own, owners).items():
                _initialise(omodule, ofqn, tensors, initializer, seed, draw)
        done.update(id(t) for _, _, t in own)
        if partition is not None:
            params = [t for k, _, t in own if k == "param"]
            if params:
                partition(module, params)


def _shared_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """(module, name) of each parameter held by more than one module (tied weights), grouped."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((module, name))
    return [group for group in holders.values() if len(group) > 1]


def _retie(ties: list[list[tuple[nn.Module, str]]]) -> None:
    """`Module.to_empty` gives each holder of a tied weight a parameter of its own (FSDP2 keeps them one):
    the first holder's is put back in the others, so that the model trains with its weights tied."""
    for (first, first_name), *others in ties:
        param = first._parameters[first_name]
        for module, name in others:
            module._parameters[name] = param


def _by_owner(own: list, owners: dict) -> dict:
    """`own` ((kind, name, tensor) of one module) grouped by the module that initialises each, with
    each tensor's name in that module."""
    groups: dict = {}
    for kind, name, t in own:
        ofqn, omodule, okind, oname = owners[(kind, name)]
        groups.setdefault((ofqn, omodule), []).append((okind, oname, t))
    return groups


def _own_storage(module: nn.Module, device, stored: dict[int, torch.Tensor]) -> None:
    """Storage on `device` for the meta tensors `module` holds itself (not its children's); a buffer
    computed when the model was built keeps its values. `stored` maps each meta tensor replaced so far
    to its replacement, so that a parameter shared by two modules (tied weights) stays one parameter."""
    for kind, name, t in _own(module):
        if not t.is_meta:
            if kind == "buffer" and t.device != torch.device(device):
                module._buffers[name] = t.to(device)  # built with its values on another device
            continue
        new = stored.get(id(t))
        if new is None:
            empty = torch.empty_like(t, device=device)
            new = nn.Parameter(empty, requires_grad=t.requires_grad) if kind == "param" else empty
            stored[id(t)] = new
        (module._parameters if kind == "param" else module._buffers)[name] = new


def _initialise(module: nn.Module, fqn: str, own: list, initializer: Initializer, seed: int, draw: torch.device) -> None:
    """The model's rule on a full-size copy of `module`'s own tensors on `draw`, under the module's seed;
    each tensor then takes its slice of that copy (a DTensor: its local shard; else all of it). A whole
    tensor already on `draw` in its dtype is drawn into directly."""
    into = {(k, n): t for k, n, t in own if local_slice(t) is None and t.device == draw and t.dtype == _dtype(module, k, n)}
    clone = full_copy(module, draw, into)
    with _seeded(module_seed(seed, fqn), draw):
        initializer(clean_fqn(fqn), clone)
    for kind, name, t in own:
        full = (clone._parameters if kind == "param" else clone._buffers)[name]
        if kind == "param":
            _check_initialised(f"{clean_fqn(fqn)}.{name}" if fqn else name, full, type(module))
        if (kind, name) in into and full.data_ptr() == t.data_ptr():
            continue  # drawn in place (unless the rule put a new tensor in the copy)
        where = local_slice(t)
        part = full if where is None else full[where]
        _local(t).copy_(part.to(dtype=t.dtype))


def _dtype(module: nn.Module, kind: str, name: str) -> torch.dtype:
    """The dtype the module's copy gives its own tensor `name` (the module's, which a tied weight's owner may hold on meta)."""
    return (module._parameters if kind == "param" else module._buffers)[name].dtype


@contextlib.contextmanager
def _seeded(seed: int, draw: torch.device) -> Iterator[None]:
    """torch's generators seeded with `seed` (the CPU's and every accelerator's, as torch.manual_seed does), the
    CPU's and the draw device's restored after."""
    devices = [draw.index] if draw.type != "cpu" else []
    with torch.random.fork_rng(devices=devices, device_type=draw.type if draw.type != "cpu" else "cuda"):
        torch.manual_seed(seed)
        yield


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

    def __init__(self, initializer: Initializer | WholeModelInit | None, *, seed: int, draw_on: torch.device | str | None = None):
        self.initializer = initializer
        """None: storage only (a resumed run: the checkpoint sets every tensor)."""
        self.seed = seed
        self.draw_on = draw_on
        """Where the values are drawn (`draw_device`); None: where the weights live if that is a GPU, else the CPU.
        The entrypoint passes the run's device, so that a GPU run whose weights live on the host (FSDP2's CPU
        offload) still draws on its GPU."""

    def __call__(self, model: nn.Module, device: torch.device | str, *, partition: Partition | None = None) -> None:
        materialize(model, device, self.initializer, seed=self.seed, partition=partition, draw_on=self.draw_on)

    @property
    def whole_model_init(self) -> bool:
        """The model initialises itself as a whole (a py: model's init_weights()): it needs all of it at once."""
        return isinstance(self.initializer, WholeModelInit)


def needs_weights_before_precision(plan) -> bool:
    """Transformer Engine and MS-AMP replace modules by copying their weights: the model gets
    its storage (on the training device, never a CPU copy first) before they convert it."""
    p = plan.precision
    return bool(p.fp8 and BACKENDS[p.backend].replaces_modules)
