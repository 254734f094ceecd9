"""What the setup really did, measured from the live objects after the engine wrapped the model (never
copied from the spec), and the check that every feature the spec asked for took effect.

    effects = measure(engine, monitor=monitor)     # the start record's "effects"
    layers = layer_precisions(engine.module, precision)   # its "layers": module name -> precision as built
    check(plan, effects, engine.module, device)     # rule EFFECT-MISSING (exit 3) naming the key, before step 1

Each effect, and where it is read:
- all_gather_dtype: FSDP2 only (else None): the dtype FSDP2 all-gathers the FP8 layers' weights in (every
  weight's, when no layer runs in FP8): a torchao float8 weight wrapper's own target dtype where the shard
  carries fsdp_pre_all_gather, else the MixedPrecisionPolicy's param_dtype, else the shard's dtype;
- compiled_blocks / fullgraph: transformer blocks that are torch.compile OptimizedModules (or, for MoE blocks,
  whose every parameter is computed by compiled parts), and whether their dynamo contexts are fullgraph (None
  with none compiled);
- checkpointed_blocks: transformer blocks wrapped by activation checkpointing;
- optimizer: the class of the optimizer that steps (DeepSpeed: its basic optimizer inside ZeRO);
- offload: {"parameters", "optimizer_states"} -> "device" | "cpu" | "nvme", from FSDP2's FSDPParam
  offload_to_cpu and DeepSpeed's ZeRO optimizer;
- tensor_parallel: the size of the "tp" dimension of the parameters' DTensor mesh (1 without);
- async_tp: inductor's micro-pipeline TP pass on and symmetric memory enabled for that TP group;
- expert_parallel: total experts / experts each rank holds, read from the grouped experts' DTensor weights
  (the size of the "ep" mesh dimension they are Shard(0) over; 1 without, or without grouped experts);
- monitor_hooks: FP8 layers the FP8 monitor hooks on its sampled steps (0 with the monitor off);
- fp8_weights (only where the model stores weights in FP8: Transformer Engine's precision.te.fp8_params):
  {"count": parameters stored as TE quantized tensors, "master": the dtype of the optimizer's master copy of
  them ("master_param" in TE FusedAdam's state; None where it keeps none)}.
- optimizer_states: the Adam moments' dtype in precision.optimizer_states' words, read from the optimizer's state
  tensors (torchao's OptimStateFp8 / OptimState8bit: "fp8" / "int8"), which fp8launch's low-bit optimizers create
  with the optimizer; torch's own Adam creates its moments at the first step as zeros_like each parameter, so before
  it they are named by the parameters' dtype; "none" for SGD;
- grad_reduce: the payload of the gradient reduction (fp32 | bf16 | fp8 ...): the DDP communication hook's, FSDP2's
  custom reduce-scatter's or mixed-precision policy's, DeepSpeed's communication dtype (launcher/train/parallel/grad_reduce.py);
- master_weights: the dtype of the weights the optimizer updates (most of them by count), "bf16" only where the
  optimizer also rounds into them stochastically;
- pipeline (only under pipeline parallelism: launcher/train/parallel/pipeline.py): {"stages", "stage": this rank's,
  "schedule": the torch.distributed.pipelining class that runs the steps, "microbatches": its micro-batches per step,
  "blocks": the indices of the blocks this rank's stages hold, "stages_per_rank", "rank_stages": the stages this rank
  holds}, read from the live PipelineStages and schedule;
- context (only under context parallelism: launcher/train/parallel/context.py): {"ranks": the size of the mesh dimension
  each sequence is split over, "positioned_attentions": the attentions that take this rank's sequence positions};
- msamp_level: the MS-AMP opt level the run is: "<level> (MS-AMP)" where MS-AMP itself converted the model, "<level>
  natively" where FP8 GEMMs with the states, reduction and weights measured above (O3: and FSDP2's float8 all-gather)
  are that level's keys (launcher/planning/levels.py), as a `backend = "msamp"` spec is planned where MS-AMP cannot
  run; None otherwise.
"""

from __future__ import annotations

import typing
from typing import Any

import torch
from torch import nn

from launcher.planning.backends import backend_of, named
from launcher.train.models import transformer_blocks

if typing.TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.train.engines import Engine
    from launcher.train.precision import Precision

DEVICE, CPU, NVME = "device", "cpu", "nvme"
"""Where parameters and optimizer states live: with the compute ("device"), in host memory, on NVMe."""

