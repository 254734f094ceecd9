"""Tensor parallelism (with sequence parallelism) for the builtin Llama, in torchtitan's manner.

    mesh = distributed.device_mesh(env, layout)     # ("dp_shard", "tp"), TP ranks adjacent (inside a node)
    precision = apply_precision(model, plan, device)
    parallelize(model, plan, mesh["tp"])            # this module: after the precision backend
    fully_shard(block, mesh=mesh["dp_shard"]) ...   # FSDP2 over the data-parallel dimension

The plan (torchtitan's llama3 apply_tp):
  - tok_embeddings: row-wise (vocabulary rows split), output sharded over the sequence (Shard(1));
  - every attention_norm / ffn_norm and the final norm: SequenceParallel (each TP rank normalises
    its slice of the sequence; the weights are replicated);
  - attention: its input is all-gathered over the sequence (PrepareModuleInput), wq / wk / wv
    column-wise (each rank computes n_heads / tp query heads and n_kv_heads / tp KV heads), wo
    row-wise with a reduce-scatter back to sequence shards;
  - feed_forward: all-gather, w1 / w3 column-wise, w2 row-wise with a reduce-scatter;
  - output: column-wise from sequence shards, the logits all-gathered (Replicate): every TP rank
    computes the full loss (no loss parallelism).

With torchao FP8 and the tensorwise recipe, Float8Linear layers use torchao's
Float8ColwiseParallel / Float8RowwiseParallel and the attention and FFN inputs
PrepareFloat8ModuleInput: the activations are cast to float8 BEFORE the all-gather, so the TP
all-gathers carry 1 byte per element instead of 2 (the row-wise reduce-scatters of the partial
outputs stay in the compute dtype). With the rowwise recipes torchao has no float8 TP styles:
the plain styles run and every TP collective moves bf16 (docs/tensor-parallel.md).

Async TP (distributed.async_tp) turns on inductor's micro-pipeline TP pass, which overlaps the
collectives with the GEMMs of the compiled blocks, and symmetric memory for the TP group, without
which the pass fuses nothing (CUDA only; rules TP-ASYNC-*).
"""

from __future__ import annotations

import typing
import warnings

from torch import nn

from launcher.errors import EnvironmentProblem, LauncherError
from launcher.planning.backends import backend_of
from launcher.train.models import transformer_blocks

if typing.TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from launcher.planning.plan import Plan

__all__ = ["parallelize", "float8_tp", "tp_styles_used", "tp_report", "tp_line"]


def float8_tp(plan: Plan) -> bool:
    """Whether the TP collectives carry float8: torchao FP8 with the tensorwise recipe."""
    p = plan.precision
    b = backend_of(p)
    return b is not None and b.float8_tp(p)


def _styles(float8: bool):
    """(colwise, rowwise, prepare_input) classes: torchao's float8 ones or torch's plain ones."""
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    if not float8:
        return ColwiseParallel, RowwiseParallel, PrepareModuleInput
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput


def _is_float8(module: nn.Module) -> bool:
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return False
    return isinstance(module, Float8Linear)


def _check_model(model: nn.Module, tp: int) -> None:
    from launcher.train.models.llama import Llama

    if type(model) is not Llama:  # the dense builtin; its MoE subclass has no tensor-parallel plan
        raise LauncherError(
            f"distributed.tensor_parallel = {tp} needs a model with a tensor-parallel plan, and "
            f"{type(model).__name__} has none (only builtin: models do); fix: set distributed.tensor_parallel = 1, "
            "or train a builtin: model"
        )
    cfg = model.config
    for what, n in (("attention heads", cfg.n_heads), ("KV heads", cfg.kv_heads)):
        if n % tp:
            raise LauncherError(
                f"distributed.tensor_parallel = {tp} does not divide the model's {n} {what}; "
                "fix: set distributed.tensor_parallel to a divisor of both head counts"
            )


def _unwrapped(block: nn.Module) -> nn.Module:
    """The transformer block inside activation-checkpoint and torch.compile wrappers (they share its
    submodules and parameters, so hooks and DTensor parameters put on it are what they run)."""
    while True:
        inner = getattr(block, "_orig_mod", None) or getattr(block, "_checkpoint_wrapped_module", None)
        if not isinstance(inner, nn.Module):
            return block
        block = inner


