"""What the benchmark commands share besides the runner (qbench/runner.py): their figures."""

from __future__ import annotations

from pathlib import Path

from qbench import report, store


def check_plot(plot: str | None) -> None:
    """A --plot FILE with a bad name is refused before the sweep, not after it."""
    from qbench.options import figure_path

    if figure_path(plot):
        from qbench.plots import check_figure_path

        check_figure_path(figure_path(plot))


def draw_figure(plot: str | None, out: str) -> None:
    """After a run: its figure where --plot asked for one (a bare --plot: <run>/<bench>.png)."""
    if plot is None:
        return
    from qbench.options import figure_path
    from qbench.plots import plot_run

    # a bare --plot draws into the run this command just wrote (the user's own); `qbench plot RUN` of an
    # existing run writes beside the user's runs instead, never into a committed one
    target = figure_path(plot) or Path(out) / f"{store.read_records(out)[0]['bench']}.png"
    report.notice(f"figure: {plot_run([out], target)}", style="dim")
