"""Printing `qbench compare`'s result (qbench.analysis.compare builds it): a table per candidate that fits the
console (report.FittedTable), a Markdown table to paste, CSV or JSON; environment warnings on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from qbench import report
from qbench.report import Column, case_labels, format_change, format_sig

MARKER_STYLE = {"+": "red", "-": "green", "~": "yellow", "!": "bold red", "*": "green", "x": "dim", "n/a": "dim"}
MARKER_MEANING = {
    "-": "better",
    "+": "worse",
    "=": "same",
    "~": "not significant",
    "x": "not comparable",
    "!": "newly failing",
    "*": "fixed",
    "n/a": "missing",
}
COMPARE_COLUMNS = ("case", "metric", "unit", "reference", "candidate", "ratio", "change", "p", "", "note")
TABLE_COLUMNS = tuple(  # case and metric say what a row is (repeated where the table splits); case and note wrap
    Column(name, key=name in ("case", "metric"), wrap=name in ("case", "note"),
           justify="left" if name in ("case", "metric", "note") else "right") for name in COMPARE_COLUMNS)
NOTE_CELL = report.CELL_WRAP  # characters: a longer note prints below the table, numbered, its cell '[n]'


def _compare_cells(row, label: str) -> list[str]:
    change = format_change(row.change_pct)
    p_value = "-" if row.p_value is None else f"{row.p_value:.3g}"
    return [  # values and ratio as summary prints them: never rounded onto a trailing zero (1.0198, not 1.020)
        label,
        row.metric,
        row.unit or "",
        format_sig(row.reference_value),
        format_sig(row.candidate_value),
        format_sig(row.ratio),
        change,
        p_value,
        row.marker,
        row.note,
    ]


def _geomean_cells(label: str, metric: str, value: float) -> list[str]:
    return [label, metric, "", "", "", format_sig(value), format_change(100 * (value - 1)), "", "", ""]


def comparison_tables(comparison) -> list[report.FittedTable]:
    """One table per candidate, with geometric-mean rows, the marker counts and the parameters every case
    shares below it, and any note longer than NOTE_CELL numbered below it too (a reason in a narrow cell wraps
    onto a dozen rows)."""
    tables = []
    labels, shared = case_labels(comparison.rows)
    for candidate in dict.fromkeys(r.candidate for r in comparison.rows):
        notes = report.Notes()
        rows = [(_compare_cells(r, labels[(r.bench, r.case)]), MARKER_STYLE.get(r.marker) or None)
                for r in comparison.rows if r.candidate == candidate]
        rows += [(_geomean_cells("geometric mean", metric, value), "bold")
                 for (cand, metric), value in comparison.geomeans.items() if cand == candidate]
        for cells, _ in rows:
            cells[-1] = notes.mark(cells[-1]) if len(cells[-1]) > NOTE_CELL else cells[-1]
        lines = [counts_line(comparison.counts.get(candidate, {})), shared and f"every case: {shared}"]
        tables.append(report.FittedTable(TABLE_COLUMNS, [cells for cells, _ in rows],
                                         title=f"{candidate} vs {comparison.reference}",
                                         notes=[x for x in lines if x] + notes.lines(),
                                         row_styles=[style for _, style in rows]))
    return tables


def counts_line(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{counts[m]} {MARKER_MEANING[m]} ({m})" for m in MARKER_MEANING if counts.get(m))


def comparison_markdown(comparison) -> str:
    headers, rows, shared = comparison_rows(comparison)
    lines = report.markdown_table(headers, rows)
    if shared:
        lines.append(f"\nevery case: {shared}")
    for warning in comparison.env_warnings:
        lines.append(f"\n> environment differs: {warning}")
    return "\n".join(lines) + "\n"


def comparison_rows(comparison) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows with the geometric means last, the parameters every case shares): the comparison's
    cells as the Markdown table prints them, for other renderings (the HTML report)."""
    labels, shared = case_labels(comparison.rows)
    rows = [_compare_cells(row, labels[(row.bench, row.case)]) for row in comparison.rows]
    rows += [_geomean_cells(f"geometric mean ({cand})", metric, value)
             for (cand, metric), value in comparison.geomeans.items()]
    return [n or "marker" for n in COMPARE_COLUMNS], rows, shared


def comparison_csv(comparison) -> str:
    import csv
    import io

    buffer = io.StringIO()
    fields = list(comparison.rows[0].as_dict()) if comparison.rows else ["bench", "case", "metric"]
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    writer.writerows(r.as_dict() for r in comparison.rows)
    return buffer.getvalue()


def comparison_json(comparison) -> str:
    payload = {
        "reference": comparison.reference,
        "rows": [r.as_dict() for r in comparison.rows],
        "geometric_means": [{"candidate": c, "metric": m, "ratio": v} for (c, m), v in comparison.geomeans.items()],
        "counts": comparison.counts,
        "environment_differences": comparison.env_warnings,
    }
    return json.dumps(payload, indent=2, default=str) + "\n"


def print_comparison(comparison, fmt: str | None) -> None:
    """Environment warnings on stderr, then the comparison in the chosen format on stdout."""
    for warning in comparison.env_warnings:
        report.notice(f"environment differs: {warning}")
    if fmt == "markdown":
        sys.stdout.write(comparison_markdown(comparison))
    elif fmt == "csv":
        sys.stdout.write(comparison_csv(comparison))
    elif fmt == "json":
        sys.stdout.write(comparison_json(comparison))
    else:
        console = report.stdout_console()
        for table in comparison_tables(comparison):
            console.print(table)
