"""Standard figures of each bench, drawn from store records (matplotlib, Agg backend, imported lazily).

plot_run(runs, out_path) draws, for each run (a run directory or a seed file, imported on the fly),
the panels of its bench: one run -> the panels side by side; several runs -> one column per run
(and per bench inside a run), panels down the rows, so runs sit side by side. The format follows
the extension of out_path: .png (default), .svg or .pdf.

The panels of each bench live in qbench/plots/<bench>.py as PANELS: a tuple of functions
panel(ax, records, env) that draw one axis from the ok records of that bench; registry() names them.
The helpers those modules share (value, one_dtype, no_data, dim_ticks, mean) are defined here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from qbench.errors import QbenchUsageError

FORMATS = (".png", ".svg", ".pdf")
BENCHES = ("switchback", "block", "train_check", "moe", "fragmented", "model")
PANEL_SIZE = (5.2, 3.9)  # inches per panel: room for a legend inside each axis


def registry() -> dict[str, tuple]:
    """bench -> PANELS. Imported on first use, not at the top: the panel modules import the helpers
    below from this package, which must be complete by then."""
    from qbench.plots import block, fragmented, model, moe, switchback, train_check

    return {"switchback": switchback.PANELS, "block": block.PANELS, "train_check": train_check.PANELS,
            "moe": moe.PANELS, "fragmented": fragmented.PANELS, "model": model.PANELS}


def panels_of(bench: str) -> tuple:
    if bench not in BENCHES:
        raise QbenchUsageError(f"no standard figure for bench {bench!r}; plots exist for {', '.join(BENCHES)}")
    return registry()[bench]


def load_columns(runs: Iterable[str | Path]) -> list[tuple[str, str, dict[str, Any], list[dict[str, Any]]]]:
    """(label, bench, env, ok records) per run and bench, in the order given."""
    from qbench.importers import load_any

    columns = []
    for run in runs:
        env, records = load_any(run)
        ok = [r for r in records if r.get("status", "ok") == "ok"]
        benches = sorted({r["bench"] for r in ok}, key=lambda b: BENCHES.index(b) if b in BENCHES else 99)
        if not benches:
            raise QbenchUsageError(f"{run} holds no successful records to plot")
        for bench in benches:
            columns.append((Path(run).name, bench, env, [r for r in ok if r["bench"] == bench]))
    return columns


def default_out(runs: Sequence[str | Path], bench: str) -> Path:
    """runs/plots/<run name or file stem>-<bench>.png: beside the user's runs (a folder the repository
    ignores), never inside the run plotted, which may be a committed reference run."""
    from qbench.store import RUNS_ROOT

    first = Path(runs[0]).resolve()
    return Path(RUNS_ROOT) / "plots" / f"{first.stem if first.is_file() else first.name}-{bench}.png"


def check_figure_path(path: str | Path) -> Path:
    """The figure file `path`, checked before anything is measured or drawn: a known format, and a file
    that can be written (its folder is made; a file created by the check is removed again)."""
    from qbench.paths import check_writable_file

    target = Path(path)
    if target.suffix.lower() not in FORMATS:
        raise QbenchUsageError(f"{target}: unknown figure format; end the file name with {', '.join(FORMATS)}")
    return check_writable_file(target, "figure")


def plot_run(run_dirs: Sequence[str | Path], out_path: str | Path | None = None) -> Path:
    """Draw the standard figure of the run(s) into out_path (PNG/SVG/PDF by extension); returns it."""
    if not run_dirs:
        raise QbenchUsageError("give at least one run directory or results file to plot")
    target = check_figure_path(out_path) if out_path else None  # before loading: a bad name fails fast
    columns = load_columns(run_dirs)
    target = target or check_figure_path(default_out(run_dirs, columns[0][1]))
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, same output everywhere
    from matplotlib import pyplot as plt

    fig = _draw(plt, columns)
    try:
        fig.savefig(target, dpi=110, bbox_inches="tight")
    except OSError as exc:  # the disk filled or the folder went away since the check
        raise QbenchUsageError(f"cannot write figure {target} ({exc.strerror}); choose another path") from None
    finally:
        plt.close(fig)
    return target


def figure(plt, columns):
    """The standard figure of load_columns' columns as a matplotlib Figure (for a caller that embeds it: the
    HTML report)."""
    return _draw(plt, columns)


def _draw(plt, columns):
    rows = max(len(panels_of(bench)) for _, bench, _, _ in columns)
    if len(columns) == 1:  # one run: its panels side by side
        fig, axes = plt.subplots(1, rows, figsize=(PANEL_SIZE[0] * rows, PANEL_SIZE[1]), squeeze=False)
        grid = [list(axes[0])]
    else:  # several runs: one column each
        shape = (PANEL_SIZE[0] * len(columns), PANEL_SIZE[1] * rows)
        fig, axes = plt.subplots(rows, len(columns), figsize=shape, squeeze=False)
        grid = [list(axes[:, c]) for c in range(len(columns))]
    for (label, bench, env, records), axs in zip(columns, grid):
        panels = panels_of(bench)
        for ax, panel in zip(axs, panels):
            _draw_panel(panel, ax, records, env, label, bench)
        for ax in axs[len(panels) :]:
            ax.set_visible(False)
        axs[0].set_title(f"{label} ({describe_env(env)})\n{axs[0].get_title()}", fontsize=9)
    if len(columns) > 1 and len({bench for _, bench, _, _ in columns}) == 1:
        _share_rows(grid)
    fig.tight_layout()
    return fig


def _draw_panel(panel, ax, records, env, label: str, bench: str) -> None:
    """One panel; records that lack a parameter the panel reads, or hold a word where it needs a number (a
    hand-edited or foreign run: the loader checks types, not which parameters a bench has), are a usage
    error naming the run, not a crash."""
    try:
        panel(ax, records, env)
    except KeyError as exc:
        raise QbenchUsageError(f"{label}: its {bench} records lack the parameter {exc} that the {bench} figure "
                               "draws; plot a run that qbench wrote") from None
    except TypeError:
        raise QbenchUsageError(f"{label}: its {bench} records hold values of the wrong type for the {bench} "
                               "figure (text where a number belongs?); plot a run that qbench wrote") from None


def _share_rows(grid) -> None:
    """Same bench in every column: give each row one y range so the runs compare by eye."""
    for row in zip(*grid):
        shown = [ax for ax in row if ax.get_visible() and ax.has_data()]
        if len(shown) < 2 or len({ax.get_yscale() for ax in shown}) > 1:
            continue
        low = min(ax.get_ylim()[0] for ax in shown)
        high = max(ax.get_ylim()[1] for ax in shown)
        for ax in shown:
            ax.set_ylim(low, high)


def describe_env(env: dict[str, Any]) -> str:
    gpu = env.get("gpu_name") or ("modelled hardware" if env.get("hardware") else "GPU not recorded")
    source = f"imported {env['source']}" if env.get("source") else f"torch {env.get('torch') or '?'}"
    return f"{gpu}, {source}"


# ---- helpers shared by the panel modules ------------------------------------------------------
