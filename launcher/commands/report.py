"""`fp8launch report RUN_DIR [RUN_DIR2 ...]`: pictures of one run, or of several overlaid.

Reads what a run wrote into its train.output_dir: metrics.jsonl (step records: loss, lr,
tokens/s, peak memory; eval records: the held-out loss, drawn dashed over the training loss) and,
when the FP8 monitor was on, fp8_stats.jsonl. Draws into
RUN_DIR/report.png (the first RUN_DIR): loss, learning rate, tokens/s and peak memory per
step, one line per run; then, for each run with FP8 stats, a heatmap of the underflow share
by layer and sampled step (the worst operand of each layer), its worst layers named in red.

Loading is plain Python; only drawing imports matplotlib (the `bench` extra).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from launcher.errors import UsageError
from launcher.planning.install import INSTALL
from launcher.targets.files import save_atomic
from launcher.train.metrics import jsonl, read_records

METRICS_FILE = "metrics.jsonl"
STATS_FILE = "fp8_stats.jsonl"
REPORT_FILE = "report.png"
WORST_NAMED = 3
"""Layers each heatmap names as the worst."""
SHARE_FLOOR = 1e-6
"""Shares below this (zero included) get the lightest colour of the log-scaled heatmap."""


@dataclass
class Run:
    folder: str
    name: str
    steps: list[dict] = field(default_factory=list)
    """Step records by step (a resumed run's repeated steps: the last one written)."""
    stats: list[dict] = field(default_factory=list)
    """fp8_stats.jsonl records (empty without the monitor)."""
    evals: list[dict] = field(default_factory=list)
    """Eval records ([eval]) by step, the last one written for a step."""
    skipped: list[str] = field(default_factory=list)
    """One line per file of the run with lines that could not be drawn: how many, and why (the first few)."""

    def eval_series(self) -> tuple[list[int], list[float]]:
        return _series(self.evals, "eval_loss")

    def series(self, key: str) -> tuple[list[int], list[float]]:
        return _series(self.steps, key)

    def underflow_grid(self) -> tuple[list[str], list[int], list[list[float]]]:
        """(layers in model order, sampled steps, grid[layer][step]: the largest underflow share of its operands)."""
        layers, steps, cells = [], set(), {}
        for r in self.stats:
            if r["layer"] not in cells:
                layers.append(r["layer"])
                cells[r["layer"]] = {}
            steps.add(r["step"])
            cells[r["layer"]][r["step"]] = max(cells[r["layer"]].get(r["step"], 0.0), r["underflow"])
        steps = sorted(steps)
        return layers, steps, [[cells[layer].get(s, float("nan")) for s in steps] for layer in layers]

    def worst(self, n: int = WORST_NAMED) -> list[tuple[str, str, float]]:
        """(layer, operand, worst underflow share) of the n layers with the largest share, worst first."""
        best: dict[str, tuple[str, float]] = {}
        for r in self.stats:
            if r["underflow"] > best.get(r["layer"], ("", -1.0))[1]:
                best[r["layer"]] = (r["tensor"], r["underflow"])
        ranked = sorted(((layer, op, share) for layer, (op, share) in best.items() if share > 0), key=lambda t: -t[2])
        return ranked[:n]


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records with a finite number under `key`."""
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def load_run(folder: str) -> Run:
    """The run in `folder` (a train.output_dir). UsageError (exit 2) when it holds none, or no step record that can be
    drawn; lines that cannot be read are skipped and named in `skipped`."""
    metrics = os.path.join(folder, METRICS_FILE)
    if not os.path.isfile(metrics):
        why = "does not exist" if not os.path.isdir(folder) else f"holds no run (no {METRICS_FILE})"
        raise UsageError(f"{folder} {why}; fix: pass a run's train.output_dir, where `fp8launch run` wrote {METRICS_FILE}")
    records, problems = read_records(metrics)
    by_step = {r["step"]: r for r in records if r.get("event") == "step"}
    evals = {r["step"]: r for r in records if r.get("event") == "eval"}
    if not by_step:
        if problems:
            raise UsageError(f"{metrics} has no step record that can be drawn: {jsonl.summary(problems)}; "
                             "fix: report a run that has logged at least one step")
        raise UsageError(f"{metrics} has no step records yet; fix: report a run that has logged at least one step")
    starts = [r for r in records if r.get("event") == "start"]
    name = starts[-1].get("name") if starts and isinstance(starts[-1].get("name"), str) else None
    name = name or os.path.basename(os.path.normpath(folder))
    stats_path = os.path.join(folder, STATS_FILE)
    stats, stats_problems = [], []
    if os.path.isfile(stats_path):
        rows, stats_problems = jsonl.read(stats_path)
        stats = [r for _, r in rows if {"step", "layer", "tensor", "underflow"} <= r.keys()
                 and isinstance(r["underflow"], (int, float)) and isinstance(r["step"], int) and isinstance(r["layer"], str)]
        stats_problems += [(n, "not an FP8 stats record") for n, r in rows if not any(r is s for s in stats)]
    skipped = [f"{path}: {jsonl.summary(found)}" for path, found in ((metrics, problems), (stats_path, stats_problems)) if found]
    return Run(folder=folder, name=name, steps=[by_step[s] for s in sorted(by_step)], stats=stats,
               evals=[evals[s] for s in sorted(evals)], skipped=skipped)


def _labels(runs: list[Run]) -> list[str]:
    """Run names, made unique with their folders where two runs share a name."""
    names = [r.name for r in runs]
    return [f"{r.name} ({r.folder})" if names.count(r.name) > 1 else r.name for r in runs]


def draw(runs: list[Run], path: str) -> str:
    """Write the report PNG of `runs` to `path`; return the path."""
    try:
        import matplotlib
    except ImportError as e:
        raise UsageError(f"the report needs matplotlib; fix: {INSTALL['matplotlib']}") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    labels = _labels(runs)
    with_stats = [(run, label) for run, label in zip(runs, labels) if run.stats]
    heights = [3.2, 3.2] + [max(2.8, 0.22 * len(run.underflow_grid()[0]) + 1.2) for run, _ in with_stats]
    total = sum(heights) + 1.2
    fig = plt.figure(figsize=(13, total))
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights, hspace=0.4, wspace=0.22,
                            top=1 - 0.9 / total, bottom=0.5 / total)
    panels = [("loss", "loss", "loss"), ("lr", "learning rate", "learning rate"),
              ("tokens_per_s", "tokens/s (global)", "throughput"), ("peak_mem_gib", "peak memory (GiB)", "peak memory per process")]
    for i, (key, ylabel, title) in enumerate(panels):
        ax = fig.add_subplot(grid[i // 2, i % 2])
        for run, label in zip(runs, labels):
            xs, ys = run.series(key)
            line, = ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label=label)
            if key == "loss" and run.evals:
                ex, ey = run.eval_series()
                ax.plot(ex, ey, linestyle="--", marker="s", color=line.get_color(), label=f"{label} (eval, held out)")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        if len(runs) > 1 or i == 0:
            ax.legend(fontsize=8)
    for row, (run, label) in enumerate(with_stats, start=2):
        ax = fig.add_subplot(grid[row, :])
        layers, steps, cells = run.underflow_grid()
        shown = [[max(v, SHARE_FLOOR) if not math.isnan(v) else float("nan") for v in line] for line in cells]
        image = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="magma_r", norm=LogNorm(vmin=SHARE_FLOOR, vmax=1.0))
        ax.set_yticks(range(len(layers)), layers, fontsize=7)
        every = max(1, len(steps) // 20)
        ax.set_xticks(range(0, len(steps), every), [str(s) for s in steps[::every]], fontsize=8)
        ax.set_xlabel("step (sampled every monitor.fp8_stats_every steps)")
        ax.set_ylabel("FP8 layer")
        worst = run.worst()
        for tick in ax.get_yticklabels():
            if tick.get_text() in {w[0] for w in worst}:
                tick.set_color("tab:red")
                tick.set_fontweight("bold")
        named = "; ".join(f"{layer} {op} {100 * share:.3g}%" for layer, op, share in worst) or "none: nothing flushed to zero"
        ax.set_title(f"{label}: FP8 underflow share (nonzero values flushed to zero; worst operand per layer)\n"
                     f"worst layers: {named}", fontsize=10)
        bar = fig.colorbar(image, ax=ax, pad=0.01)
        bar.set_label("underflow share (log)")
    fig.suptitle("fp8launch report: " + ", ".join(labels), fontsize=12, y=1 - 0.3 / total)
    save_atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, bbox_inches="tight"))  # never a half-written report.png
    plt.close(fig)
    return path


def report(folders: list[str], out: str | None = None) -> tuple[str, list[str]]:
    """Load every run first (a bad folder stops before anything is written), then draw. Returns the picture's path, and
    a note for each file with lines that were skipped."""
    runs = [load_run(f) for f in folders]
    return draw(runs, out or os.path.join(folders[0], REPORT_FILE)), [f"note: {line}" for run in runs for line in run.skipped]
