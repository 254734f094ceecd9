"""Adam / AdamW with low-precision moments (`precision.optimizer_states`) or bf16 master weights
(`precision.master_weights`), through torchao's low-bit optimizers, and what an optimizer's state holds.

    optimizer = build(groups, train, states="fp8", master="bf16")   # torchao's AdamWFp8, bf16_stochastic_round
    state_bytes(optimizer)     # this rank's optimizer state in bytes, from the live tensors (codes + scales)
    states_dtype(optimizer)    # "fp8" | "int8" | "bf16" | "fp32" as built (None: no state yet)

Which class: fp8 -> torchao's AdamWFp8 / AdamFp8 (OptimStateFp8: e4m3 codes, one fp32 scale per 256 values);
int8 -> AdamW8bit / Adam8bit (OptimState8bit: dynamic-tree codes, one scale per 256 values, a 256-entry map);
bf16 (or fp32 states beside bf16 master weights) -> AdamWBf16States / AdamWFp32States here: torchao's Adam step
(`single_param_adam`, fp32 arithmetic, compiled once per shape) over plain moments of that dtype. torchao keeps
full-precision moments (the parameter's dtype) for its 8-bit classes' tensors under 4096 values or whose size the
256-value block does not divide. With bf16 master weights every class rounds the update stochastically into the
bf16 parameter (torchao's `bf16_stochastic_round`); there is no fp32 copy.

The states are created when the optimizer is (torchao creates them at the first step, with the same
`_new_buffer` and a zero step count): the start record reads them, and a resumed run loads into them.
"""

from __future__ import annotations

import functools
import types
import typing

import torch

from launcher.errors import BackendMissing
from launcher.planning.install import INSTALL

if typing.TYPE_CHECKING:
    from launcher.planning.plan import TrainConfig

STATE_NAMES = {"OptimStateFp8": "fp8", "OptimState8bit": "int8", "OptimState4bit": "int4"}
"""torchao's state subclasses -> precision.optimizer_states' words."""


def _torchao():
    try:
        import torchao.optim as optim
        from torchao.optim.adam import _AdamBase
    except ImportError as e:
        raise BackendMissing("torchao", INSTALL["torchao"]) from e
    return optim, _AdamBase


