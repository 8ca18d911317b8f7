"""Printing `qbench summary`'s tables (qbench.analysis.summary builds them): a rich table, a Markdown table to
paste, or JSON; the cell text every form shares (median [p20, p80], or the median over runs with each
run's value and their spread) and the legend of its marks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from qbench import report, units
from qbench.analysis import join, summary_limits
from qbench.analysis.compare import Run
from qbench.analysis.summary import Cell, Summary, SummaryOptions, summarize_runs
from qbench.errors import QbenchUsageError
from qbench.report import param_text

# ---- printing: a rich table, a Markdown table to paste, or JSON --------------------------------------

STORED_ONLY, OFF_SAMPLES = "\u2020", "\u2021"  # dagger, double dagger: explained by legend()


def cell_text(cell: Cell | None, digits: int) -> str:
    """'median [p20, p80]', 'median' + dagger (stored median alone), across runs 'median (runs: a, b; spread s%)';
    with --limits the limit after it: '2.44 [2.34, 2.59] host'; with --predicted the model's time after that:
    '2.44 [2.34, 2.59] host, model 2.31'."""
    if cell is None or cell.value is None:
        return "-"
    text = _value_text(cell, digits)
    text = f"{text} {cell.limit}" if cell.limit else text
    return text if cell.predicted is None else f"{text}, model {report.format_sig(cell.predicted, digits)}"


def _value_text(cell: Cell, digits: int) -> str:
    text = report.format_sig(cell.value, digits)
    if cell.runs is not None:
        values = ", ".join(report.format_sig(v, digits) for v in cell.runs)
        spread = "" if cell.spread_pct is None else f"; spread {spread_text(cell.spread_pct)}"
        return f"{text} (runs: {values}{spread})"
    if not cell.samples:
        return text + STORED_ONLY
    mark = OFF_SAMPLES if cell.off_samples else ""
    return f"{text}{mark} [{report.format_sig(cell.p20, digits)}, {report.format_sig(cell.p80, digits)}]"


def spread_text(pct: float) -> str:
    """A spread in percent as the cells print it: two significant digits (more where they would end on a
    zero)."""
    return report.format_sig(pct, 2) + "%"


def columns_of(summary: Summary) -> list[tuple[str, str, Any]]:
    """(header, metric, pivot value) of every cell column, in order."""
    out = []
    for metric in summary.metrics:
        unit = summary.units.get(metric)
        label = f"{metric} ({unit})" if unit else metric
        for column in summary.columns:
            if summary.by is None:
                out.append((label, metric, None))
            else:
                prefix = f"{label} " if len(summary.metrics) > 1 else ""
                tied = summary.column_attrs.get(join.value_key(column), {})
                tied_text = ", ".join(f"{k}={param_text(v)}" for k, v in tied.items())
                header = f"{prefix}{summary.by}={param_text(column)}" + (f" ({tied_text})" if tied_text else "")
                out.append((header, metric, column))
    return out


def case_cells(summary: Summary) -> dict[str, list[tuple[str, Cell]]]:
    """metric -> (case text 'k=v, ...', cell) of every cell of the metric that has a value."""
    out: dict[str, list[tuple[str, Cell]]] = {metric: [] for metric in summary.metrics}
    for values, row in summary.rows:
        for _, metric, column in columns_of(summary):
            cell = row.get((metric, join.value_key(column) if summary.by else ""))
            if cell is not None and cell.value is not None:
                case = [f"{k}={param_text(v)}" for k, v in zip(summary.row_params, values)]
                case += [f"{summary.by}={param_text(column)}"] if summary.by else []
                out[metric].append((", ".join(case) or "-", cell))
    return out


def metric_cells(summary: Summary) -> dict[str, list[tuple[str, float]]]:
    """metric -> (case text 'k=v, ...', value) of every cell of the metric that has a value."""
    return {metric: [(case, cell.value) for case, cell in cells] for metric, cells in case_cells(summary).items()}


def legend(summary: Summary) -> list[str]:
    """What the cells are, in words; printed under every table."""
    cells = [c for _, row in summary.rows for c in row.values() if c is not None]
    lines = []
    if summary.by is not None and len(summary.metrics) == 1:
        lines.append(f"cells: {summary.metrics[0]} ({summary.units.get(summary.metrics[0], 'no unit')})")
    if summary.fixed:
        lines.append("fixed: " + ", ".join(f"{k}={param_text(v)}" for k, v in summary.fixed.items()))
    if summary.across_runs:
        lines.append(f"median over {len(summary.labels)} runs of each run's value; runs in this order: "
                     f"{', '.join(summary.labels)}; spread = (max - min) / median")
    elif any(c.samples for c in cells):
        lines.append("median [p20, p80]: the stored median, and p20-p80 of the stored samples")
    if summary.ratio_to:
        lines.append(f"ratios: each record's stored median over that of its {summary.ratio_to} counterpart in "
                     "the same run (no samples)")
    if any(not c.samples and c.runs is None for c in cells):
        lines.append(f"{STORED_ONLY} the stored median alone: the record keeps no samples of this metric")
    if any(c.off_samples for c in cells):
        lines.append(f"{OFF_SAMPLES} not the median of the stored samples (a total stored as the sum of its "
                     "components' medians, say); p20-p80 are those of the samples")
    if summary.limits:
        lines += summary_limits.legend([c.limit for c in cells], summary.limits_missing, len(summary.labels),
                                       summary.ratio_to)
    if summary.predicted and any(c.predicted is not None for c in cells):
        lines.append(summary_limits.PREDICTED_MEANING)
    return lines + _record_notes(summary)


def _record_notes(summary: Summary) -> list[str]:
    """The legend's lines about the records rather than the cells: stored ratios, left out, replaced."""
    lines = []
    ratios = [m for m in summary.metrics if summary.units.get(m) == units.SPEEDUP]
    if ratios:
        lines.append(f"{', '.join(ratios)}: ratios of medians as each record stores them (baseline / candidate), "
                     "not medians of per-sample ratios")
    if summary.left_out:
        lines.append(f"left out, not ok: {len(summary.left_out)} records ({'; '.join(summary.left_out[:3])})")
    if summary.replaced:
        lines.append(f"{summary.replaced} records replaced by a later record of the same configuration")
    return lines