def tp_styles_used(model: nn.Module) -> dict[str, str]:
    """{module FQN: its parallel style's class name} after `parallelize` (for reports and tests)."""
    out = {}
    for name, module in model.named_modules():
        styles = getattr(module, "_fp8launch_tp_style", None)
        if styles:
            out[name] = styles
    return out


def tp_report(model: nn.Module, plan: Plan, *, async_tp: bool = False) -> dict | None:
    """What `parallelize` did, for the start record: None without tensor parallelism, else the
    degree, the mesh, and how many Linear layers use the float8 TP styles (their all-gathers
    carry float8) and how many the plain ones (their collectives move the compute dtype). `async_tp`:
    whether async TP took effect (launcher/train/effects.py measures it)."""
    d = plan.distributed
    if d.tensor_parallel <= 1:
        return None
    styles = tp_styles_used(model)
    float8 = sorted(n for n, st in styles.items() if st.startswith("Float8") and st.endswith("Parallel"))
    plain = sorted(n for n, st in styles.items() if st in ("ColwiseParallel", "RowwiseParallel"))
    return {"tensor_parallel": d.tensor_parallel, "data_parallel": d.data_parallel, "mesh": ["dp_shard", "tp"],
            "float8_tp_layers": len(float8), "plain_tp_layers": len(plain), "async_tp": async_tp}


def tp_line(report: dict) -> str:
    """One line for the terminal: the layout and what the TP collectives carry."""
    return (f"tensor parallel: mesh dp {report['data_parallel']} x tp {report['tensor_parallel']}; "
            f"{report['float8_tp_layers']} Linear layers with float8 TP all-gathers, "
            f"{report['plain_tp_layers']} with high-precision TP collectives (embedding and output included)"
            + ("; async TP" if report["async_tp"] else ""))