EFFECT_KEYS = ("all_gather_dtype", "compiled_blocks", "fullgraph", "checkpointed_blocks", "optimizer", "offload",
               "tensor_parallel", "async_tp", "expert_parallel", "monitor_hooks", "optimizer_states", "grad_reduce",
               "master_weights", "msamp_level")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _inner(block: nn.Module) -> nn.Module:
    return getattr(block, "_orig_mod", block)


def compiled_parts(block: nn.Module) -> list[nn.Module]:
    """The torch.compile OptimizedModules that compute `block`: [block] when it is compiled whole; for a block
    compiled in parts (an MoE block, launcher/train/compile_ac.py) those parts when every parameter of the block
    is inside one of them or is a grouped-experts weight whose grouped GEMMs (`swiglu`) are compiled; else []."""
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(block, OptimizedModule):
        return [block]
    parts = [m for m in block.modules() if isinstance(m, OptimizedModule)]
    covered = {id(p) for part in parts for p in part.parameters()}
    for m in block.modules():
        if isinstance(getattr(m, "swiglu", None), OptimizedModule):
            covered |= {id(p) for p in m.parameters(recurse=False)}
    params = list(block.parameters())
    return parts if params and all(id(p) in covered for p in params) else []


def _checkpointed(block: nn.Module) -> bool:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return isinstance(_inner(block), CheckpointWrapper)


def blocks_effects(model: nn.Module) -> dict[str, Any]:
    """compiled_blocks, fullgraph, checkpointed_blocks of `model`'s transformer blocks as they are now."""
    blocks = transformer_blocks(model)
    compiled = [parts for parts in map(compiled_parts, blocks) if parts]
    fullgraph = None
    if compiled:
        flags = {bool(getattr(part.dynamo_ctx, "fullgraph", False)) for parts in compiled for part in parts}
        fullgraph = flags == {True}
    return {"compiled_blocks": len(compiled), "fullgraph": fullgraph,
            "checkpointed_blocks": sum(1 for b in blocks if _checkpointed(b))}


def _fsdp_params(model: nn.Module) -> list:
    from torch.distributed.fsdp import FSDPModule

    out = []
    for m in model.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            # torch < 2.12 keeps one group per module (`_fsdp_param_group`, None when it owns no parameter)
            groups = getattr(state, "_fsdp_param_groups", None)
            if groups is None:
                groups = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
            for group in groups:
                out.extend(group.fsdp_params)
    return out


def all_gather_dtype(model: nn.Module, fp8_modules: set[int]) -> str | None:
    """The dtype FSDP2 all-gathers the weights of the modules in `fp8_modules` (ids) in; of every
    parameter when that set is empty. None without FSDP2. Mixed answers are joined with "+"."""
    params = _fsdp_params(model)
    if not params:
        return None
    chosen = [p for p in params if id(p._module_info.module) in fp8_modules] if fp8_modules else params
    from launcher.train.precision.te import is_quantized_weight

    dtypes = set()
    for p in chosen or params:
        local = p._sharded_local_tensor
        if hasattr(local, "fsdp_pre_all_gather") and is_quantized_weight(local):
            # Transformer Engine's FP8 weights (precision.te.fp8_params) all-gather their 1-byte `_data`
            # (Float8Tensor.fsdp_pre_all_gather) and are rebuilt as FP8 tensors after it
            dtypes.add(_te_fp8_dtype(local))
        elif hasattr(local, "fsdp_pre_all_gather") and isinstance(getattr(local, "_data", None), torch.Tensor):
            # torchao's MX/NVFP4 training wrappers all-gather `_data.to(mp_policy.param_dtype)`
            # (torchao/prototype/moe_training/tensor.py) and cast after the all-gather
            dtypes.add(_dtype_name(p.mp_policy.param_dtype or local._data.dtype))
        elif hasattr(local, "fsdp_pre_all_gather"):
            dtype = getattr(local, "_dtype", None)  # torchao's WeightWithDynamicFloat8CastTensor casts to this
            dtypes.add(_dtype_name(dtype) if isinstance(dtype, torch.dtype) else type(local).__name__)
        else:
            dtypes.add(_dtype_name(p.mp_policy.param_dtype or p.sharded_param.dtype))
    return "+".join(sorted(dtypes))


