"""A spec's profile against its baseline's (`fp8launch bench --profile`): the ceiling, what holds the ratio back in
words a user acts on, the prediction's parts beside the measured ones, and the picture. Torch-free.

The ceiling is Amdahl's law on the baseline's parts: the FP8/bf16 ratio this shape could reach if every GEMM the
spec runs in FP8 ran at the device's FP8/bf16 peak ratio r and nothing else changed:
    ceiling = T_b / (T_b - G + G / r)
with T_b the baseline's step and G the baseline's GEMM time of the layers the spec runs in FP8 (by layer, from the
shapes; where a layer is not matched, the baseline's GEMM time times the spec's FP8 FLOP share).
"""

from __future__ import annotations

from launcher.profiling.parts import PARTS

PREDICTED = {"gemm": ("linear_gemms", "recompute"), "fp8_cast": ("fp8_casts",), "attention": ("attention",), "loss": ("loss",),
             "optimizer": ("optimizer",), "communication": ("exposed_comm",), "other": ("elementwise",)}
"""Measured part (gemm: gemm_fp8 + gemm_high_precision) -> the prediction's breakdown entries it compares with."""
DIFFERS = 0.25
"""A part whose measurement and prediction differ by more than this (relative) is named."""


def peak_ratio(device_name: str | None, fallback_gpu: str = "H100") -> tuple[float, str]:
    """(FP8/bf16 dense peak ratio, where it comes from): the device's own, or `fallback_gpu`'s where the device
    has no FP8 peak (a CPU)."""
    from launcher.planning.gpus import peak_tflops

    if device_name:
        fp8, bf16 = peak_tflops(device_name, "fp8"), peak_tflops(device_name, "bf16")
        if fp8 and bf16:
            return fp8 / bf16, f"{device_name}'s FP8/bf16 dense peak ratio"
    fp8, bf16 = peak_tflops(fallback_gpu, "fp8"), peak_tflops(fallback_gpu, "bf16")
    return fp8 / bf16, f"{fallback_gpu}'s FP8/bf16 dense peak ratio ({device_name or 'this device'} has no FP8 peak)"


def fp8able_gemm_s(spec: dict, baseline: dict) -> float:
    """The baseline's GEMM seconds per step of the layers the spec runs in FP8: each layer shape's time times the share
    of the layers of that shape the spec converts; unmatched GEMMs times the spec's FP8 FLOP share."""
    from launcher.profiling.layers import shape_of

    fp8_names = {row[0] for row in spec.get("layers", []) if row[3]}
    shapes: dict[str, list[int]] = {}
    for name, k, n, _ in baseline.get("layers", []):
        counts = shapes.setdefault("{},{}".format(*shape_of(k, n)), [0, 0])
        counts[0] += 1
        counts[1] += name in fp8_names
    if not baseline.get("gemm_by_shape"):
        return (baseline["parts"]["gemm_fp8"] + baseline["parts"]["gemm_high_precision"]) * spec.get("fp8_gemm_flop_share", 0.0)
    out = 0.0
    for shape, s in baseline["gemm_by_shape"].items():
        total, fp8 = shapes.get(shape, (0, 0))
        out += s * fp8 / total if total else s * spec.get("fp8_gemm_flop_share", 0.0)
    return out


def ceiling(spec: dict, baseline: dict, ratio: float) -> float:
    t = baseline["step_time_s"]
    g = min(fp8able_gemm_s(spec, baseline), t)
    return t / (t - g + g / ratio) if t > 0 else 1.0


def compare(spec: dict, baseline: dict, *, device_name: str | None, prediction: dict | None = None, plan_gpu: str = "H100",
            plan: dict | None = None) -> dict:
    """profile.json for a bench: {"spec": RUN, "baseline": RUN, "advice": [...], "prediction": {...}} with each RUN's
    ceiling filled in (the baseline's own is 1: it is the reference)."""
    ratio, basis = peak_ratio(device_name, plan_gpu)
    spec = {**spec, "ceiling": ceiling(spec, baseline, ratio)}
    baseline = {**baseline, "ceiling": 1.0}
    out = {"spec": spec, "baseline": baseline, "ceiling_basis": f"Amdahl on the baseline's parts with {basis} = {ratio:.2f}",
           "measured_ratio": baseline["step_time_s"] / spec["step_time_s"] if spec["step_time_s"] else None}
    out["of_ceiling"] = out["measured_ratio"] / spec["ceiling"] if out["measured_ratio"] and spec["ceiling"] else None
    out["advice"] = advice(spec, baseline, plan or {})
    if prediction:
        out["prediction"] = beside_prediction(spec, prediction, device_name)
    return out


