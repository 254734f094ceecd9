"""fp8launch against the hand-written reference loop (and torchtitan where it ran), measured in one session, with the
speed targets marked met / not met. Reads what benchmarks/gpu_bench.sh wrote; never makes a figure up: a run that is
missing is "not measured".

    python benchmarks/compare_reference.py --bench OUT/8b-ac [--bench OUT/1b ...] --reference OUT/reference \\
        [--torchtitan OUT/torchtitan] [--results benchmarks/results] [--out OUT]

The first --bench is the core: the reference loop ran on its shape (reference/bf16.json, reference/fp8.json), so its
bf16 baseline and FP8 spec are what the reference is compared with. A bench's profile is, as gpu_bench.sh runs it, its
own runs' last steps (`bench --profile-last N`: bench.json's timed_steps, which no profiler touched, give every ratio
and tokens/s); else that of a separate short profiled bench of the same spec beside it (DIR-profile/, an older
session's layout); else an older `bench --profile` run's own, whose first runs were profiled throughout. The profile
gives the FP8 GEMM FLOP share and the ceiling; "of ceiling" = the unprofiled ratio / the ceiling wherever there is an
unprofiled ratio. Writes <date>-<device>-speed.json and .md into --results (and --out), and prints the markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    id: str
    what: str
    threshold: float
    where: str
    """The setting the target is stated for (a measurement elsewhere is reported, with this said)."""


TARGETS = (
    Target("fp8_vs_bf16", "FP8 / bf16 tokens/s of the core bench (the 8B-shaped run)", 1.25, "one H100"),
    Target("of_ceiling", "FP8 / bf16 tokens/s (unprofiled) / the profile's Amdahl ceiling", 0.90, "a GPU with an FP8 peak"),
    Target("vs_reference_bf16", "fp8launch / reference loop tokens/s, bf16", 0.97, "a GPU"),
    Target("vs_reference_fp8", "fp8launch / reference loop tokens/s, FP8", 0.97, "a GPU"),
)
"""The targets of issue 28, in one place."""


def _load(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fp8launch_tokens_per_s(record: dict, side: str) -> tuple[float | None, str]:
    """(tokens/s of one variant of a bench, which runs it comes from). With --profile-last the figures are the medians
    over the steps before the profiled ones; with --profile the first run of each variant ran under the profiler: the
    later runs are used where there are any."""
    runs = [r for r in record[side]["runs"] if r.get("figures", {}).get("tokens_per_s") is not None]
    if not runs:
        return None, "no run"
    if record.get("timed_steps"):
        first, last = record["timed_steps"]
        return (record[side]["figures"]["tokens_per_s"],
                f"median of {len(runs)} run(s), steps {first}..{last} (unprofiled: the profiled steps came after them)")
    if record.get("profile") and len(runs) > 1:
        return statistics.median(r["figures"]["tokens_per_s"] for r in runs[1:]), f"median of runs 2..{len(runs)} (run 1 was profiled)"
    if record.get("profile"):
        return runs[0]["figures"]["tokens_per_s"], "run 1, profiled (the profiler's overhead counts against fp8launch)"
    return record[side]["figures"]["tokens_per_s"], f"median of {len(runs)} run(s)"


def bench_row(path: str) -> dict:
    """One bench folder's figures: the FP8/bf16 ratio and, with --profile, the FLOP share and the ceiling."""
    record = _load(os.path.join(path, "bench.json"))
    name = os.path.basename(os.path.normpath(path))
    if record is None:
        return {"bench": name, "dir": path, "measured": False}
    s, b = record["spec"], record["baseline"]
    own = record.get("profile") or _load(os.path.join(path, "profile.json"))
    beside = None if own else _load(os.path.join(os.path.normpath(path) + "-profile", "bench.json"))
    profile = own or (beside or {}).get("profile")
    row = {
        "bench": name, "dir": path, "measured": True, "spec": s["spec"],
        "baseline": b["spec"] if b["label"] == "baseline" else f"{s['spec']} with precision.mode={b['label']}",
        "fp8_layers": s.get("fp8_layers"), "total_linear": s.get("total_linear"),
        "runs": len(s["runs"]), "steps": len(s["runs"][0]["losses"]) if s["runs"] else 0,
        "warmup_steps_excluded": record.get("warmup_steps_excluded"),
        "tokens_per_s": {"fp8": s["figures"]["tokens_per_s"], "bf16": b["figures"]["tokens_per_s"],
                         "ratio": record["ratios"]["tokens_per_s"]},
        "peak_mem_gib": {"fp8": s["figures"]["peak_mem_gib"], "bf16": b["figures"]["peak_mem_gib"]},
        "final_loss": {"fp8": s["figures"]["final_loss"], "bf16": b["figures"]["final_loss"]},
        "environment": record.get("environment", {}),
        "profile": None,
        "command": bench_command(record),
    }
    if profile:
        ceiling, ratio = profile["spec"].get("ceiling"), record["ratios"]["tokens_per_s"]
        unprofiled = not own or bool(record.get("timed_steps"))  # a ratio no profiler touched
        source = (f"the timing runs' last {record.get('profile_last')} steps" if own and unprofiled
                  else "the bench's own first runs" if own else f"a separate profiled bench ({name}-profile)")
        row["profile"] = {"fp8_gemm_flop_share": profile["spec"].get("fp8_gemm_flop_share"),
                          "baseline_gemm_fp8_s": profile["baseline"]["parts"].get("gemm_fp8"),
                          "ceiling": ceiling, "measured_ratio": profile.get("measured_ratio"),
                          "of_ceiling": (ratio / ceiling if ratio and ceiling else None) if unprofiled else profile.get("of_ceiling"),
                          "profiled_of_ceiling": profile.get("of_ceiling"), "ceiling_basis": profile.get("ceiling_basis"),
                          "advice": profile.get("advice", []), "source": source, "unprofiled": unprofiled,
                          "command": None if own else bench_command(beside)}
    elif beside is not None:
        row["profile_error"] = beside.get("profile_error") or "the profiled bench wrote no profile"
        row["profile_command"] = bench_command(beside)
    row["_record"] = record
    return row


