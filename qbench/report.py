"""Rich tables, JSON output and progress bars, all built from store records.

Tables go to stdout, progress bars and notices to stderr; rich honours NO_COLOR and plain
(non-TTY) output by itself. Plots live in qbench.plots (matplotlib is imported only there).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from qbench import units

CPU_NOTICE = (
    "Running on the CPU: these timings check that everything works end to end; they say nothing about GPU performance."
)


def cpu_notice(device: str) -> str | None:
    """CPU_NOTICE for a run on the CPU, None on a GPU."""
    return None if device == "cuda" else CPU_NOTICE


PIPE_WIDTH = 220  # tables written to a file or pipe are not squeezed into 80 columns


def stdout_console() -> Console:
    """Rich console for tables: the terminal's width on a TTY (or $COLUMNS), wide when piped."""
    import os

    console = Console(soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(soft_wrap=False, width=PIPE_WIDTH)
    return console


CELL_WRAP = 24  # characters: a cell longer than this may wrap onto more lines of its column; shorter ones stay whole


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """Characters each table column needs so that none of its words is cut: its longest word, and its longest
    text up to CELL_WRAP (a text wraps at its spaces)."""
    out = []
    for i, header in enumerate(headers):
        texts = [header, *(row[i] for row in rows)]
        word = max(len(w) for t in texts for w in t.split() or [""])
        out.append(max(1, word, min(max(map(len, texts)), CELL_WRAP)))
    return out


def natural_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """Characters each table column takes with every text on one line."""
    return [max(1, len(header), *(len(row[i]) for row in rows)) for i, header in enumerate(headers)]


def fit_widths(natural: Sequence[int], least: Sequence[int], width: int) -> list[int] | None:
    """Content widths of the columns of a table `width` characters wide (each column adds 3 for its border and
    padding, the table 1): every column at its natural width where they all fit, else the widest ones cut down
    to a common cap, none below its least width; None where the least widths alone do not fit. Fixed widths,
    because rich's own squeezing ignores a column's min_width and cuts words to '…'."""
    def total(cap: int) -> tuple[list[int], int]:
        widths = [max(low, min(nat, cap)) for nat, low in zip(natural, least)]
        return widths, sum(w + 3 for w in widths) + 1

    for cap in range(max(natural, default=1), 0, -1):
        widths, used = total(cap)
        if used <= width:
            return widths
    return None


def column_groups(widths: Sequence[int], keys: int, width: int) -> list[list[int]]:
    """The value columns (indices after the first `keys` key columns) in consecutive groups, each of which fits
    a table `width` characters wide beside the key columns, every column at its width (column_widths): a table
    with too many columns for the console prints as several, each repeating the key columns, instead of
    squeezing every cell to '4.3…'. A column too wide to share a table gets one of its own."""
    need = [w + 3 for w in widths]  # each column's left border and padding
    fixed = 1 + sum(need[:keys])  # the table's right border and its key columns
    groups: list[list[int]] = [[]]
    used = fixed
    for i in range(keys, len(widths)):
        if groups[-1] and used + need[i] > width:
            groups.append([])
            used = fixed
        groups[-1].append(i)
        used += need[i]
    return groups


def stderr_console() -> Console:
    return Console(stderr=True)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table: the header, its rule, one line per row (a '|' in a cell escaped)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]


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
        cells = [escape(format_value(rec["params"].get(p))) for p in params]
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
    reason = escape((rec.get("error") or "")[:60])  # error text is data, not markup
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


