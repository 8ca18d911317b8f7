"""Printing `qbench history` (qbench.analysis.history builds it): a rich table, Markdown or JSON. One row
per series (GPU, configuration, metric), one column per revision, oldest first: the point's value with its
spread and its change marker; the last column names the change points."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Any

from qbench import report
from qbench.analysis.history import History, Point, Series
from qbench.analysis.summary_output import param_text

MARKERS = {"+": "worse", "-": "better", "~": "beyond the floor, not shown to differ", "^": "up", "v": "down"}


def varying(history: History) -> list[str]:
    """The series' labelling fields that differ between series: gpu, bench, each parameter, metric."""
    fields = [("gpu", lambda s: s.gpu), ("bench", lambda s: s.bench), ("metric", lambda s: s.metric)]
    names = list(dict.fromkeys(k for s in history.series for k in s.params))
    fields += [(n, lambda s, n=n: s.params.get(n)) for n in names]
    return [name for name, get in fields if len({str(get(s)) for s in history.series}) > 1]


def label_of(series: Series, shown: list[str]) -> dict[str, Any]:
    fixed = {"gpu": series.gpu, "bench": series.bench, "metric": series.metric}
    return {name: fixed[name] if name in fixed else series.params.get(name) for name in shown}


def point_text(point: Point | None, digits: int) -> str:
    """'value [low, high] marker' ('-' where the revision has no run of this case)."""
    if point is None:
        return "-"
    text = report.format_sig(point.value, digits)
    if point.low is not None:
        text += f" [{report.format_sig(point.low, digits)}, {report.format_sig(point.high, digits)}]"
    return text + (f" {point.marker}" if point.marker not in ("", "=") else "")


def change_text(point: Point) -> str:
    p = "" if point.p_value is None else f", p={point.p_value:.2g}"
    return f"{point.revision} {point.marker} {report.format_change(point.step_pct)}{p}"


def rows(history: History, digits: int, only_changed: bool = False) -> tuple[list[str], list[list[str]]]:
    shown = varying(history)
    headers = [*shown, *history.revisions, "change points"]
    out = []
    for s in history.series:
        if only_changed and not s.changes():
            continue
        at = {p.revision: p for p in s.points}
        row = [param_text(v) for v in label_of(s, shown).values()]
        row += [point_text(at.get(r), digits) for r in history.revisions]
        row.append("; ".join(change_text(p) for p in s.changes()) or "none")
        out.append(row)
    return headers, out


def legend(history: History) -> list[str]:
    first = history.series[0] if history.series else None
    fixed = [] if first is None else [f"{k}={param_text(v)}" for k, v in label_of(first, _constant(history)).items()]
    order = "git's commit order" if history.order == "git" else "the runs' recorded times (no git order for them)"
    lines = [f"revisions oldest first, in {order}: " + "; ".join(
        f"{rev} ({', '.join(history.runs[rev])})" for rev in history.revisions)]
    if fixed:
        lines.append("fixed: " + ", ".join(fixed))
    lines.append("cell: median over the revision's runs [lowest, highest run]; one run: its value [p20, p80 of "
                 "its samples]")
    lines.append(f"change: step beyond max({history.threshold_pct:g}%, either point's spread) "
                 "and U test p < 0.05 on the samples (or no overlap of the runs); "
                 + ", ".join(f"{m} {w}" for m, w in MARKERS.items()))
    return lines


def _constant(history: History) -> list[str]:
    shown = set(varying(history))
    names = ["gpu", "bench", "metric", *dict.fromkeys(k for s in history.series for k in s.params)]
    return [n for n in names if n not in shown]


def as_json(history: History) -> str:
    payload = {"revisions": history.revisions, "order": history.order, "runs": history.runs,
               "threshold_pct": history.threshold_pct,
               "series": [{**{k: v for k, v in asdict(s).items() if k != "points"},
                           "points": [{k: v for k, v in asdict(p).items() if k != "samples"} for p in s.points]}
                          for s in history.series]}
    return json.dumps(payload, indent=2, default=str) + "\n"


def show(history: History, fmt: str | None, digits: int, only_changed: bool) -> None:
    if fmt == "json":
        sys.stdout.write(as_json(history))
        return
    headers, table_rows = rows(history, digits, only_changed)
    if fmt == "markdown":
        lines = report.markdown_table(headers, table_rows)
        sys.stdout.write("\n".join(lines) + "\n\n" + "".join(f"{line}  \n" for line in legend(history)))
        return
    keys = len(headers) - len(history.revisions) - 1
    columns = [report.Column(header, justify="left" if i < keys or i == len(headers) - 1 else "right", key=i < keys)
               for i, header in enumerate(headers)]  # a table that fits the console, the case repeated where it splits
    report.stdout_console().print(report.FittedTable(columns, table_rows, notes=legend(history)))
