"""tune.png: tokens/s bars (winner highlighted, rejected hatched) and each candidate's loss curve."""

from __future__ import annotations

from launcher.errors import UsageError
from launcher.planning.install import INSTALL
from launcher.targets.files import save_atomic


def plot(record: dict, path: str) -> str:
    """tokens/s bars (winner highlighted, rejected hatched) and each candidate's loss curve, as a PNG."""
    try:
        import matplotlib
    except ImportError as e:
        raise UsageError(f"the plot needs matplotlib: {INSTALL['matplotlib']}") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in record["candidates"] if r["tokens_per_s"] is not None]
    colors = {"winner": "tab:green", "baseline": "tab:blue", "measured": "tab:gray", "rejected": "tab:red"}
    fig, (ax_tps, ax_loss) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.1, 1]})
    names = [r["name"] for r in rows]
    values = [r["tokens_per_s"] for r in rows]
    bars = ax_tps.barh(names, values, color=[colors.get(r["status"], "tab:gray") for r in rows],
                       hatch=None)
    for bar, r in zip(bars, rows):
        if r["status"] == "rejected":
            bar.set_hatch("//")
        label = (f"{r['tokens_per_s']:,.0f}" + (f"  ({r['vs_bf16']:.2f}x)" if r["vs_bf16"] else "")
                 + ("  rejected" if r["status"] == "rejected" else ""))
        ax_tps.annotate(label, (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=8)
    ax_tps.invert_yaxis()
    ax_tps.set_xlim(0, max(values, default=1) * 1.35)
    ax_tps.set_xlabel("tokens/s (median)")
    ax_tps.set_title(f"throughput; winner: {record['winner']}")
    others = iter(["tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"] * 4)
    for r in record["candidates"]:
        if r["losses"]:
            steps, losses = zip(*r["losses"])
            ax_loss.plot(steps, losses, label=f"{r['name']} ({r['status']})",
                         color=colors[r["status"]] if r["status"] in ("winner", "baseline") else next(others),
                         linewidth=2.2 if r["status"] in ("winner", "baseline") else 1.0,
                         linestyle="--" if r["status"] == "rejected" else "-")
    ax_loss.xaxis.get_major_locator().set_params(integer=True)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (median over runs)")
    ax_loss.set_title(f"loss; rejected above a {record['max_loss_gap']:.1%} gap to bf16")
    ax_loss.legend(fontsize=7)
    fig.tight_layout()
    save_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    return path
