"""`qbench summary RUN RUN ... --across-runs median --spreads`: how far reruns of one command disagree,
metric by metric. Per metric: how many cells have a spread (at least two runs hold the case), the
largest spread and the case it belongs to, and the median spread; largest first. A spread is
(max - min) / median of the runs' values of one cell, in percent, as the summary's cells print it."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from qbench import report
from qbench.analysis.summary import Summary
from qbench.analysis.summary_output import case_cells, param_text, spread_text
from qbench.errors import QbenchUsageError
from qbench.samples import percentile


@dataclass(frozen=True)
class MetricSpread:
    metric: str
    unit: str | None
    cells: int  # cells with a spread
    largest_pct: float
    largest_at: str  # the case of the largest spread, 'k=v, ...'
    median_pct: float


def spreads(summary: Summary) -> list[MetricSpread]:
    """The spread of every metric of a summary built --across-runs, largest first."""
    if summary.across_runs is None:
        raise QbenchUsageError("--spreads compares reruns: add --across-runs median and give the runs")
    found = {metric: [(cell.spread_pct, case) for case, cell in cells if cell.spread_pct is not None]
             for metric, cells in case_cells(summary).items()}
    out = [MetricSpread(metric, summary.units.get(metric), len(cells), *max(cells),
                        percentile([s for s, _ in cells], 50)) for metric, cells in found.items() if cells]
    return sorted(out, key=lambda m: (-m.largest_pct, m.metric))


def _rows(items: list[MetricSpread]) -> list[list[str]]:
    """Spreads printed as the summary's cells print them."""
    return [[m.metric, m.unit or "-", str(m.cells), spread_text(m.largest_pct), m.largest_at, spread_text(m.median_pct)]
            for m in items]


HEADERS = ["metric", "unit", "cells", "largest spread", "at", "median spread"]


def legend(summary: Summary) -> list[str]:
    lines = [f"spreads over {len(summary.labels)} runs: {', '.join(summary.labels)}; spread = (max - min) / median "
             "of the runs' values of one cell"]
    if summary.fixed:
        lines.append("fixed: " + ", ".join(f"{k}={param_text(v)}" for k, v in summary.fixed.items()))
    return lines


def show(summary: Summary, fmt: str | None, notes: list[str] | None = None) -> None:
    """Print the spreads: a rich table (default), --markdown or --json (numbers as computed); notes (the
    power-capped cells) under the legend."""
    items = spreads(summary)
    notes = notes or []
    if fmt == "json":
        payload: dict[str, Any] = {"runs": summary.labels, "fixed": summary.fixed,
                                   "spreads": [asdict(m) for m in items], "notes": notes}
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
        return
    rows = _rows(items)
    if fmt == "markdown":
        lines = report.markdown_table(HEADERS, rows)
        sys.stdout.write("\n".join(lines) + "\n\n" + "".join(f"{line}  \n" for line in legend(summary) + notes))
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(header_style="bold", caption=Text("\n".join(legend(summary) + notes)), caption_justify="left")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i in (0, 4) else "right", style="cyan" if i == 0 else None)
    for row in rows:
        table.add_row(*map(Text, row))
    report.stdout_console().print(table)