def text_rows(summary: Summary, digits: int) -> tuple[list[str], list[list[str]]]:
    """(headers, rows of cell texts)."""
    columns = columns_of(summary)
    rows = []
    for values, cells in summary.rows:
        row = [param_text(v) for v in values]
        row += [cell_text(cells.get((m, join.value_key(c) if summary.by else "")), digits) for _, m, c in columns]
        rows.append(row)
    return [*summary.row_params, *(h for h, _, _ in columns)], rows


def table(summary: Summary, digits: int, notes: Sequence[str] = (), title: str | None = None) -> report.FittedTable:
    """The summary as a table that fits the console (report.FittedTable: where its columns do not fit, several
    that each repeat the case columns); the title above, the legend and notes below."""
    headers, rows = text_rows(summary, digits)
    keys = len(summary.row_params)
    columns = [report.Column(header, key=i < keys) for i, header in enumerate(headers)]
    return report.FittedTable(columns, rows, title=title, notes=[*legend(summary), *notes], title_justify="left")


def markdown(summary: Summary, digits: int, notes: Sequence[str] = (), title: str | None = None) -> str:
    """A Markdown table to paste, the legend (and notes) below it (one line each); the title above it."""
    headers, rows = text_rows(summary, digits)
    lines = [] if title is None else [f"**{title}**", ""]
    lines += report.markdown_table(headers, rows)
    return "\n".join(lines) + "\n\n" + "".join(f"{line}  \n" for line in [*legend(summary), *notes])


def as_json(summary: Summary, targets: Sequence[dict] = ()) -> str:
    """One object per (row, metric, pivot value), unpivoted, every number as stored."""
    out = []
    for values, cells in summary.rows:
        for _, metric, column in columns_of(summary):
            params = dict(zip(summary.row_params, values))
            if summary.by:
                params.update({summary.by: column, **summary.column_attrs.get(join.value_key(column), {})})
            cell = cells.get((metric, join.value_key(column) if summary.by else ""))
            out.append({"params": params, "metric": metric, "unit": summary.units.get(metric),
                        **_json_fields(cell, summary.limits, summary.predicted)})
    payload = {"runs": summary.labels, "across_runs": summary.across_runs, "fixed": summary.fixed,
               "left_out": summary.left_out, "rows": out, "targets": list(targets)}
    if summary.limits:
        payload["limits_missing"] = summary.limits_missing
    return json.dumps(payload, indent=2, default=str) + "\n"


def _json_fields(cell: Cell | None, limits: bool, predicted: bool = False) -> dict[str, Any]:
    """A cell's fields as stored; `limit` (null where the model names none) only with --limits, `predicted` (ms,
    null where it predicts none) only with --predicted."""
    extra = {**({"limit": None} if limits else {}), **({"predicted": None} if predicted else {})}
    if cell is None:
        return {"value": None, **extra}
    fields = {**cell.__dict__, "spread_pct": cell.spread_pct, "limit": cell.limit or None}
    return {k: v for k, v in fields.items() if k not in ("limit", "predicted") or k in extra}


def show(summary: Summary, fmt: str | None, digits: int, targets: Sequence[str] = (), title: str | None = None) -> None:
    """Print the summary on stdout: a rich table (default), --markdown or --json; with each --target's
    verdict on the printed values (qbench.analysis.targets)."""
    from qbench.analysis import targets as target_checks

    results = target_checks.check([target_checks.parse(t) for t in targets], metric_cells(summary), digits)
    notes = target_checks.lines(results)
    ratio_notice(summary)
    if fmt == "markdown":
        sys.stdout.write(markdown(summary, digits, notes, title))
    elif fmt == "json":
        sys.stdout.write(as_json(summary, results))
    else:
        report.stdout_console().print(table(summary, digits, notes, title))


def ratio_notice(summary: Summary) -> None:
    """On stderr: how many records --ratio-to left out for want of a counterpart, and why (none: nothing)."""
    if summary.ratio_left_out:
        report.notice(summary.ratio_left_out)


def show_each_bench(groups: dict[str, list[Run]], options: SummaryOptions, fmt: str | None, digits: int) -> None:
    """One table per bench (bench_groups), each with that bench's own columns and main metrics: the runs of
    several benches in one table would have the union of their parameters and metrics as columns. A bench
    that -k (or --ratio-to) leaves nothing of is named on stderr; if none is left, that is the usage error."""
    summaries, refused = [], []
    for bench, runs in groups.items():
        try:
            summaries.append((f"{bench}: {', '.join(run.label for run in runs)}", summarize_runs(runs, options)))
        except QbenchUsageError as exc:
            refused.append((bench, exc))
    if not summaries:
        raise refused[0][1]
    for i, (title, summary) in enumerate(summaries):
        if i and fmt == "markdown":
            sys.stdout.write("\n")
        show(summary, fmt, digits, title=title)
    for bench, exc in refused:
        sys.stderr.write(f"{bench}: nothing to show ({exc})\n")
