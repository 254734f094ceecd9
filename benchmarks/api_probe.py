"""The version-dependent torch and torchao APIs the speed stage uses, probed on this machine's own torch in the call's
first seconds: benchmarks/gpu_session.sh writes the lines into environment.txt, so a run that fails on a missing API
says why before any run has started. The GPU image's torch (2.11) is not the one the CPU tests run (2.13).

    python3 benchmarks/api_probe.py [--device cuda|cpu]

Prints the versions, then one line an API (`api NAME: ok ...` or `api NAME: MISSING: why`, with what uses it), then a
summary line. Exits 0 whatever it finds: what the environment says is information, and the runs go on.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import sys
from typing import Callable


def _has(obj, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _attrs(module: str, *names: str) -> str:
    mod = importlib.import_module(module)
    missing = [n for n in names if not _has(mod, n)]
    if missing:
        raise AttributeError(f"{module} has no {', '.join(missing)}")
    return ""


def _scaled_mm(device: str) -> str:
    import torch

    a = torch.randn(16, 32, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLAS takes the second operand
    one = torch.ones((), device=device)
    out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return f"(16x32 @ 32x16 e4m3 -> {str(out.dtype).removeprefix('torch.')} on {device})"


def _float8_linear(device: str) -> str:
    import torch
    from torchao.float8 import Float8LinearConfig, _inductor_patch, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    before = getattr(_inductor_patch, "_PATCHED", None)
    if device != "cuda" and isinstance(before, bool):
        _inductor_patch._PATCHED = True  # off CUDA, as fp8launch converts: without importing Inductor's Triton code generator
    model = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False)).to(device=device, dtype=torch.bfloat16)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    model(torch.randn(16, 32, device=device, dtype=torch.bfloat16, requires_grad=True)).sum().backward()
    if device != "cuda":
        return f"(tensorwise Float8Linear forward and backward on {device}: {isinstance(model[0], Float8Linear)})"
    return (f"(tensorwise Float8Linear forward and backward on {device}: {isinstance(model[0], Float8Linear)}; "
            f"torchao's Triton min/max patch applied: {getattr(_inductor_patch, '_PATCHED', None)} (before: {before}))")


def _collectives() -> str:
    import torch.distributed as dist

    pairs = (("all_gather_single", "all_gather_into_tensor"), ("reduce_scatter_single", "reduce_scatter_tensor"))
    said = []
    for new, old in pairs:
        if hasattr(dist, new):
            said.append(new)
        elif hasattr(dist, old):
            said.append(f"{old} (the fallback: no {new})")
        else:
            raise AttributeError(f"torch.distributed has neither {new} nor {old}")
    return f"({', '.join(said)})"


def _fused_adamw() -> str:
    import torch

    if "fused" not in inspect.signature(torch.optim.AdamW.__init__).parameters:
        raise TypeError("torch.optim.AdamW takes no fused=")
    return ""


def _profiler(device: str) -> str:
    from torch.profiler import ProfilerActivity, profile, record_function, schedule  # noqa: F401

    if device == "cuda" and not hasattr(ProfilerActivity, "CUDA"):
        raise AttributeError("torch.profiler.ProfilerActivity has no CUDA")
    if not hasattr(profile, "export_chrome_trace"):
        raise AttributeError("torch.profiler.profile has no export_chrome_trace")
    return ""


def probes(device: str) -> list[tuple[str, str, Callable[[], str]]]:
    """(name, what uses it, check): a check returns a note (or "") or raises."""
    return [
        ("torch.float8_e4m3fn, float8_e5m2", "torchao's casts", lambda: _attrs("torch", "float8_e4m3fn", "float8_e5m2")),
        ("torch._scaled_mm", "torchao tensorwise's FP8 GEMM", lambda: _scaled_mm(device)),
        ("torch.distributed.fsdp: fully_shard, MixedPrecisionPolicy, FSDPModule, OffloadPolicy, CPUOffloadPolicy",
         "launcher/train/engines/fsdp2.py, benchmarks/reference_loop.py",
         lambda: _attrs("torch.distributed.fsdp", "fully_shard", "MixedPrecisionPolicy", "FSDPModule", "OffloadPolicy",
                        "CPUOffloadPolicy")),
        ("torch.distributed.device_mesh.init_device_mesh", "launcher/train/parallel/distributed.py, the reference loop",
         lambda: _attrs("torch.distributed.device_mesh", "init_device_mesh")),
        ("torch.distributed.tensor._utils.compute_local_shape_and_global_offset (private)", "launcher/train/materialize.py",
         lambda: _attrs("torch.distributed.tensor._utils", "compute_local_shape_and_global_offset")),
        ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper: checkpoint_wrapper, CheckpointWrapper (private)",
         "launcher/train/compile_ac.py, effects.py, the reference loop",
         lambda: _attrs("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "checkpoint_wrapper", "CheckpointWrapper")),
        ("torch._dynamo.eval_frame.OptimizedModule (private)", "launcher/train/effects.py",
         lambda: _attrs("torch._dynamo.eval_frame", "OptimizedModule")),
        ("torch._inductor.config: emulate_precision_casts, cpp.simdlen", "the reference loop's FP8 compile, compile_ac.py on CPU",
         lambda: _attrs("torch._inductor.config", "emulate_precision_casts", "cpp.simdlen")),
        ("torch.optim.AdamW(fused=)", "the reference loop on CUDA", _fused_adamw),
        ("torch.profiler: profile, schedule, record_function, ProfilerActivity, export_chrome_trace",
         "launcher/train/profiling.py (the timing runs' last steps)", lambda: _profiler(device)),
        ("torch.distributed all_gather_single / reduce_scatter_single, or their fallbacks",
         "launcher/train/parallel/grad_reduce.py (precision.grad_reduce; not in the speed specs)", _collectives),
        ("torchao.float8: Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp, Float8Linear",
         "launcher/train/precision/torchao_fp8.py, the reference loop",
         lambda: _attrs("torchao.float8", "Float8LinearConfig", "convert_to_float8_training", "precompute_float8_dynamic_scale_for_fsdp")
         + _attrs("torchao.float8.float8_linear", "Float8Linear")),
        ("torchao.float8._inductor_patch: _PATCHED, _patch_inductor_min_max_codegen (private)",
         "torchao_fp8.py's CPU skip of torchao's Triton patch",
         lambda: _attrs("torchao.float8._inductor_patch", "_PATCHED", "_patch_inductor_min_max_codegen")),
        ("torchao Float8Linear, converted and run", "the speed specs' FP8 layers", lambda: _float8_linear(device)),
        ("torch.distributed.tensor: _ops.scaled_mm_single_dim_strategy, _dispatch.is_pinned_handler (private)",
         "torchao's MXFP8 training (not in the speed specs)",
         lambda: _attrs("torch.distributed.tensor._ops", "scaled_mm_single_dim_strategy")
         + _attrs("torch.distributed.tensor._dispatch", "is_pinned_handler")),
    ]


NOT_PROBED = "context and pipeline parallelism's private APIs: the speed stage trains on one process"


def versions() -> str:
    import torch

    def v(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "none"

    line = (f"python {sys.version.split()[0]} torch {torch.__version__} cuda {torch.version.cuda} torchao {v('torchao')} "
            f"deepspeed {v('deepspeed')} fp8launch {v('fp8launch')}")
    if torch.cuda.is_available():
        line += f" device {torch.cuda.get_device_name(0)} capability {torch.cuda.get_device_capability(0)}"
    return line


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args(argv).device
    print(versions(), flush=True)
    missing = []
    found = probes(device)
    for name, used_by, check in found:
        try:
            note = check()
        except Exception as e:  # noqa: BLE001 -- every failure is the finding: it is printed, the probe goes on
            missing.append(name.split(":")[0].split(" (")[0])
            print(f"api {name}: MISSING: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (used by {used_by})", flush=True)
        else:
            print(f"api {name}: ok{' ' + note if note else ''}", flush=True)
    print(f"api not probed: {NOT_PROBED}")
    print(f"api probe on {device}: {len(found) - len(missing)} of {len(found)} present"
          + (f"; missing: {'; '.join(missing)}" if missing else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