def parallelize(model: nn.Module, plan: Plan, mesh: DeviceMesh) -> nn.Module:
    """Shard `model` (a builtin Llama, already converted by the precision backend) over the 1D
    tensor-parallel `mesh`, in place. A no-op when distributed.tensor_parallel is 1. Call it
    before fully_shard (FSDP2 then shards the TP DTensors over the data-parallel dimension)."""
    tp = plan.distributed.tensor_parallel
    if tp <= 1:
        return model
    if mesh.size() != tp:
        raise LauncherError(f"the tensor-parallel mesh has {mesh.size()} ranks but the plan says {tp}; fix: regenerate the plan")
    _check_model(model, tp)
    if plan.compile.enabled and mesh.device_type == "cpu":  # launch.device = "auto" on a machine without a GPU
        raise EnvironmentProblem(
            "torch.compile of tensor-parallel blocks is broken on CPU (wrong gradients or a crash in backward); "
            "fix: set compile.enabled = false for CPU runs with tensor parallelism, or run on CUDA GPUs",
            rule="TP-COMPILE-CPU",
        )
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    float8 = float8_tp(plan)
    if float8 and mesh.device_type == "cpu":
        _float8_all_gather_as_bytes()
    top = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        # The output head: plain styles whatever the precision (torchtitan does the same); its logits
        # are all-gathered so the loss needs no change.
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True),
    }
    _apply(model, mesh, {name: style for name, style in top.items() if getattr(model, name, None) is not None})  # a pipeline
    # stage holds the embedding, the head, one of them or neither (launcher/train/parallel/pipeline.py)
    # The output head's ColwiseParallel hands back its all-gathered logits as a view (to_local), which
    # FSDP2's root warns about on every rank in case the caller modifies them in place; the loop
    # only reads them (cross_entropy), so the warning is noise here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor", category=UserWarning)
    for block in transformer_blocks(model):
        block = _unwrapped(block)  # prepare_blocks may have wrapped it (checkpoint_wrapper, torch.compile): both are lazy
        layer_plan: dict[str, object] = {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()}
        for parent, cols, row in (("attention", ("wq", "wk", "wv"), "wo"), ("feed_forward", ("w1", "w3"), "w2")):
            owner = block.get_submodule(parent)
            # Float8 styles only on Float8Linear layers (precision.keep may leave some in high
            # precision); the input is cast to float8 before its all-gather only when every
            # column-wise layer reading it is a Float8Linear.
            f8 = {n: float8 and _is_float8(getattr(owner, n)) for n in (*cols, row)}
            layer_plan[parent] = _styles(all(f8[n] for n in cols))[2](input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            for n in cols:
                layer_plan[f"{parent}.{n}"] = _styles(f8[n])[0]()
            layer_plan[f"{parent}.{row}"] = _styles(f8[row])[1](output_layouts=Shard(1))
        _apply(block, mesh, layer_plan)
    if plan.distributed.async_tp:
        _enable_async_tp(mesh)
    return model


_BYTES_PATCHED = False


def _float8_all_gather_as_bytes() -> None:
    """Let torchao's float8 TP all-gathers run over gloo (CPU): gloo has no float8 dtypes
    ("Invalid scalar type"), so the payload travels as the same bytes viewed as uint8 and is
    viewed back as float8 on arrival. Same bytes, same scale: the result is the one NCCL gives.
    Only for tensors on the CPU; a CUDA all-gather goes through torchao's own handler unchanged."""
    global _BYTES_PATCHED
    if _BYTES_PATCHED:
        return
    import torch
    from torchao.float8 import float8_ops
    from torchao.float8.float8_training_tensor import Float8TrainingTensor

    funcol = torch.ops._c10d_functional.all_gather_into_tensor.default
    table = float8_ops.FLOAT8_OPS_TABLE
    original = table[funcol]

    def all_gather(aten_op, args, kwargs=None):
        fp8 = args[0]
        if fp8._data.device.type != "cpu":
            return original(aten_op, args, kwargs)
        data = fp8._data.contiguous()
        out = aten_op(data.view(torch.uint8), *args[1:], **(kwargs or {}))
        return Float8TrainingTensor(out.view(data.dtype), fp8._scale, fp8._orig_dtype, fp8._linear_mm_config, fp8._gemm_input_role)

    for op in (funcol, torch.ops.c10d_functional.all_gather_into_tensor.default):
        if table.get(op) is original:
            table[op] = all_gather
    _BYTES_PATCHED = True


def _apply(module: nn.Module, mesh: DeviceMesh, layer_plan: dict) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(module, mesh, layer_plan)
    for fqn, style in layer_plan.items():
        module.get_submodule(fqn)._fp8launch_tp_style = type(style).__name__


def _enable_async_tp(mesh: DeviceMesh) -> None:
    """Inductor's micro-pipeline TP pass, as torchtitan turns it on: the pass flag, and symmetric memory
    for the TP group (rules TP-ASYNC-COMPILE and TP-ASYNC-CPU stop plans without compile or CUDA)."""
    if mesh.device_type != "cuda":
        raise EnvironmentProblem(
            f'distributed.async_tp needs CUDA GPUs (symmetric memory) and this run is on {mesh.device_type}; '
            'fix: set distributed.async_tp = false, or launch.device = "cuda"',
            rule="TP-ASYNC-CPU",
        )
    enable_async_tp(mesh.get_group().group_name)


def enable_async_tp(group_name: str) -> None:
    """Turn on inductor's micro-pipeline TP pass for the process group `group_name`. The pass fuses an
    all-gather or reduce-scatter with its matmul only where `is_symm_mem_enabled_for_group(group)` holds
    (torch/_inductor/fx_passes/micro_pipeline_tp.py), and the only writer of the table it reads is
    `enable_symm_mem_for_group`, although torch 2.13 marks that deprecated ("no need to call it
    anymore"): without the call the pass returns early and nothing is fused."""
    import torch._inductor.config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    torch._inductor.config._micro_pipeline_tp = True
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*enable_symm_mem_for_group.*", category=FutureWarning)
        enable_symm_mem_for_group(group_name)


def async_tp_active(group_name: str | None) -> bool:
    """Whether async TP is on for the TP group, measured where the pass looks: inductor's flag and the
    group's symmetric memory."""
    import torch._inductor.config
    from torch.distributed._symmetric_memory import is_symm_mem_enabled_for_group

    return bool(group_name) and bool(torch._inductor.config._micro_pipeline_tp) and is_symm_mem_enabled_for_group(group_name)