def bench_command(record: dict) -> str:
    """The `fp8launch bench` command that wrote `record`, from what bench.json keeps (spec, baseline, --set overrides,
    steps, warmup, repeats, whether it profiled)."""
    s, b = record["spec"], record["baseline"]
    vs = b["spec"] if b["label"] == "baseline" else b["label"]
    steps = len(s["runs"][0]["losses"]) if s["runs"] else 0
    profiled = bool(record.get("profile") or record.get("profile_error"))
    flag = ["--profile-last", str(record["profile_last"])] if record.get("profile_last") else ["--profile"] if profiled else []
    words = ["fp8launch", "bench", s["spec"], "--vs", vs, "--steps", str(steps), "--warmup", str(record.get("warmup_steps_excluded")),
             "--repeats", str(record.get("repeats"))] + flag
    for item in s.get("overrides", []):
        words += ["--set", item]
    return " ".join(shlex.quote(w) for w in words)


def reference_side(core: dict, ref: dict | None, precision: str) -> dict:
    """fp8launch's variant of the core bench in `precision` against the reference loop's run in it."""
    side = "spec" if precision == "fp8" else "baseline"
    out = {"precision": precision, "reference_measured": ref is not None, "fp8launch_measured": core.get("measured", False)}
    mine, basis = fp8launch_tokens_per_s(core["_record"], side) if core.get("measured") else (None, "no bench")
    out.update(fp8launch_tokens_per_s=mine, fp8launch_basis=basis)
    if core.get("measured"):
        rec = core["_record"][side]
        out.update(fp8launch_fp8_layers=rec.get("fp8_layers"), fp8launch_total_linear=rec.get("total_linear"),
                   fp8launch_peak_mem_gib=rec["figures"]["peak_mem_gib"], fp8launch_final_loss=rec["figures"]["final_loss"])
    if ref is not None:
        out.update(reference_tokens_per_s=ref["tokens_per_s"], reference_fp8_layers=ref["fp8_layers"],
                   reference_total_linear=ref["total_linear"], reference_peak_mem_gib=ref["peak_mem_gib"],
                   reference_final_loss=ref["losses"][-1] if ref["losses"] else None, reference_steps=len(ref["losses"]),
                   reference_command=ref["command"], reference_optimizer=ref["optimizer"])
    out["mismatch"] = mismatch(core["_record"][side], ref) if core.get("measured") and ref is not None else None
    theirs = out.get("reference_tokens_per_s")
    out["ratio"] = mine / theirs if mine and theirs and not out["mismatch"] else None
    return out


def mismatch(variant: dict, ref: dict) -> str | None:
    """Why fp8launch's run and the reference's did not train the same job (then no ratio is taken), or None."""
    start = variant["runs"][0].get("start", {}) if variant["runs"] else {}
    pairs = (("tokens per step", start.get("tokens_per_step"), ref["tokens_per_step"]),
             ("processes", start.get("world_size"), ref["world_size"]), ("parameters", start.get("parameters"), ref.get("parameters")))
    differ = [f"{what} {a} vs {b}" for what, a, b in pairs if a is not None and b is not None and a != b]
    return "; ".join(differ) or None


def torchtitan_summary(path: str | None) -> dict | None:
    """torchtitan's result.json (gpu_bench.sh writes one, or one saying why it was skipped)."""
    return _load(os.path.join(path, "result.json")) if path else None