def _te_fp8_dtype(local) -> str:
    """The float8 format of a TE quantized weight: its `_fp8_dtype` (tex.DType.kFloat8E4M3 / kFloat8E5M2), else its data's."""
    fp8 = str(getattr(local, "_fp8_dtype", ""))
    for te_name, name in (("E4M3", "float8_e4m3fn"), ("E5M2", "float8_e5m2")):
        if te_name in fp8:
            return name
    data = getattr(local, "_data", None)
    return _dtype_name(data.dtype) if isinstance(data, torch.Tensor) and data.dtype.is_floating_point and data.element_size() == 1 \
        else type(local).__name__


def optimizer_class(engine: Engine) -> str:
    """The class of the optimizer that steps: DeepSpeed's basic optimizer, not its ZeRO wrapper."""
    basic = getattr(engine.model, "basic_optimizer", None)
    return type(basic if basic is not None else engine.optimizer).__name__


def _stepped(engine: Engine) -> list[torch.Tensor]:
    """The tensors the stepping optimizer updates. DeepSpeed ZeRO-3 hands its basic optimizer one fp32 partition at a
    time inside step() and empties the groups again (deepspeed/runtime/zero/stage3.py, _optimizer_step): there they
    are the ZeRO optimizer's fp32 partitions."""
    optimizer = engine.stepping_optimizer()
    found = [q for group in getattr(optimizer, "param_groups", []) for q in group["params"]]
    if not found and engine.name == "deepspeed":
        found = list(getattr(engine.model.optimizer, "fp32_partitioned_groups_flat", None) or [])
    return found


def _by_count(named: list[tuple[str, int]]) -> str | None:
    counts: dict[str, int] = {}
    for name, n in named:
        counts[name] = counts.get(name, 0) + n
    return max(counts, key=counts.get) if counts else None


def optimizer_states(engine: Engine) -> str:
    """The moments' dtype as built (see the module's docstring)."""
    from launcher.train.optim_lowbit import states_dtype
    from launcher.train.parallel.grad_reduce import dtype_name

    optimizer = engine.stepping_optimizer()
    found = states_dtype(optimizer)
    if found is not None:
        return found
    if not any(k in getattr(optimizer, "defaults", {}) for k in ("betas", "exp_avg_dtype")):  # plain SGD: no moments
        return "none"
    return _by_count([(dtype_name(q.dtype), q.numel()) for q in _stepped(engine)]) or "none"


def master_weights(engine: Engine) -> str:
    """The dtype of the weights the optimizer updates (see the module's docstring)."""
    from launcher.train.parallel.grad_reduce import dtype_name

    optimizer = engine.stepping_optimizer()
    found = _by_count([(dtype_name(q.dtype), q.numel()) for q in _stepped(engine)]) or "none"
    if found == "bf16" and not getattr(optimizer, "bf16_stochastic_round", False):
        return "bf16 (rounded to nearest)"
    return found


def offload(engine: Engine) -> dict[str, str]:
    """Where parameters and optimizer states live, from the engine's own objects."""
    params = _fsdp_params(engine.model) if engine.name == "fsdp2" else []
    if params:
        where = CPU if all(p.offload_to_cpu for p in params) else DEVICE
        return {"parameters": where, "optimizer_states": where}  # the optimizer steps the (offloaded) shards
    if engine.name == "deepspeed":
        zero = engine.model.optimizer
        if hasattr(zero, "offload_param"):  # ZeRO-3
            return {"parameters": NVME if zero.params_in_nvme_and_cpu else CPU if zero.offload_param else DEVICE,
                    "optimizer_states": NVME if zero.swap_optimizer else CPU if zero.offload_optimizer else DEVICE}
        return {"parameters": DEVICE, "optimizer_states": CPU if getattr(zero, "cpu_offload", False) else DEVICE}
    return {"parameters": DEVICE, "optimizer_states": DEVICE}


def tp_group(model: nn.Module):
    """The tensor-parallel process group of the model's DTensor parameters, or None."""
    from torch.distributed.tensor import DTensor

    for q in model.parameters():
        mesh = q.device_mesh if isinstance(q, DTensor) else None
        if mesh is not None and "tp" in (mesh.mesh_dim_names or ()):
            return mesh["tp"].get_group()
    return None


