"""Rich tables, JSON output and progress bars, all built from store records.

Tables go to stdout, progress bars and notices to stderr; rich honours NO_COLOR and plain
(non-TTY) output by itself. Plots live in qbench.plots (matplotlib is imported only there).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from qbench import units

CPU_NOTICE = (
    "Running on the CPU: these timings check that everything works end to end; "
    "they say nothing about GPU performance."
)


def stdout_console() -> Console:
    return Console(soft_wrap=False)


def stderr_console() -> Console:
    return Console(stderr=True)


def format_value(value: Any, unit: str | None = None) -> str:
    """Numbers with a sensible number of digits for their size; None/NaN as '-'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if unit == units.PERCENT_SAVED:
        return f"{value:+.1f}%"
    if unit == units.SPEEDUP:
        return f"{value:.2f}x"
    if unit == units.FRACTION_OF_ROOFLINE:
        return f"{100 * value:.0f}%"
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value):,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.3f}"
    return f"{value:.4f}" if magnitude >= 1e-3 or magnitude == 0 else f"{value:.2e}"


def speedup_style(value: float | None) -> str:
    """Green for a speed-up, red for a slow-down (ratio baseline / candidate)."""
    if value is None or isinstance(value, str) or math.isnan(value):
        return ""
    return "green" if value > 1.02 else "red" if value < 0.98 else ""


def records_table(
    records: Sequence[Mapping[str, Any]],
    params: Sequence[str],
    metrics: Sequence[str],
    *,
    title: str = "",
    headers: Mapping[str, str] | None = None,
) -> Table:
    """One row per record: the chosen params, then the chosen metrics (with their units)."""
    headers = headers or {}
    table = Table(title=title, header_style="bold", show_lines=False)
    for name in params:
        table.add_column(headers.get(name, name), justify="right", style="cyan")
    unit_of = _units(records)
    for name in metrics:
        unit = unit_of.get(name)
        label = headers.get(name, name)
        table.add_column(f"{label}\n[dim]{unit}[/dim]" if unit else label, justify="right")
    table.add_column("status")
    for rec in records:
        cells = [format_value(rec["params"].get(p)) for p in params]
        for name in metrics:
            value = rec["metrics"].get(name)
            text = format_value(value, unit_of.get(name))
            style = speedup_style(value) if unit_of.get(name) == units.SPEEDUP else ""
            cells.append(f"[{style}]{text}[/{style}]" if style else text)
        cells.append(_status_cell(rec))
        table.add_row(*cells)
    return table


def _units(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for rec in records:
        merged.update(rec.get("units", {}))
    return merged


def _status_cell(rec: Mapping[str, Any]) -> str:
    status = rec.get("status", "ok")
    if status == "ok":
        return "[green]ok[/green]"
    reason = (rec.get("error") or "")[:60]
    colour = "red" if status == "error" else "yellow"
    return f"[{colour}]{status}[/{colour}] {reason}"


def print_json(records: Sequence[Mapping[str, Any]]) -> None:
    sys.stdout.write(json.dumps(list(records), indent=2, default=str) + "\n")


@contextlib.contextmanager
def progress(total: int | None, description: str) -> Iterator[Any]:
    """A progress bar on stderr; yields advance(label) to call once per finished configuration."""
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[label]}"),
        console=stderr_console(),
        transient=True,
    )
    with bar:
        task = bar.add_task(description, total=total, label="")

        def advance(label: str = "") -> None:
            bar.update(task, advance=1, label=label)

        yield advance


def notice(message: str, style: str = "yellow") -> None:
    stderr_console().print(f"[{style}]{message}[/{style}]")