def verdicts(core: dict, ref: dict, device_name: str | None, world_size: int | None) -> list[dict]:
    on_gpu = bool(device_name) and device_name != "cpu"
    settings = {"one H100": on_gpu and "H100" in device_name and world_size == 1, "a GPU with an FP8 peak": on_gpu, "a GPU": on_gpu}
    profile = core.get("profile") or {}
    values = {"fp8_vs_bf16": (core.get("tokens_per_s") or {}).get("ratio"), "of_ceiling": profile.get("of_ceiling"),
              "vs_reference_bf16": ref["bf16"]["ratio"], "vs_reference_fp8": ref["fp8"]["ratio"]}
    apart = {"vs_reference_bf16": ref["bf16"].get("mismatch"), "vs_reference_fp8": ref["fp8"].get("mismatch")}
    out = []
    for t in TARGETS:
        value = values[t.id]
        met = None if value is None else value >= t.threshold
        verdict = ("not comparable: " + apart[t.id]) if apart.get(t.id) else "not measured" if met is None else "met" if met else "not met"
        note = "" if settings[t.where] else (f"measured on {device_name or 'an unknown device'}, not on {t.where}: "
                                             "the verdict says nothing of the target")
        out.append({"id": t.id, "what": t.what, "threshold": t.threshold, "where": t.where, "value": value, "met": met,
                    "verdict": verdict, "applies": settings[t.where], "note": note})
    return out


def compare(bench_dirs: list[str], reference_dir: str | None, torchtitan_dir: str | None, date: str) -> dict:
    rows = [bench_row(d) for d in bench_dirs]
    core = rows[0]
    refs = {p: _load(os.path.join(reference_dir, f"{p}.json")) if reference_dir else None for p in ("bf16", "fp8")}
    env = dict(core.get("environment") or {})
    device_name = env.get("device_name") or next((r["device_name"] for r in refs.values() if r), None)
    reference = {p: reference_side(core, refs[p], p) for p in ("bf16", "fp8")}
    reference["shape"] = next((r["shape"] | {"seq_len": r["seq_len"], "micro_batch_size": r["micro_batch_size"],
                                             "world_size": r["world_size"]} for r in refs.values() if r), None)
    ref_versions = next((r["versions"] for r in refs.values() if r), {})
    result = {
        "date": date, "device_name": device_name, "environment": env, "reference_versions": ref_versions,
        "benches": [{k: v for k, v in r.items() if k != "_record"} for r in rows],
        "reference": reference, "torchtitan": torchtitan_summary(torchtitan_dir),
        "targets": verdicts(core, reference, device_name, env.get("world_size")),
    }
    return result


