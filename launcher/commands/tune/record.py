"""What `fp8launch tune` measured, as tune.json, the table a person reads and the winner as a spec.

Per candidate: tokens/s (median over runs of each run's steady-state median), peak memory and the loss gap
to bf16: the mean over the steps of (loss - bf16 loss) / bf16 loss, each step's loss the median over runs. With
[eval] in the spec the losses compared are the held-out eval losses at the evaluated steps (`loss_basis`:
"eval"), the fair comparison; without it, the training losses of every step ("train").
A candidate whose gap exceeds `max_loss_gap` is rejected; the rest, bf16 included, are ranked by tokens/s
and the fastest wins."""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field

from launcher.commands.runs import Variant, versions
from launcher.planning.backends import BACKENDS
from launcher.planning.read import apply_overrides, read_spec
from launcher.targets.toml_text import toml_text

DEFAULT_MAX_LOSS_GAP = 0.02
"""Reject a candidate whose loss is on average more than 2% above bf16's over the same steps."""


@dataclass
class Candidate:
    label: str
    overrides: list[str]
    """Spec keys this candidate sets (on top of the user's --set)."""
    variant: Variant
    status: str = "pending"
    """pending | measured | rejected | failed | skipped | interrupted | winner | baseline"""
    note: str = ""
    losses: list[list[float]] = field(default_factory=list)


def loss_basis(runs: list[Candidate]) -> str:
    """"evals" (the held-out loss of [eval]) where the bf16 baseline's runs evaluated, else "losses" (training)."""
    ok = [r for r in runs[0].variant.runs if r["exit_code"] == 0]
    return "evals" if ok and all(r.get("evals") for r in ok) else "losses"


def _median_losses(variant: Variant, basis: str = "losses") -> dict[int, float]:
    by_step: dict[int, list[float]] = {}
    for run in variant.runs:
        if run["exit_code"] == 0:
            for step, loss in run.get(basis) or []:
                by_step.setdefault(step, []).append(loss)
    return {s: statistics.median(v) for s, v in sorted(by_step.items())}


def loss_gap(candidate: dict[int, float], baseline: dict[int, float]) -> float | None:
    """Mean over the common steps of (loss - bf16 loss) / bf16 loss; positive = worse than bf16."""
    steps = [s for s in candidate if s in baseline and baseline[s]]
    finite = [s for s in steps if math.isfinite(candidate[s])]
    if not steps:
        return None
    if len(finite) < len(steps):
        return math.inf
    return statistics.fmean((candidate[s] - baseline[s]) / baseline[s] for s in steps)


def tune_record(name: str, runs: list[Candidate], *, max_loss_gap: float, warmup: int, repeats: int, steps: int | None,
            interrupted: bool, user_overrides: list[str]) -> dict:
    base = runs[0]
    basis = loss_basis(runs)
    base_losses = _median_losses(base.variant, basis)
    base_tps = base.variant.figure("tokens_per_s")
    rows = []
    for c in runs:
        ok_runs = [r for r in c.variant.runs if r["exit_code"] == 0]
        if c.status == "pending":
            c.status = "measured" if ok_runs else ("interrupted" if interrupted else "failed")
        losses = _median_losses(c.variant, basis)
        gap = 0.0 if c is base else loss_gap(losses, base_losses)
        if c.status == "measured" and gap is not None and gap > max_loss_gap:
            c.status, c.note = "rejected", f"loss gap {gap:+.2%} > {max_loss_gap:.2%}"
        tps = statistics.median([r["figures"]["tokens_per_s"] for r in ok_runs if r["figures"]["tokens_per_s"] is not None]) if any(
            r["figures"]["tokens_per_s"] is not None for r in ok_runs) else None
        start = c.variant.runs[0]["start"] if c.variant.runs else {}
        rows.append({
            "name": c.label, "status": c.status, "note": c.note, "overrides": c.overrides,
            "precision": start.get("precision"), "fp8_layers": start.get("fp8_layers"), "total_linear": start.get("total_linear"),
            "tokens_per_s": tps, "step_time_s": c.variant.figure("step_time_s") if ok_runs else None,
            "peak_mem_gib": c.variant.figure("peak_mem_gib") if ok_runs else None,
            "final_loss": c.variant.figure("final_loss") if ok_runs else None,
            "loss_gap": gap if gap is None or math.isfinite(gap) else "inf",
            "vs_bf16": (tps / base_tps) if tps is not None and base_tps else None,
            "losses": [[s, v] for s, v in losses.items()],
            "runs": [{"dir": os.path.relpath(r["dir"], os.path.dirname(os.path.dirname(r["dir"]))), "exit_code": r["exit_code"],
                      "figures": r["figures"]} for r in c.variant.runs],
            "run_dirs": [os.path.join("runs", os.path.basename(r["dir"])) for r in c.variant.runs],
        })
    ranked = sorted((r for r in rows if r["status"] in ("measured", "baseline") and r["tokens_per_s"] is not None),
                    key=lambda r: -r["tokens_per_s"])
    for i, r in enumerate(ranked):
        r["rank"] = i + 1
    winner = ranked[0]["name"] if ranked and not interrupted else None
    for r in rows:
        if r["name"] == winner and r["status"] == "measured":
            r["status"] = "winner"
    start = next((c.variant.runs[0]["start"] for c in runs if c.variant.runs), {})
    return {"name": name, "candidates": rows, "winner": winner, "ranking": [r["name"] for r in ranked],
            "max_loss_gap": max_loss_gap, "loss_basis": "eval" if basis == "evals" else "train",
            "warmup_steps_excluded": warmup, "repeats": repeats, "steps": steps,
            "interrupted": interrupted, "overrides": user_overrides,
            "environment": {"device_name": start.get("device_name"), "world_size": start.get("world_size"),
                            "torch": start.get("torch_version"), **versions("torchao", "transformer_engine", "deepspeed", "fp8launch")}}