def fp8_weights(engine: Engine) -> dict[str, Any] | None:
    """{"count", "master"} of the parameters stored as quantized (FP8) tensors, None where there are none."""
    from launcher.train.precision.te import is_quantized_weight

    quantized = [p for p in engine.module.parameters() if is_quantized_weight(p)]
    if not quantized:
        return None
    state = getattr(engine.optimizer, "state", None)
    masters = [(state.get(p) or {}).get("master_param") if isinstance(state, dict) else None for p in quantized]
    master = "+".join(sorted({_dtype_name(m.dtype) for m in masters})) if all(isinstance(m, torch.Tensor) for m in masters) else None
    return {"count": len(quantized), "master": master}


def measure(engine: Engine, *, fp8_modules: set[int] = frozenset(), monitor=None) -> dict[str, Any]:
    """Every effect (EFFECT_KEYS) of the wrapped model, its optimizer and the monitor; `fp8_weights` where the
    model stores FP8 weights."""
    from launcher.train.parallel.expert_parallel import expert_parallel_degree
    from launcher.train.parallel.grad_reduce import payload_of
    from launcher.train.parallel.tensor_parallel import async_tp_active

    group = tp_group(engine.module)
    weights = fp8_weights(engine)
    staged, split = engine.pipeline_effects(), context(engine)
    measured = {**({"fp8_weights": weights} if weights else {}), **({"pipeline": staged} if staged else {}),
        **({"context": split} if split else {}),
        "all_gather_dtype": all_gather_dtype(engine.model, set(fp8_modules)) if engine.name == "fsdp2" else None,
        **blocks_effects(engine.module),
        "optimizer": optimizer_class(engine),
        "offload": offload(engine),
        "tensor_parallel": group.size() if group is not None else 1,
        "async_tp": async_tp_active(group.group_name) if group is not None else False,
        "expert_parallel": expert_parallel_degree(engine.module),
        "monitor_hooks": len(monitor.targets) if monitor is not None else 0,
        "optimizer_states": optimizer_states(engine),
        "grad_reduce": payload_of(engine),
        "master_weights": master_weights(engine),
    }
    return {**measured, "msamp_level": msamp_level(measured, engine.precision.report)}


def context(engine: Engine) -> dict[str, int] | None:
    """The ranks each sequence is split over and the attentions that take this rank's positions (None without context
    parallelism)."""
    if engine.cp_mesh is None:
        return None
    positioned = sum(1 for m in engine.module.modules() if m._buffers.get("positions") is not None)
    return {"ranks": engine.cp_mesh.size(), "positioned_attentions": positioned}


def msamp_level(effects: dict[str, Any], report) -> str | None:
    """The MS-AMP opt level of a run from its precision report and the effects measured (see the module's docstring)."""
    b = named(report.backend)
    if b is not None and b.scaling_tensors:
        return f"{report.recipe} (MS-AMP)"
    if report.mode != "fp8" or effects["grad_reduce"] != "fp8" or effects["master_weights"] != "bf16":
        return None
    if effects["optimizer_states"] != "fp8":
        return "O1 natively"
    return "O3 natively" if str(effects["all_gather_dtype"]).startswith("float8") else "O2 natively"


def layer_precisions(model: nn.Module, precision: Precision) -> dict[str, str]:
    """Module name (as built: wrapper parts dropped) -> precision as built, for every Linear and every
    backend FP8 linear module: "fp8 <recipe>" (read from the module) or the high-precision dtype."""
    from launcher.train.fqn import clean_fqn

    from .precision.module_dtype import dtype_of
    from .precision.report import linear_like

    high = precision.report.high_precision
    return {clean_fqn(fqn): precision.fp8_label(m) or dtype_of(m) or high
            for fqn, m, _ in linear_like(model, lambda m: precision.fp8_label(m) is not None)}


def fp8_module_ids(model: nn.Module, precision: Precision) -> set[int]:
    """The FP8 modules whose all-gather dtype the spec decides: with float8 all-gather, the tensorwise ones (a
    `[[precision.rules]]` recipe other than tensorwise all-gathers in high precision), else every FP8 one."""
    wanted = (lambda label: label == "fp8 tensorwise") if precision.fsdp_float8_all_gather else (lambda label: label is not None)
    return {id(m) for m in model.modules() if wanted(precision.fp8_label(m))}


# --- what the spec asked for -----------------------------------------------------------------------

AT_LEAST_ONE = "at least 1"

OPTIMIZERS = {"adamw": ("AdamW", "LBAdamW", "DeepSpeedCPUAdam", "FusedAdam", "DSAdam", "AdamWFp8", "AdamW8bit", "AdamWBf16States",
                        "AdamWFp32States"),
              "adam": ("Adam", "LBAdam", "DeepSpeedCPUAdam", "FusedAdam", "DSAdam", "AdamFp8", "Adam8bit", "AdamBf16States",
                       "AdamFp32States"),
              "sgd": ("SGD",)}
