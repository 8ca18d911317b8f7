"""Figure of a power-split search: predicted time per step against iterations, one line per start
(log scale: the first steps move the time by large factors), with the time budget when one is set."""

from __future__ import annotations

from pathlib import Path

from qbench.model.search_hw import Outcome


def plot_path(outcome: Outcome, out_path: str | Path, budget: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for start in sorted({s.start for s in outcome.path}):
        steps = [s for s in outcome.path if s.start == start]
        label = "config's split" if start == 0 else f"random start {start}"
        ax.plot([s.iteration for s in steps], [s.best_s for s in steps], marker=".", label=label)
    ax.axhline(outcome.initial_point.time_s, color="grey", linestyle=":", label="config's time")
    if budget is not None:
        ax.axhline(budget, color="red", linestyle="--", label=f"budget {budget:.4g} s")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("best predicted time per step (s)")
    ax.set_title("Power-split search")
    ax.legend(fontsize="small")
    target = Path(out_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return target