def advice(spec: dict, baseline: dict, plan: dict) -> list[str]:
    """What holds the spec's ratio back, heaviest first, each naming what to change."""
    t = spec["step_time_s"] or 1.0
    parts = spec["parts"]
    lines = []
    hp = {k.rsplit(" (", 1)[0]: s for k, s in spec.get("gemm_by_module", {}).items() if k.endswith("(high precision)")}
    head = next((s for name, s in hp.items() if name in ("output", "lm_head") or name.endswith((".output", ".lm_head"))), 0.0)
    kept = sum(hp.values()) - head
    precision = plan.get("precision", {})
    items = [
        (head, f"the {_hp(plan)} output layer (lm_head) is {head / t:.0%} of the step: precision.keep_first_last = false would put it in "
               "FP8, at the risk of the logits' precision (torchtitan, Accelerate and Megatron keep it in bf16)"),
        (kept, f"the Linear layers kept in {_hp(plan)} are {kept / t:.0%} of the step (the layers map says which, and why: skip_small, "
               "keep, keep_first_last, kept blocks)"),
        (parts["fp8_cast"], f"FP8 scaling and casts are {parts['fp8_cast'] / t:.0%} of the step"
         + ("" if plan.get("compile", {}).get("enabled") else ": compile.enabled = true fuses them into the neighbouring kernels")),
        (parts["attention"], f"attention is {parts['attention'] / t:.0%} of the step and stays in bf16 in every torchao recipe "
                             "(Transformer Engine's precision.te.fp8_dpa runs it in FP8)"),
        (parts["loss"], f"the loss is {parts['loss'] / t:.0%} of the step: the fp32 logits over the vocabulary are read and written "
                        "several times (a larger train.micro_batch_size spreads nothing; a fused or chunked cross entropy would)"),
        (parts["optimizer"], f"the optimizer step is {parts['optimizer'] / t:.0%} of the step"
         + (" (precompute_scale adds an all-reduce)" if precision.get("torchao", {}).get("precompute_scale") else "")),
        (parts["communication"], f"exposed communication is {parts['communication'] / t:.0%} of the step"),
        (parts["idle"], f"the device is idle {parts['idle'] / t:.0%} of the step, waiting on the host (Python, launches, data): "
                        "compile.enabled = true and a larger train.micro_batch_size help"),
    ]
    for seconds, line in sorted(items, key=lambda x: -x[0]):
        if seconds / t >= 0.05:
            lines.append(line)
    return lines[:3]


def _hp(plan: dict) -> str:
    return plan.get("precision", {}).get("high_precision", "bf16")


def beside_prediction(spec: dict, prediction: dict, device_name: str | None) -> dict:
    """The prediction's per-part seconds beside the measured ones (both per step), and the parts that differ by more
    than DIFFERS. On another device than the one predicted for, the figures stand side by side, not compared."""
    predicted = prediction.get("breakdown_s", {}).get("plan", {})
    gpu = prediction.get("gpu", "")
    measured = spec["parts"]
    rows, differ = {}, []
    same_device = bool(device_name) and gpu and gpu.lower() in device_name.lower()
    for part, keys in PREDICTED.items():
        m = measured["gemm_fp8"] + measured["gemm_high_precision"] if part == "gemm" else measured[part]
        p = sum(predicted.get(k, 0.0) for k in keys)
        rows[part] = {"measured_s": m, "predicted_s": p}
        if same_device and p > 0 and abs(m - p) / p > DIFFERS:
            differ.append(part)
    return {"gpu": gpu, "compared": bool(same_device), "parts": rows, "differ": differ}


def table_lines(profile: dict) -> list[str]:
    """bench's table rows for a profile: the FP8 FLOP share, the ceiling and the advice."""
    s, b = profile["spec"], profile["baseline"]
    lines = [f"{'FP8 GEMM FLOP share':<20} {s['fp8_gemm_flop_share']:>14.1%} {b['fp8_gemm_flop_share']:>14.1%}",
             f"{'ceiling (Amdahl)':<20} {s['ceiling']:>14.3f} {'':>14} ({profile['ceiling_basis']})"]
    if profile.get("of_ceiling") is not None:
        lines.append(f"measured {profile['measured_ratio']:.3f}x of a {s['ceiling']:.3f}x ceiling = {profile['of_ceiling']:.0%} of it")
    width = max(len(p) for p in PARTS)
    lines.append("where a step goes (s):" + "".join(f"\n  {p:<{width}} {s['parts'][p]:>10.4f} {b['parts'][p]:>10.4f}" for p in PARTS))
    for line in profile.get("advice", []):
        lines.append(f"holds it back: {line}")
    pred = profile.get("prediction")
    if pred and pred["compared"] and pred["differ"]:
        lines.append("the prediction misses by more than 25% on: " + ", ".join(pred["differ"]))
    elif pred and not pred["compared"]:
        lines.append(f"(the prediction is for {pred['gpu']}: its parts are in profile.json, not compared on this device)")
    return lines


def plot(profile: dict, path: str) -> str:
    """The runs' parts as stacked bars side by side, the spec's ceiling marked (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from launcher.targets.files import save_atomic

    runs = [(k, profile[k]) for k in ("baseline", "spec", "run") if k in profile]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colors = plt.get_cmap("tab10").colors
    for i, (label, run) in enumerate(runs):
        bottom = 0.0
        for j, part in enumerate(PARTS):
            v = run["parts"][part]
            ax.bar(i, v, bottom=bottom, color=colors[j % 10], label=part if i == 0 else None, width=0.6)
            bottom += v
    if "spec" in profile and "baseline" in profile and profile["spec"].get("ceiling"):
        best = profile["baseline"]["step_time_s"] / profile["spec"]["ceiling"]
        i = [k for k, _ in runs].index("spec")
        ax.hlines(best, i - 0.4, i + 0.4, colors="black", linestyles="dashed", label=f"ceiling {profile['spec']['ceiling']:.2f}x")
    ax.set_xticks(range(len(runs)), [k for k, _ in runs])
    ax.set_ylabel("seconds per step")
    ax.set_title("where a step goes")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    save_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    return path