def counted(n: int, noun: str) -> str:
    """'1 record', '3 records': a count with its noun in the number it takes (regular plurals)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def notice(message: str, style: str = "yellow") -> None:
    """One message on stderr, printed literally: paths and errors may hold '[...]', which rich would
    otherwise read as markup (and drop, or fail on)."""
    stderr_console().print(f"[{style}]{escape(message)}[/{style}]")


# ---- comparisons (qbench.analysis.compare) -------------------------------------------------------------

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
COMPARE_TEXT, COMPARE_TEXT_LEAST = ("case", "note"), 8  # the columns that wrap, and how narrow they may get


_CASE_SPLIT = re.compile(r"/(?=[A-Za-z_][\w.-]*=)")  # between the key=value parts of a case id (store.case_id)


def _case_params(case: str) -> dict[str, str] | None:
    """The parameters of a case id 'k=v/k=v', or None where it is not one."""
    pairs = [part.partition("=") for part in _CASE_SPLIT.split(case)] if case else []
    return {k: v for k, _, v in pairs} if pairs and all(sep for _, sep, _ in pairs) else None


def case_labels(rows) -> tuple[dict[tuple[str, str], str], str]:
    """What a comparison shows as each row's case, by (bench, case id): the parameters whose values differ
    between the rows' cases, 'k=v, ...' (so that a narrow column wraps at its spaces), after the bench where
    the rows hold several (a case id that is not 'k=v/...' shows whole); and the parameters all the cases
    share, 'k=v, ...', which a table prints once beneath it instead of in every row."""
    from qbench.store import varying_params

    parsed = {(r.bench, r.case): _case_params(r.case) for r in rows}
    records = [{"params": p} for p in parsed.values() if p is not None]
    names = list(dict.fromkeys(k for record in records for k in record["params"]))
    whole = len(records) == len(parsed)  # with an id that is not 'k=v/...' among them, no parameter is shared
    varying = varying_params(records, names) if whole else names
    shared = ", ".join(f"{n}={records[0]['params'][n]}" for n in names if n not in varying)
    several = len({bench for bench, _ in parsed}) > 1
    labels = {}
    for (bench, case), params in parsed.items():
        text = case if params is None else ", ".join(f"{n}={params[n]}" for n in varying if n in params)
        labels[(bench, case)] = f"{bench} {text}".strip() if several else text or bench
    return labels, shared


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


def comparison_tables(comparison, width: int | None = None) -> list[Table]:
    """One rich table per candidate, with geometric-mean rows and marker counts in the caption, its columns fitted
    to `width` characters (fit_widths): the metric and number columns whole where they fit beside
    COMPARE_TEXT_LEAST characters for the case and the note, which then wrap, instead of every metric name and
    number cut to '…'."""
    tables = []
    labels, shared = case_labels(comparison.rows)
    for candidate in dict.fromkeys(r.candidate for r in comparison.rows):
        rows = [(_compare_cells(r, labels[(r.bench, r.case)]), MARKER_STYLE.get(r.marker) or None)
                for r in comparison.rows if r.candidate == candidate]
        rows += [(["geometric mean", metric, "", "", "", format_sig(value), format_change(100 * (value - 1)), "", "",
                   ""], "bold") for (cand, metric), value in comparison.geomeans.items() if cand == candidate]
        texts = [cells for cells, _ in rows]
        least = [min(w, COMPARE_TEXT_LEAST) if name in COMPARE_TEXT else w
                 for name, w in zip(COMPARE_COLUMNS, column_widths(COMPARE_COLUMNS, texts))]
        widths = None if width is None else fit_widths(natural_widths(COMPARE_COLUMNS, texts), least, width)
        table = Table(title=f"{escape(str(candidate))} vs {escape(str(comparison.reference))}", header_style="bold",
                      caption_justify="left")
        for i, name in enumerate(COMPARE_COLUMNS):
            table.add_column(name, justify="left" if name in ("case", "metric", "note") else "right",
                             width=None if widths is None else widths[i],
                             overflow="fold" if name in COMPARE_TEXT else "ellipsis")  # a case is one long word
        for cells, style in rows:
            table.add_row(*(escape(c) for c in cells), style=style)  # cases, notes and paths are data, not markup
        table.caption = "\n".join(x for x in (counts_line(comparison.counts.get(candidate, {})),
                                              shared and f"every case: {shared}") if x)
        tables.append(table)
    return tables


def counts_line(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{counts[m]} {MARKER_MEANING[m]} ({m})" for m in MARKER_MEANING if counts.get(m))


def comparison_markdown(comparison) -> str:
    labels, shared = case_labels(comparison.rows)
    rows = [_compare_cells(row, labels[(row.bench, row.case)]) for row in comparison.rows]
    for (cand, metric), value in comparison.geomeans.items():
        ratio, change = format_sig(value), format_change(100 * (value - 1))
        rows.append([f"geometric mean ({cand})", metric, "", "", "", ratio, change, "", "", ""])
    lines = markdown_table([n or "marker" for n in COMPARE_COLUMNS], rows)
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
    for (cand, metric), value in comparison.geomeans.items():
        rows.append([f"geometric mean ({cand})", metric, "", "", "", format_sig(value),
                     format_change(100 * (value - 1)), "", "", ""])
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
        notice(f"environment differs: {warning}")
    if fmt == "markdown":
        sys.stdout.write(comparison_markdown(comparison))
    elif fmt == "csv":
        sys.stdout.write(comparison_csv(comparison))
    elif fmt == "json":
        sys.stdout.write(comparison_json(comparison))
    else:
        console = stdout_console()
        for table in comparison_tables(comparison, console.width):
            console.print(table)


# ---- numbers a note quotes (qbench summary) ----------------------------------------------------


def format_change(pct: float | None) -> str:
    """A signed change in percent to 3 significant digits, never rounded onto a trailing zero: +4.98%, not
    +5.0% beside a 5% threshold it is within."""
    if pct is None:
        return "-"
    return ("+" if pct >= 0 else "-") + format_sig(abs(pct), 3) + "%"


def format_sig(value: Any, digits: int = 4) -> str:
    """A number to `digits` significant digits, with more digits whenever rounding would end on a zero
    (1.39996 is '1.39996', never '1.400'): a target of fewer than `digits` significant digits is then met
    or missed by the printed value exactly as by the stored one."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if isinstance(value, int) or not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    for sig in range(digits, 18):
        exponent = math.floor(math.log10(abs(value)))
        text = f"{value:.{sig - 1}e}" if exponent < -4 else f"{value:.{max(sig - 1 - exponent, 0)}f}"
        if not text.split("e")[0].endswith("0") or float(text) == value:
            return text
    return repr(value)