def _f(v, fmt: str = "{:,.0f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def markdown(r: dict) -> str:
    env = r["environment"]
    lines = [f"# fp8launch speed on {r['device_name'] or 'an unknown device'}, {r['date']}", "",
             f"torch {env.get('torch')}, torchao {env.get('torchao')}, fp8launch {env.get('fp8launch')}; world size "
             f"{env.get('world_size')}. Every figure below was read from this session's bench.json, profile.json and reference "
             "JSONs.", "", "## FP8 vs bf16 (`fp8launch bench SPEC --vs BF16_TWIN`, timed on unprofiled steps)", "",
             "| bench | FP8 layers | tokens/s bf16 | tokens/s FP8 | FP8 / bf16 | FP8 GEMM FLOP share | ceiling | of ceiling | "
             "ratio under the profiler | runs x steps |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for b in r["benches"]:
        if not b["measured"]:
            lines.append(f"| {b['bench']} | not measured (no bench.json in {b['dir']}) | | | | | | | | |")
            continue
        t, p = b["tokens_per_s"], b["profile"] or {}
        lines.append(f"| {b['bench']} ({os.path.basename(b['spec'])}) | {b['fp8_layers']} of {b['total_linear']} | {_f(t['bf16'])} | "
                     f"{_f(t['fp8'])} | {_f(t['ratio'], '{:.3f}')} | {_f(p.get('fp8_gemm_flop_share'), '{:.1%}')} | "
                     f"{_f(p.get('ceiling'), '{:.3f}')} | {_f(p.get('of_ceiling'), '{:.0%}')} | {_f(p.get('measured_ratio'), '{:.3f}')} | "
                     f"{b['runs']} x {b['steps']} |")
        if p and p["unprofiled"]:
            notes.append(f"{b['bench']}: the FLOP share and the ceiling from {p['source']}; \"of ceiling\" is the unprofiled "
                         "FP8 / bf16 over the ceiling")
        elif p:
            notes.append(f"{b['bench']}: profiled in its own first runs (its figures are under the profiler)")
        elif b.get("profile_error"):
            notes.append(f"{b['bench']}: no profile: {b['profile_error']}")
    lines += [""] + [f"- {n}" for n in notes] if notes else []
    core = r["benches"][0]
    lines += ["", f"## fp8launch vs the hand-written reference loop (`benchmarks/reference_loop.py`, the shape of {core['bench']})", ""]
    shape = r["reference"]["shape"]
    if shape:
        lines += [f"Shape: dim {shape['dim']}, {shape['layers']} layers, {shape['heads']} heads / {shape['kv_heads']} KV, FFN "
                  f"{shape['ffn']}, vocab {shape['vocab']}, {shape['micro_batch_size']} x {shape['seq_len']} tokens per rank, "
                  f"{shape['world_size']} process(es); same synthetic batches, seed and lr schedule as the bench.", ""]
    lines += ["| precision | fp8launch tokens/s | reference tokens/s | fp8launch / reference | FP8 layers fp8launch / reference | "
              "peak mem fp8launch / reference (GiB) | final loss fp8launch / reference |", "|---|---|---|---|---|---|---|"]
    for p in ("bf16", "fp8"):
        s = r["reference"][p]
        layers = (f"{s.get('fp8launch_fp8_layers')} / {s.get('reference_fp8_layers')} of {s.get('reference_total_linear')}"
                  if s["reference_measured"] and s["fp8launch_measured"] else "n/a")
        lines.append(f"| {p} | {_f(s['fp8launch_tokens_per_s'])} | {_f(s.get('reference_tokens_per_s'))} | {_f(s['ratio'], '{:.3f}')} | "
                     f"{layers} | {_f(s.get('fp8launch_peak_mem_gib'), '{:.1f}')} / {_f(s.get('reference_peak_mem_gib'), '{:.1f}')} | "
                     f"{_f(s.get('fp8launch_final_loss'), '{:.3f}')} / {_f(s.get('reference_final_loss'), '{:.3f}')} |")
    lines += ["", "fp8launch's tokens/s: " + "; ".join(f"{p}: {r['reference'][p]['fp8launch_basis']}" for p in ("bf16", "fp8")) + "."]
    for p in ("bf16", "fp8"):
        if r["reference"][p].get("mismatch"):
            lines.append(f"{p}: NOT the same job, no ratio taken ({r['reference'][p]['mismatch']}).")
    tt = r["torchtitan"]
    lines += ["", "## torchtitan", ""]
    if not tt:
        lines.append("Not run (no torchtitan/result.json).")
    elif tt.get("skipped"):
        lines.append(f"Skipped: {tt['skipped']}")
    else:
        lines.append(f"torchtitan {tt.get('version')}: {_f(tt.get('tokens_per_s'))} tokens/s "
                     f"({tt.get('precision')}; {tt.get('basis', '')})")
    lines += ["", "## Targets", "", "| target | setting | threshold | measured | verdict |", "|---|---|---|---|---|"]
    for t in r["targets"]:
        value = _f(t["value"], "{:.0%}" if t["id"] == "of_ceiling" else "{:.3f}")
        threshold = f">= {t['threshold']:.0%}" if t["id"] == "of_ceiling" else f">= {t['threshold']:g}"
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['what']} | {t['where']} | {threshold} | {value} | {t['verdict']}{note} |")
    commands = [c for b in r["benches"] if b["measured"]
                for c in (b["command"], (b.get("profile") or {}).get("command") or b.get("profile_command")) if c]
    commands += [r["reference"][p]["reference_command"] for p in ("bf16", "fp8") if r["reference"][p].get("reference_command")]
    if tt and tt.get("command"):
        commands.append(tt["command"])
    lines += ["", "Commands:", ""] + [f"    {c}" for c in commands]
    return "\n".join(lines) + "\n"


def device_slug(name: str | None) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (name or "unknown").lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", action="append", required=True, help="a `fp8launch bench --out` folder; the first is the core")
    parser.add_argument("--reference", help="the folder holding the reference loop's bf16.json and fp8.json")
    parser.add_argument("--torchtitan", help="the folder holding torchtitan's result.json")
    parser.add_argument("--results", default="benchmarks/results")
    parser.add_argument("--out", help="also write the two files here")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    args = parser.parse_args(argv)
    result = compare(args.bench, args.reference, args.torchtitan, args.date)
    text = markdown(result)
    stem = f"{args.date}-{device_slug(result['device_name'])}-speed"
    for folder in dict.fromkeys(f for f in (args.results, args.out) if f):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, stem + ".json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, sort_keys=True)
            f.write("\n")
        with open(os.path.join(folder, stem + ".md"), "w", encoding="utf-8") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
