"""One run's profile record (profile.json's RUN), from its trace and its layers (torch-free).

    run = run_record(read_trace(path), LayerTable(layers), measured_step_s=[0.41, 0.40])

RUN = {"step_time_s": mean measured step (the loop's own timing of the profiled steps; the profiled windows when
not given), "window_s": mean profiled step window (on a GPU: the device's time for the step, see
parts.device_window), "parts": {part: seconds per step}, "fp8_gemm_flop_share": x, "ceiling": None (bench fills it
in against its baseline), "top": [{"name", "part", "s"}], "gemm_by_module": {label: s}, "device": "cpu" | "cuda",
"steps": n}.
"""

from __future__ import annotations

from launcher.profiling.layers import LayerTable, gemm_flops
from launcher.profiling.parts import PARTS, Work, device_parts, device_window, gemm_op, host_parts, is_fp8_gemm, kernels_of, part_of
from launcher.profiling.trace import Trace

TOP = 10


def run_record(trace: Trace, table: LayerTable, measured_step_s: list[float] | None = None) -> dict:
    if not trace.steps:
        raise ValueError("the trace has no step annotations (fp8launch.step or ProfilerStep#N)")
    n = len(trace.steps)
    parts = dict.fromkeys(PARTS, 0.0)
    by_module: dict[str, float] = {}
    by_shape: dict[str, float] = {}
    flops = {"fp8": 0.0, "hp": 0.0}
    windows, after = [], float("-inf")
    for step in trace.steps:
        if trace.on_device:
            kernels = kernels_of(step, trace.kernels)
            window = device_window(step, kernels, after)
            after = window[1]
            windows.append(window[1] - window[0])
            step_parts = device_parts(window, kernels)
            for k in kernels:  # GEMM kernel time by layer (exposed or not: the kernel's own duration)
                _add_gemm(by_module, by_shape, table, Work(tuple(k.launch.chain()), k.name), k.dur * 1e-6)
        else:
            windows.append(step.dur)
            nodes = list(trace.nodes_in(step))
            step_parts = host_parts(step, nodes)
            for node in nodes:
                chain = node.chain()
                _add_gemm(by_module, by_shape, table, Work(tuple(chain[chain.index(step) + 1:])), node.self_time * 1e-6)
        for k, v in step_parts.items():
            parts[k] += v / n
        _count_flops(trace, step, flops)
    by_module = {k: v / n for k, v in sorted(by_module.items(), key=lambda kv: -kv[1])}
    total = flops["fp8"] + flops["hp"]
    window = sum(windows) / n * 1e-6
    step_time = sum(measured_step_s) / len(measured_step_s) if measured_step_s else window
    return {
        "device": "cuda" if trace.on_device else "cpu",
        "steps": n,
        "step_time_s": step_time,
        "window_s": window,
        "parts": parts,
        "fp8_gemm_flop_share": flops["fp8"] / total if total else table.fp8_flop_share(),
        "ceiling": None,
        "top": top(parts, by_module),
        "gemm_by_module": by_module,
        "gemm_by_shape": {k: v / n for k, v in by_shape.items()},
    }


def _add_gemm(by_module: dict, by_shape: dict, table: LayerTable, work: Work, seconds: float) -> None:
    """GEMM seconds by layer label ("layers.*.feed_forward.w1 (fp8)") and by layer shape ("4096,14336"; "?" unmatched)."""
    part = part_of(work)
    if part not in ("gemm_fp8", "gemm_high_precision") or seconds <= 0:
        return
    op = gemm_op(work.chain)
    found = table.match(op.args, part == "gemm_fp8") if op is not None else None
    label, shape = found if found else ("unmatched GEMMs", None)
    key = f"{label} ({'fp8' if part == 'gemm_fp8' else 'high precision'})"
    by_module[key] = by_module.get(key, 0.0) + seconds
    shape_key = f"{shape[0]},{shape[1]}" if shape else "?"
    by_shape[shape_key] = by_shape.get(shape_key, 0.0) + seconds


def _count_flops(trace: Trace, step, flops: dict) -> None:
    """FLOPs of the step's GEMM ops (the outermost GEMM op of each chain), FP8 or not, on every host thread."""
    for roots in trace.roots.values():
        for node in _within(roots, step):
            chain = node.chain()
            op = gemm_op(chain)
            if op is not node:
                continue
            work = Work(tuple(chain))
            if part_of(work) not in ("gemm_fp8", "gemm_high_precision"):
                continue  # a GEMM inside attention (the math path's bmm) is attention's
            flops["fp8" if is_fp8_gemm(work) else "hp"] += gemm_flops(node.args)


def _within(roots, step):
    stack = [r for r in roots if r.end >= step.ts and r.ts <= step.end]
    while stack:
        node = stack.pop()
        if step.ts <= node.ts <= step.end:
            yield node
        stack.extend(c for c in node.children if c.end >= step.ts and c.ts <= step.end)


def top(parts: dict, by_module: dict) -> list[dict]:
    """The heaviest items: GEMMs by layer, and each other part as a whole."""
    items = [{"name": k, "part": "gemm_fp8" if k.endswith("(fp8)") else "gemm_high_precision", "s": v} for k, v in by_module.items()]
    items += [{"name": p.replace("_", " "), "part": p, "s": v} for p, v in parts.items() if not p.startswith("gemm") and v > 0]
    return sorted(items, key=lambda x: -x["s"])[:TOP]
