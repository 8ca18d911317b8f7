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
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

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
    notes: Sequence[str] = (),
    limits: Any = None,
) -> FittedTable:
    """One row per record: the params that vary over the records (the ones they share listed once below), the
    metrics any record has (with their units), with `limits` the limit binding each (limit_cell), and the status,
    its reasons numbered below the table."""
    headers = headers or {}
    unit_of = _units(records)
    varying, fixed = split_fixed(records, params, headers)
    shown = [m for m in metrics if any(rec["metrics"].get(m) is not None for rec in records)]
    reasons = Notes()
    columns = [Column(headers.get(p, p), key=True) for p in varying]
    limited = limits is not None
    columns += [Column(headers.get(m, m), unit_of.get(m)) for m in shown] + ([LIMIT] if limited else []) + [STATUS]
    rows = [[format_value(rec["params"].get(p)) for p in varying]
            + [value_cell(rec["metrics"].get(m), unit_of.get(m)) for m in shown]
            + ([limit_cell(rec, limits)] if limited else []) + [status_cell(rec, reasons)]
            for rec in records]
    notes = [*fixed_line(fixed), *notes, *limit_note(limits, "the record's time"), *reasons.lines()]
    return FittedTable(columns, rows, title=title, notes=notes)


def _units(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for rec in records:
        merged.update(rec.get("units", {}))
    return merged


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


# ---- tables that fit the console: one mechanism for every table qbench prints ------------------------------

CELL_WRAP = 24  # characters: a cell longer than this may wrap onto more lines of its column; shorter ones stay whole


def _longest_line(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """Characters each table column needs so that none of its words is cut: its longest word, and its longest
    text up to CELL_WRAP (a text wraps at its spaces)."""
    longest = natural_widths(headers, rows)
    return [max(word, min(text, CELL_WRAP)) for word, text in zip(word_widths(headers, rows), longest)]


def word_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """The longest word of each column: the narrowest it can be without cutting a word."""
    return [max((len(w) for t in [header, *(row[i] for row in rows)] for w in t.split()), default=1)
            for i, header in enumerate(headers)]


def natural_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """Characters each table column takes with every text (each line of a header with its unit) on one line."""
    return [max(1, _longest_line(header), *(_longest_line(row[i]) for row in rows)) for i, header in enumerate(headers)]


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


def column_groups(widths: Sequence[int], keys: Collection[int], width: int) -> list[list[int]]:
    """The value columns (every index not in `keys`) in consecutive groups, each of which fits a table `width`
    characters wide beside the key columns, every column at its width (column_widths): a table with too many
    columns for the console prints as several, each repeating the key columns, instead of squeezing every cell
    to '4.3…'. A column too wide to share a table gets one of its own."""
    need = [w + 3 for w in widths]  # each column's left border and padding
    fixed = 1 + sum(need[i] for i in keys)  # the table's right border and its key columns
    groups: list[list[int]] = [[]]
    used = fixed
    for i in (i for i in range(len(widths)) if i not in keys):
        if groups[-1] and used + need[i] > width:
            groups.append([])
            used = fixed
        groups[-1].append(i)
        used += need[i]
    return groups


@dataclass(frozen=True)
class Column:
    """A column of a FittedTable: its header (and unit, a dim second line), how its cells align, whether it is
    a key column (what a row is: repeated in every table of a split, cyan) and whether its cells are free text
    that may wrap onto more lines down to its longest word (a case label 'k=v, k=v', a note), where other
    columns keep texts up to CELL_WRAP characters on one line."""

    header: str
    unit: str | None = None
    justify: str = "right"
    key: bool = False
    wrap: bool = False

    @property
    def text(self) -> str:
        return f"{self.header}\n{self.unit}" if self.unit else self.header

    def heading(self) -> Text:
        return Text(self.header) + Text(f"\n{self.unit}", style="dim") if self.unit else Text(self.header)


class Notes:
    """Long texts (a status's reason, a comparison's note) printed once below a table as '[n] text', the cell
    holding only '[n]': a one-line reason inside a narrow cell would wrap onto a dozen rows. Equal texts share
    one number."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def mark(self, text: str) -> str:
        return f"[{self._numbers.setdefault(text, len(self._numbers) + 1)}]"

    def lines(self) -> list[str]:
        return [f"[{n}] {text}" for text, n in self._numbers.items()]


class FittedTable:
    """Rows of cells (a str prints literally, never as rich markup; a Text keeps its style) printed to fit the
    console's width: one rich table where its columns fit (each at its natural width, or the widest cut down to
    where their texts wrap at spaces), else several, each repeating the key columns and taking the next columns
    that fit (column_groups); the title above the first, the notes (legend, numbered reasons) below the last."""

    def __init__(self, columns: Sequence[Column], rows: Sequence[Sequence[str | Text]], *, title: str | None = None,
                 notes: Sequence[str] = (), row_styles: Sequence[str | None] | None = None, show_lines: bool = False,
                 title_justify: str = "center"):
        self.columns, self.title_justify = list(columns), title_justify
        self.rows = [[cell if isinstance(cell, Text) else Text(cell) for cell in row] for row in rows]
        self.title, self.notes, self.show_lines = title, list(notes), show_lines
        self.row_styles = list(row_styles) if row_styles is not None else [None] * len(self.rows)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        yield from self.tables(options.max_width)
        if self.notes:
            yield Text("\n".join(self.notes))

    def tables(self, width: int | None) -> list[Table]:
        """The rich tables for a console `width` characters wide (None: one table, sized by rich)."""
        headers, texts = [c.text for c in self.columns], [[cell.plain for cell in row] for row in self.rows]
        least = [word if c.wrap else w for c, w, word in zip(self.columns, column_widths(headers, texts),
                                                               word_widths(headers, texts))]
        natural = natural_widths(headers, texts)
        keys = [i for i, c in enumerate(self.columns) if c.key]
        groups = [[i for i in range(len(headers)) if i not in keys]] if width is None else \
            column_groups(least, keys, width)
        out = []
        for n, group in enumerate(groups):
            shown = sorted([*keys, *group])
            # fixed widths where the group fits; one that cannot fit is left to rich to squeeze
            fitted = None if width is None else fit_widths([natural[i] for i in shown], [least[i] for i in shown],
                                                           width)
            out.append(self._table(shown, fitted, first=n == 0))
        return out

    def _table(self, shown: Sequence[int], widths: Sequence[int] | None, first: bool) -> Table:
        table = Table(title=Text(self.title) if first and self.title else None, title_justify=self.title_justify,
                      header_style="bold", show_lines=self.show_lines)
        for j, i in enumerate(shown):
            column = self.columns[i]
            table.add_column(column.heading(), justify=column.justify, style="cyan" if column.key else None,
                             width=None if widths is None else widths[j],
                             overflow="fold" if column.key or column.wrap else "ellipsis")
        for row, style in zip(self.rows, self.row_styles):
            table.add_row(*(row[i] for i in shown), style=style)
        return table


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


STATUS = Column("status", justify="left", key=True)


def status_cell(record: Mapping[str, Any], notes: Notes) -> Text:
    """'ok', or the status and the number of its reason among the notes ('skipped [1]'); the reason is data,
    printed as written."""
    status = record.get("status", "ok")
    if status == "ok":
        return Text("ok", style="green")
    reason = (record.get("error") or "").strip()
    text = f"{status} {notes.mark(reason)}" if reason else status
    return Text(text, style="red" if status == "error" else "yellow")


def value_cell(value: Any, unit: str | None) -> Text:
    """A metric's value as format_value prints it; speed-ups green or red (speedup_style)."""
    return Text(format_value(value, unit), style=speedup_style(value) if unit == units.SPEEDUP else "")


# ---- the limit binding a record's time in the model, in the bench tables ------------------------------------

LIMIT = Column("limit", justify="left")


def limit_cell(record: Mapping[str, Any], limits: Any) -> str:
    """The limit binding the record's time as the model predicts it (limits: qbench.explain.limits.RunLimits of the
    run), '-' where it names none."""
    return limits.of(record) or "-"


def limit_note(limits: Any, what: str) -> list[str]:
    """The line under a bench table that says what its limit column holds (the limit binding `what`), or why it
    holds none; [] without `limits`."""
    if limits is None:
        return []
    if limits.missing:
        return [f"limit: none, {limits.missing}"]
    return [f"limit: what binds {what} in the model (power: compute at a power-capped clock; see qbench explain)"]


def split_fixed(records: Sequence[Mapping[str, Any]], params: Sequence[str],
                headers: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, Any]]:
    """(the params whose value differs between the records: a table's key columns; header -> value of those
    every record shares, for fixed_line). A param no record has is neither."""
    from qbench.store import varying_params

    varying = varying_params(records, params)
    fixed = {(headers or {}).get(p, p): value for p in params
             if p not in varying and records and (value := records[0]["params"].get(p)) is not None}
    return varying, fixed


def fixed_line(values: Mapping[str, Any]) -> list[str]:
    """['fixed: k=v, ...'] for the parameters every row shares (printed once instead of as columns), or []."""
    return ["fixed: " + ", ".join(f"{k}={param_text(v)}" for k, v in values.items())] if values else []


def param_text(value: Any) -> str:
    """A parameter value as a case id spells it: 8192, not 8,192 (the text -k matches); None as '-'."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return "-" if value is None else str(value)


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