"""train.optimizer -> the classes that implement it (torch's, MS-AMP's, DeepSpeed's with its Adam mode, torchao's low-bit
ones and launcher/train/optim_lowbit.py's)."""


def expected(plan: Plan, n_blocks: int) -> dict[str, tuple[str, Any]]:
    """effect -> (the spec key that asks for it, the value it must have: a value, a tuple of allowed
    values, or AT_LEAST_ONE) for each feature the plan asks for."""
    out: dict[str, tuple[str, Any]] = {"optimizer": ("train.optimizer", OPTIMIZERS[plan.train.optimizer])}
    n_blocks = max(n_blocks, 1)  # a model with no blocks fp8launch can find compiles and checkpoints nothing
    if plan.compile.enabled:
        out["compiled_blocks"] = ("compile.enabled", n_blocks)
        if plan.compile.fullgraph:
            out["fullgraph"] = ("compile.fullgraph", True)
    ac = plan.activation_checkpointing.mode
    if ac != "none":
        out["checkpointed_blocks"] = ("activation_checkpointing.mode", n_blocks if ac == "full" else (n_blocks + 1) // 2)
    p, d = plan.precision, plan.distributed
    b = backend_of(p)
    if b is not None and b.float8_all_gather(p, d.strategy):
        out["all_gather_dtype"] = ("precision.torchao.fsdp_float8_all_gather", "float8_e4m3fn")
    ds = d.deepspeed
    if d.strategy == "deepspeed" and ds.offload_optimizer != "none":
        out["offload.optimizer_states"] = ("distributed.deepspeed.offload_optimizer", ds.offload_optimizer)
        if plan.train.optimizer in ("adam", "adamw"):
            out["optimizer"] = ("distributed.deepspeed.offload_optimizer", ("DeepSpeedCPUAdam",))
    if d.strategy == "deepspeed" and ds.offload_param != "none":
        out["offload.parameters"] = ("distributed.deepspeed.offload_param", ds.offload_param)
    if d.strategy == "fsdp2" and d.fsdp2.cpu_offload:
        out["offload.parameters"] = ("distributed.fsdp2.cpu_offload", CPU)
    if d.tensor_parallel > 1:
        out["tensor_parallel"] = ("distributed.tensor_parallel", d.tensor_parallel)
    if d.async_tp:
        out["async_tp"] = ("distributed.async_tp", True)
    if d.expert_parallel > 1:
        out["expert_parallel"] = ("distributed.expert_parallel", d.expert_parallel)
    if d.pipeline_parallel > 1:
        from launcher.train.parallel.pipeline import SCHEDULES

        out["pipeline.stages"] = ("distributed.pipeline_parallel", d.pipeline_stages)
        out["pipeline.stages_per_rank"] = ("distributed.pipeline.stages_per_rank", d.pipeline.local_stages)
        out["pipeline.schedule"] = ("distributed.pipeline.schedule", SCHEDULES[d.pipeline.schedule])
        out["pipeline.microbatches"] = ("distributed.pipeline.microbatches", plan.pipeline_microbatches)
    if d.context_parallel > 1:
        out["context.ranks"] = ("distributed.context_parallel", d.context_parallel)
        out["context.positioned_attentions"] = ("distributed.context_parallel", n_blocks)
    if plan.monitor.fp8_stats_every > 0 and b is not None and b.monitored:
        out["monitor_hooks"] = ("monitor.fp8_stats_every", AT_LEAST_ONE)
    if b is not None and b.setting(p, "fp8_params"):
        out["fp8_weights.count"] = ("precision.te.fp8_params", AT_LEAST_ONE)
        out["fp8_weights.master"] = ("precision.te.fp8_params", "float32")
        if d.strategy == "fsdp2" and p.te.recipe in ("delayed", "current"):
            out["all_gather_dtype"] = ("precision.te.fp8_params", ("float8_e4m3fn", "float8_e5m2"))
    if p.optimizer_states != "fp32":
        out["optimizer_states"] = ("precision.optimizer_states", p.optimizer_states)
    if p.grad_reduce != "auto":
        out["grad_reduce"] = ("precision.grad_reduce", p.grad_reduce)
    if p.master_weights != "fp32":
        out["master_weights"] = ("precision.master_weights", p.master_weights)
    if plan.msamp_native:
        out["msamp_level"] = ("precision.msamp.opt_level", f"{plan.msamp_native} natively")
    return out


def _value(effects: dict[str, Any], key: str) -> Any:
    value: Any = effects
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _holds(got: Any, want: Any) -> bool:
    if want == AT_LEAST_ONE:
        return isinstance(got, int) and got >= 1
    if isinstance(want, tuple):
        return got in want
    return got == want


def missing(plan: Plan, effects: dict[str, Any], n_blocks: int) -> tuple[str, ...]:
    """One line for each feature the plan asks for that did not take effect. `n_blocks`: the model's
    repeated blocks as fp8launch finds them (models.transformer_blocks)."""
    out = []
    if n_blocks == 0 and (plan.compile.enabled or plan.activation_checkpointing.mode != "none"):
        out.append("the model has no repeated blocks fp8launch can find (a ModuleList model.layers, or a Hugging Face "
                   "model's decoder layers), so torch.compile and activation checkpointing, which wrap each block, have nothing to wrap")
    for key, (spec_key, want) in expected(plan, n_blocks).items():
        got = _value(effects, key)
        if not _holds(got, want):
            shown = " or ".join(map(str, want)) if isinstance(want, tuple) else want
            out.append(f"{spec_key} needs {key} = {shown}, and this run has {got!r}")
    return tuple(out)


def check(plan: Plan, effects: dict[str, Any], model: nn.Module, device: torch.device) -> None:
    """Stop before step 1 (exit 3, rule EFFECT-MISSING) when something the spec asked for did not take effect."""
    from launcher.train.precision import raise_run_errors

    raise_run_errors(plan, device, missing_effects=missing(plan, effects, len(transformer_blocks(model))))


def effects_line(effects: dict[str, Any]) -> str:
    """The start line: what took effect, compactly."""
    off = effects["offload"]
    parts = [f"optimizer {effects['optimizer']}"]
    if effects.get("optimizer_states") not in (None, "fp32", "none"):
        parts[0] += f" ({effects['optimizer_states']} moments)"
    if effects.get("master_weights") not in (None, "fp32", "none"):
        parts.append(f"master weights {effects['master_weights']}")
    if effects.get("grad_reduce") not in (None, "fp32"):
        parts.append(f"gradients reduced in {effects['grad_reduce']}")
    if effects["all_gather_dtype"]:
        parts.append(f"FSDP2 all-gathers {effects['all_gather_dtype']}")
    if effects["compiled_blocks"]:
        parts.append(f"{effects['compiled_blocks']} blocks compiled" + (" (fullgraph)" if effects["fullgraph"] else ""))
    if effects["checkpointed_blocks"]:
        parts.append(f"{effects['checkpointed_blocks']} blocks checkpointed")
    if off != {"parameters": DEVICE, "optimizer_states": DEVICE}:
        parts.append(f"parameters on {off['parameters']}, optimizer states on {off['optimizer_states']}")
    if effects["tensor_parallel"] > 1:
        parts.append(f"tensor parallel {effects['tensor_parallel']}" + (" (async)" if effects["async_tp"] else ""))
    if effects["expert_parallel"] > 1:
        parts.append(f"expert parallel {effects['expert_parallel']}")
    if effects.get("context"):
        parts.append(f"context parallel {effects['context']['ranks']}")
    if effects.get("pipeline"):
        pp = effects["pipeline"]
        from launcher.planning.plan import block_ranges

        blocks = f"blocks {block_ranges(pp['blocks'])}" if pp["blocks"] else "no blocks"
        held = pp.get("rank_stages", [pp["stage"]])
        which = f"stage {held[0]}" if len(held) == 1 else f"stages {', '.join(map(str, held))}"
        parts.append(f"pipeline {which} of {pp['stages']} ({blocks}; {pp['schedule']}, {pp['microbatches']} micro-batches)")
    if effects["monitor_hooks"]:
        parts.append(f"monitor hooks {effects['monitor_hooks']} FP8 layers")
    if effects.get("fp8_weights"):
        w = effects["fp8_weights"]
        parts.append(f"{w['count']} weights stored in FP8, master copy {w['master'] or 'none'}")
    if effects.get("msamp_level"):
        parts.append(f"MS-AMP {effects['msamp_level']}")
    return "effects: " + ", ".join(parts)