# --- the winner as a spec -----------------------------------------------------------------------------


def tuned_spec(spec: str, user_overrides: list[str], record: dict) -> str:
    """The spec with the winner's keys (and the user's --set) applied, renamed <name>-tuned, with a header saying why."""
    rows = {r["name"]: r for r in record["candidates"]}
    win = rows[record["winner"]]
    source = apply_overrides(read_spec(spec), list(user_overrides) + list(win["overrides"]))
    data = json.loads(json.dumps(source.data))
    data["name"] = f"{record['name'][:58]}-tuned"
    precision = data.get("precision", {})
    used = precision.get("backend", "torchao") if precision.get("mode") == "fp8" else None
    for b in BACKENDS.values():  # a section the winner never reads would only warn (SECTION-UNUSED)
        if b.name != used:
            precision.pop(b.section, None)
    env = record["environment"]
    header = [f"Chosen by `fp8launch tune {os.path.basename(spec)}` on {env.get('device_name')} x {env.get('world_size')}: "
              f"{win['name']} at {_tps(win)} tokens/s ({_ratio(win)} bf16), loss gap {_gap(win)} "
              f"(median of {record['repeats']} alternating runs of {record['steps'] or 'train.steps'} steps each).",
              "Chosen over:"]
    for other in record["candidates"]:
        if other["name"] == win["name"]:
            continue
        if other["status"] in ("measured", "baseline"):
            slower = 1 - other["tokens_per_s"] / win["tokens_per_s"] if win["tokens_per_s"] else 0
            header.append(f"  {other['name']}: {_tps(other)} tokens/s, {slower:.1%} slower ({_ratio(other)} bf16), loss gap {_gap(other)}")
        else:
            header.append(f"  {other['name']}: {other['status']}{': ' + other['note'] if other['note'] else ''}")
    return "".join(f"# {line}\n" for line in header) + "\n" + toml_text(data)


def _tps(row: dict) -> str:
    return "n/a" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:,.0f}"


def _ratio(row: dict) -> str:
    return "n/a" if row["vs_bf16"] is None else f"{row['vs_bf16']:.3f}x"


def _gap(row: dict) -> str:
    g = row["loss_gap"]
    return "n/a" if g is None else ("inf" if g == "inf" else f"{g:+.2%}")


def _basis(record: dict) -> str:
    return "held-out eval" if record.get("loss_basis") == "eval" else "training"


# --- what a person reads --------------------------------------------------------------------------------


def table(record: dict) -> str:
    lines = [f"{'rank':>4}  {'candidate':<34} {'status':<11} {'tokens/s':>10} {'vs bf16':>8} {'peak GiB':>9} {'loss gap':>9}"]
    for r in sorted(record["candidates"], key=lambda r: r.get("rank", 10**6)):
        mem = "n/a" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.2f}"
        lines.append(f"{r.get('rank', '-'):>4}  {r['name']:<34} {r['status']:<11} {_tps(r):>10} {_ratio(r):>8} {mem:>9} {_gap(r):>9}"
                     + (f"  {r['note']}" if r["note"] else ""))
    env = record["environment"]
    lines.append(f"(medians over {record['repeats']} alternating runs each; first {record['warmup_steps_excluded']} steps of each run "
                 f"excluded; rejected when the {_basis(record)} loss gap to bf16 exceeds {record['max_loss_gap']:.1%}; "
                 f"{env.get('device_name')} x {env.get('world_size')}, torch {env.get('torch')}, torchao {env.get('torchao')})")
    lines.append(f"winner: {record['winner']}" if record["winner"] else "winner: none (interrupted or nothing measured)")
    return "\n".join(lines)