@functools.cache
def dense_classes() -> dict[tuple[str, str], type]:
    """(train.optimizer, states dtype) -> torchao's Adam step over plain moments of that dtype."""
    from torch.distributed.tensor import DTensor

    _, base = _torchao()

    class _DenseStates(base):
        state_dtype: torch.dtype

        def __init__(self, params, lr, betas, eps, weight_decay, *, bf16_stochastic_round):
            super().__init__(params, lr, betas, eps, weight_decay, False, block_size=1,
                             bf16_stochastic_round=bf16_stochastic_round, is_adamw=self.is_adamw)

        def _new_buffer(self, p, signed):
            local = p.to_local() if isinstance(p, DTensor) else p
            out = torch.zeros_like(local, dtype=self.state_dtype)
            if isinstance(p, DTensor):
                out = DTensor.from_local(out, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
            return out.to(p.device)

    out = {}
    for optimizer, adamw in (("adamw", True), ("adam", False)):
        for states, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            name = f"{'AdamW' if adamw else 'Adam'}{states.capitalize()}States"
            out[optimizer, states] = type(name, (_DenseStates,), {"is_adamw": adamw, "state_dtype": dtype, "__module__": __name__,
                                                                 "__doc__": f"torchao's Adam step over {states} moments."})
    return out


def needs_lowbit(states: str, master: str) -> bool:
    """Whether the plan's optimizer is one of torchao's (anything but fp32 moments beside fp32 weights)."""
    return states != "fp32" or master != "fp32"


def build(groups: list[dict], train: TrainConfig, *, states: str, master: str) -> torch.optim.Optimizer:
    """Adam / AdamW over `groups` with `states` moments, rounding stochastically into bf16 weights when `master` is
    bf16; states created at once (`init_states`)."""
    optim, _ = _torchao()
    if train.optimizer not in ("adam", "adamw"):  # planning refuses it (OPTIMIZER-STATES-SGD, MASTER-WEIGHTS-OPTIMIZER)
        raise ValueError(f"train.optimizer {train.optimizer!r} keeps no Adam moments")
    adamw = train.optimizer == "adamw"
    kwargs = dict(lr=train.lr, betas=tuple(train.adam_betas), eps=train.adam_eps, weight_decay=train.weight_decay,
                  bf16_stochastic_round=master == "bf16")
    if states in ("fp8", "int8"):
        cls = {("fp8", True): optim.AdamWFp8, ("fp8", False): optim.AdamFp8,
               ("int8", True): optim.AdamW8bit, ("int8", False): optim.Adam8bit}[states, adamw]
    else:
        cls = dense_classes()[train.optimizer, states]
    optimizer = cls(groups, **kwargs)
    if states in ("fp8", "int8"):
        # torchao gives its 8-bit states the parameter's dtype as their outward dtype; with bf16 parameters under FSDP2,
        # the compiled step's `exp_avg.float()` of such a DTensor fails (aten.view.dtype is not implemented for the
        # state subclasses). fp32 is the outward dtype they have beside fp32 weights; the codes and scales are the same.
        zeros = cls._subclass_zeros
        optimizer._subclass_zeros = lambda p, signed, block_size: zeros(
            types.SimpleNamespace(shape=p.shape, device=p.device, dtype=torch.float32), signed, block_size)
    init_states(optimizer)
    optimizer.step = types.MethodType(_without_autograd_cache(type(optimizer).step), optimizer)  # a bound method, as
    return optimizer  # torch's LRScheduler expects of `optimizer.step` when it wraps it in turn


def _without_autograd_cache(step):
    """`step` with AOT autograd's on-disk cache off while torchao compiles its per-parameter Adam step. torchao's
    state and weight subclasses do not implement `_stable_hash_for_caching`, and that cache then hands one run's
    compiled wrapper to another whose inputs are other subclasses (a bf16 weight in torchao's float8 all-gather
    wrapper after a plain one): an AttributeError or a segmentation fault at the first step, seen on torch 2.13.
    Inductor's own cache (the kernels, keyed on plain tensors) stays on."""

    @functools.wraps(step)
    def uncached(self, *args, **kwargs):
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return step(self, *args, **kwargs)

    return uncached


def init_states(optimizer: torch.optim.Optimizer) -> None:
    """Create each parameter's state as torchao's `_AdamBase.step` does on its first call (step 0, the moments from
    `_new_buffer`), which then finds them and goes on as it would have."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if state:
                continue
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = optimizer._new_buffer(p, True)
            state["exp_avg_sq"] = optimizer._new_buffer(p, False)
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = optimizer._new_buffer(p, False)


# --- what the state holds --------------------------------------------------------------------------------

def _parts(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `t`'s data: a DTensor's local shard, a wrapper subclass's inner tensors (torchao's
    codes, scales and map), else `t`."""
    local = getattr(t, "_local_tensor", None)
    if isinstance(local, torch.Tensor):
        return _parts(local)
    flatten = getattr(t, "__tensor_flatten__", None)
    if callable(flatten) and type(t) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = flatten()
        return [x for name in names for x in _parts(getattr(t, name))]
    return [t]


def _state_tensors(optimizer) -> list[torch.Tensor]:
    out = []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif isinstance(getattr(value, "value", None), torch.Tensor):  # MS-AMP's ScalingTensor: its codes (and scale)
                out.append(value.value)
                scale = getattr(getattr(value, "meta", None), "scale", None)
                if isinstance(scale, torch.Tensor):
                    out.append(scale)
    return out


def state_bytes(optimizer) -> int:
    """Bytes of this rank's optimizer state: every state tensor by its real storage (a DTensor's local shard; torchao's
    low-bit states as their codes + scales (+ map)), each storage counted once."""
    seen, total = set(), 0
    for t in _state_tensors(optimizer):
        for part in _parts(t):
            if part.device.type == "meta":
                key = id(part)
            else:
                key = (part.untyped_storage().data_ptr(), part.storage_offset(), part.numel(), part.dtype)
            if key in seen:
                continue
            seen.add(key)
            total += part.numel() * part.element_size()
    return total


def _state_name(t: torch.Tensor) -> str:
    local = getattr(t, "_local_tensor", t)
    name = STATE_NAMES.get(type(local).__name__)
    if name is not None:
        return name
    from launcher.train.parallel.grad_reduce import dtype_name

    return dtype_name(local.dtype)


def states_dtype(optimizer) -> str | None:
    """The dtype of the Adam moments as built, in precision.optimizer_states' words: the one holding most values
    (torchao keeps small tensors' moments in full precision); None when the optimizer holds no moments yet."""
    counts: dict[str, int] = {}
    for state in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            value = state.get(key)
            if isinstance(value, torch.Tensor):
                name = _state_name(value)
                counts[name] = counts.get(name, 0) + value.numel()
    return max(counts, key=counts.get) if counts else None
