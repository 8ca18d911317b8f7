"""The history figure: each metric's series over revisions (oldest left), one panel per metric (the first
MAX_PANELS), one line per configuration, the spread as error bars and each change point ringed (red worse,
green better, grey not shown to differ). Drawn from a qbench.analysis.history.History; matplotlib is
imported by the caller."""

from __future__ import annotations

import warnings

from qbench.analysis.history_output import label_of, varying

MAX_LINES = 24  # lines per panel before the legend stops naming them
MAX_PANELS = 8  # metrics drawn (in the table's order); a figure of every sampled metric of a sweep is unreadable
RING = {"+": "tab:red", "-": "tab:green", "~": "0.55", "^": "tab:purple", "v": "tab:purple"}


def figure(plt, history):
    """A matplotlib Figure of the history (one panel per metric)."""
    every = list(dict.fromkeys(s.metric for s in history.series))
    metrics = every[:MAX_PANELS]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(6.0, 1.2 * len(history.revisions) + 4), 3.6 * len(metrics)),
                             squeeze=False)
    names = [n for n in varying(history) if n != "metric"]
    x_of = {rev: i for i, rev in enumerate(history.revisions)}
    for ax, metric in zip(axes[:, 0], metrics):
        shown = [s for s in history.series if s.metric == metric]
        for s in shown:
            _line(ax, s, x_of, ", ".join(f"{k}={v}" for k, v in label_of(s, names).items()) or s.metric)
        values = [p.value for s in shown for p in s.points if p.value > 0]
        if values and max(values) > 10 * min(values):
            ax.set_yscale("log")  # configurations an order of magnitude apart: each line's steps stay visible
        ax.set_xticks(range(len(history.revisions)), history.revisions, rotation=30, fontsize=7, ha="right")
        unit = shown[0].unit if shown else None
        ax.set_ylabel(f"{metric} ({unit})" if unit else metric, fontsize=8)
        ax.set_title(f"{metric}: {len(shown)} series, {sum(len(s.changes()) for s in shown)} change points",
                     fontsize=9)
        if 1 < len(shown) <= MAX_LINES:
            ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    if len(every) > len(metrics):
        fig.suptitle(f"the first {len(metrics)} of {len(every)} metrics; name others with --metric", fontsize=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # long legends outside the axes: saved with bbox "tight"
        fig.tight_layout()
    return fig


def _line(ax, series, x_of, label: str) -> None:
    xs = [x_of[p.revision] for p in series.points]
    ys = [p.value for p in series.points]
    # a stored value need not lie inside its samples' p20-p80 (a switchback total is the sum of its
    # components' medians, its samples per-repeat sums): the bar then reaches only to the value's side
    low = [max(p.value - p.low, 0.0) if p.low is not None else 0.0 for p in series.points]
    high = [max(p.high - p.value, 0.0) if p.high is not None else 0.0 for p in series.points]
    line = ax.errorbar(xs, ys, yerr=[low, high], marker="o", markersize=3, linewidth=1, capsize=2, label=label)
    for x, p in zip(xs, series.points):
        if p.marker in RING:
            ax.plot([x], [p.value], marker="o", markersize=10, markerfacecolor="none", markeredgewidth=1.5,
                    color=RING[p.marker], linestyle="none")
    return line


def save(history, path) -> None:
    """Draw the figure into path (.png, .svg or .pdf, by extension)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig = figure(plt, history)
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
