"""`qbench summary`: the tables a README or a note quotes, built straight from results.jsonl.

Per case (the parameters that vary over the selected records; the constant ones are listed once) and
per chosen metric, a cell holds the record's stored median, and p20-p80 of its stored samples when the
record keeps samples of that metric. Without samples the stored median stands alone (and is marked
when printed). The stored value is what `qbench compare` and the bench's own ratios use; where it is
not the median of the samples (switchback totals are sums of their components' medians, the seed's
definition, while their samples are per-repeat sums) the cell says so rather than print a second median.

`--by PARAM` pivots one parameter into columns. Several runs are shown side by side with a `run`
column (pivot it with `--by run`), or, with `--across-runs median`, combined: each cell is the median
over the runs of each run's value, with the per-run values beside it. Records are matched across runs
on their parameters as qbench.join normalizes them (a missing `exec` is eager, `float16` is fp16).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from qbench import join, metric_names, report, units
from qbench.compare import Run, load_any
from qbench.errors import QbenchUsageError
from qbench.timing import percentile

ACROSS_RUNS = ("median",)
TIMES = (units.MS, units.S)  # the default metrics of records that keep no samples
RUN_PARAM, BENCH_PARAM = "run", "bench"  # pseudo-parameters when the records come from several runs / benches


@dataclass(frozen=True)
class SummaryOptions:
    metrics: tuple[str, ...] = ()
    pattern: str | None = None
    by: str | None = None
    across_runs: str | None = None
    ratio_to: str | None = None  # PARAM=REF: each record over its PARAM=REF counterpart (qbench.ratios)
    every_metric: bool = False  # with no --metric: every metric of the records, not only the sampled ones


@dataclass(frozen=True)
class Cell:
    value: float | None  # the stored median (across runs: the median of the runs' values)
    p20: float | None = None
    p80: float | None = None
    samples: int = 0  # how many stored samples p20/p80 come from; 0: the stored median alone
    off_samples: bool = False  # the stored median is not the median of the stored samples
    runs: tuple[float | None, ...] | None = None  # across runs: each run's value, in the order given

    @property
    def spread_pct(self) -> float | None:
        """(max - min) / median of the runs' values, in percent."""
        present = [v for v in self.runs or () if v is not None]
        if len(present) < 2 or not self.value:
            return None
        return 100.0 * (max(present) - min(present)) / abs(self.value)


@dataclass
class Summary:
    labels: list[str]  # the runs, in the order given
    row_params: list[str]  # parameters that vary (the row key), without the pivot
    fixed: dict[str, Any]  # parameters with one value over every selected record
    metrics: list[str]
    units: dict[str, str]
    by: str | None
    columns: list[Any]  # the pivot's values, sorted ([None] without a pivot)
    rows: list[tuple[tuple, dict[tuple[str, str], Cell]]]  # (row values, (metric, column key) -> cell)
    across_runs: str | None = None
    left_out: list[str] = field(default_factory=list)  # records not ok, as 'bench/case: status error'
    replaced: int = 0  # records replaced by a later record of the same configuration in the same run
    column_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)  # pivot key -> parameters tied to it
    ratio_to: str | None = None  # PARAM=REF when the cells are ratios to those records (qbench.ratios)


def record_cell(record: dict[str, Any], metric: str) -> Cell | None:
    """The cell of one record's metric; None when the record lacks the metric."""
    if metric not in record.get("metrics", {}):
        return None
    value = record["metrics"][metric]
    samples = [x for x in record.get("samples", {}).get(metric, []) if x is not None]
    if not samples:
        return Cell(value)
    median = percentile(samples, 50)
    off = value is None or not math.isclose(median, value, rel_tol=1e-9, abs_tol=1e-12)
    return Cell(value, percentile(samples, 20), percentile(samples, 80), len(samples), off)


def across_cell(cells: Sequence[Cell | None]) -> Cell:
    """The median over runs of each run's value (None where a run lacks the case)."""
    values = tuple(c.value if c is not None else None for c in cells)
    present = [v for v in values if v is not None]
    return Cell(percentile(present, 50) if present else None, runs=values)


def _select(runs: Sequence[Run], options: SummaryOptions) -> tuple[list[tuple[int, dict]], list[str]]:
    """(run index, record) of the ok records that -k keeps, and the not-ok ones as text."""
    try:
        regex = re.compile(options.pattern) if options.pattern else None
    except re.error as exc:
        raise QbenchUsageError(f"-k {options.pattern!r} is not a valid regular expression ({exc})") from None
    kept, left_out = [], []
    for index, run in enumerate(runs):
        for rec in run.records:
            if regex and not regex.search(f"{rec['bench']}/{rec['case']}"):
                continue
            if rec.get("status", "ok") != "ok":
                left_out.append(f"{rec['bench']}/{rec['case']}: {rec.get('status')} {rec.get('error') or ''}".strip())
                continue
            kept.append((index, rec))
    if not kept:
        raise QbenchUsageError("no ok record of these runs matches" + (f" -k {options.pattern!r}" if regex else ""))
    return kept, left_out


def pick_metrics(records: Sequence[dict], wanted: Sequence[str], every: bool = False) -> list[str]:
    """--metric names (each must exist; patterns expanded by qbench.metric_names), else (every) all metrics,
    else every metric some record keeps samples of (the bench's main metrics), else every time (a run rebuilt
    without its samples), in record order."""
    known = metric_names.of(records)
    shown = metric_names.listed(known)
    wanted = metric_names.expand(wanted, known)
    for name in wanted:
        if name not in known:
            raise QbenchUsageError(f"--metric {name}: no selected record has this metric (they have: {shown})")
    if wanted:
        return list(dict.fromkeys(wanted))
    if every:
        return known
    sampled = [m for m in known if any(rec.get("samples", {}).get(m) for rec in records)]
    sampled = sampled or [m for m in known if any(rec.get("units", {}).get(m) in TIMES for rec in records)]
    if not sampled:
        raise QbenchUsageError(f"these records keep no samples or times; name metrics with --metric ({shown})")
    return sampled


def _params_of(entries: list[tuple[int, dict]], runs: Sequence[Run], across: bool) -> list[dict[str, Any]]:
    """Each record's parameters as joins see them, plus `run` / `bench` where several are shown. A
    default (exec: eager) is filled in only when some record names that parameter."""
    named = {k for _, rec in entries for k in rec.get("params", {})}
    several_runs, several_benches = len(runs) > 1 and not across, len({r["bench"] for _, r in entries}) > 1
    params = []
    for index, rec in entries:
        joined = {k: v for k, v in join.join_params(rec.get("params", {})).items() if k in named}
        pseudo = {BENCH_PARAM: rec["bench"]} if several_benches else {}
        pseudo.update({RUN_PARAM: runs[index].label} if several_runs else {})
        params.append({**pseudo, **joined})
    return params


def split_params(params: Sequence[dict[str, Any]], by: str | None) -> tuple[list[str], dict[str, Any]]:
    """(parameters that vary, the pivot excluded; parameters with one value everywhere)."""
    names = list(dict.fromkeys(k for p in params for k in p))
    if by is not None and by not in names:
        raise QbenchUsageError(f"--by {by}: no selected record has this parameter (they have: {', '.join(names)})")
    varying, fixed = [], {}
    for name in (n for n in names if n != by):
        if len({join.value_key(p.get(name)) for p in params}) > 1:
            varying.append(name)
        else:
            fixed[name] = params[0].get(name)
    return varying, fixed


def column_params(params: Sequence[dict[str, Any]], varying: list[str], by: str | None) -> dict[str, dict]:
    """Parameters tied to the pivot (one value within each of its columns: moe's `transport` under
    `--by system`), per column key: they label the column instead of splitting the rows."""
    if by is None:
        return {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in params:
        groups.setdefault(join.value_key(p.get(by)), []).append(p)
    tied = [n for n in varying if all(len({join.value_key(p.get(n)) for p in g}) == 1 for g in groups.values())]
    return {key: {n: g[0].get(n) for n in tied} for key, g in groups.items()}


def order_key(values: Sequence[Any]) -> tuple:
    """Sort rows and columns naturally: None first, numbers by value, then text."""
    return tuple((0, 0, "") if v is None else (1, v, "") if isinstance(v, (int, float)) else (2, 0, str(v))
                 for v in values)


def build(runs: Sequence[Run], options: SummaryOptions) -> Summary:
    """The summary of these runs' records (see the module docstring)."""
    across = options.across_runs is not None
    if across and len(runs) < 2:
        raise QbenchUsageError("--across-runs combines several runs of one command; give at least two runs")
    entries, left_out = _select(runs, options)
    metrics = pick_metrics([rec for _, rec in entries], options.metrics, options.every_metric)
    entries = [(i, rec) for i, rec in entries if any(m in rec.get("metrics", {}) for m in metrics)]
    params = _params_of(entries, runs, across)
    varying, fixed = split_params(params, options.by)
    attrs = column_params(params, varying, options.by)
    tied = set(next(iter(attrs.values()), {}))
    row_params = [n for n in varying if n not in tied]
    grid, shown, columns, replaced = _grid(entries, params, row_params, options.by, metrics, len(runs))
    summary = Summary([r.label for r in runs], row_params, fixed, metrics, {}, options.by,
                      [columns[k] for k in sorted(columns, key=lambda k: order_key([columns[k]]))],
                      [], options.across_runs, left_out, replaced, attrs)  # fmt: skip
    for rec in (rec for _, rec in entries):
        summary.units.update({m: u for m, u in rec.get("units", {}).items() if m in metrics})
    for key in sorted(grid, key=lambda k: order_key(shown[k])):
        cells = {slot: across_cell(per_run) if across else _only(per_run) for slot, per_run in grid[key].items()}
        summary.rows.append((shown[key], cells))
    return summary


def _grid(entries, params, row_params, by, metrics, n_runs):
    """(row key -> (metric, column key) -> per-run cells, row key -> shown values, column key -> value,
    how many records a later one replaced). Without --across-runs each slot keeps its one record."""
    grid: dict[tuple, dict[tuple[str, str], list]] = {}
    shown: dict[tuple, tuple] = {}
    columns: dict[str, Any] = {}
    seen, replaced = set(), 0
    for (index, rec), p in zip(entries, params):
        key = tuple(join.value_key(p.get(n)) for n in row_params)
        column = join.value_key(p.get(by)) if by else ""
        shown.setdefault(key, tuple(p.get(n) for n in row_params))
        columns.setdefault(column, p.get(by) if by else None)
        replaced += (index, key, column) in seen
        seen.add((index, key, column))
        for metric in metrics:
            slots = grid.setdefault(key, {}).setdefault((metric, column), [None] * n_runs)
            slots[index] = record_cell(rec, metric) or slots[index]
    return grid, shown, columns, replaced


def _only(per_run: list[Cell | None]) -> Cell | None:
    """Without --across-runs a slot holds one run's record (`run` is part of the row key)."""
    return next((c for c in per_run if c is not None), None)


def summarize(paths: Sequence[str], options: SummaryOptions) -> Summary:
    """Load the runs (run directories, or seed files imported on the fly) and summarize them."""
    return summarize_runs([load_any(p) for p in paths], options)


def bench_groups(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The runs by the bench (or benches, joined by '+') their records hold, in order of first appearance."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault("+".join(sorted({rec["bench"] for rec in run.records})), []).append(run)
    return groups


def summarize_runs(runs: Sequence[Run], options: SummaryOptions) -> Summary:
    """The summary of loaded runs (see summarize)."""
    if options.across_runs is not None and options.across_runs not in ACROSS_RUNS:
        raise QbenchUsageError(f"--across-runs {options.across_runs}: choose from {', '.join(ACROSS_RUNS)}")
    groups = bench_groups(runs)
    if options.across_runs is not None and len(groups) > 1:
        raise QbenchUsageError(f"--across-runs combines reruns of one command; these runs are of several benches "
                               f"({', '.join(groups)}): summarize each bench's runs on their own")
    if not options.ratio_to:
        return build(runs, options)
    from qbench.ratios import ratio_runs

    result = build(ratio_runs(runs, options.ratio_to), options)
    result.ratio_to = options.ratio_to
    return result


# ---- printing: a rich table, a Markdown table to paste, or JSON --------------------------------------

STORED_ONLY, OFF_SAMPLES = "\u2020", "\u2021"  # dagger, double dagger: explained by legend()


def cell_text(cell: Cell | None, digits: int) -> str:
    """'median [p20, p80]', 'median' + dagger (stored median alone), across runs 'median (runs: a, b; spread s%)'."""
    if cell is None or cell.value is None:
        return "-"
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
                label = ", ".join(f"{k}={param_text(v)}" for k, v in tied.items())
                header = f"{prefix}{summary.by}={param_text(column)}" + (f" ({label})" if label else "")
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


def param_text(value: Any) -> str:
    """A parameter value as a case id spells it: 8192, not 8,192 (the text -k matches)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return "-" if value is None else str(value)


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


def tables(summary: Summary, digits: int, notes: Sequence[str] = (), title: str | None = None,
           width: int | None = None) -> list:
    """The rich table(s) of the summary: one, or where its columns do not fit `width` characters (None: no
    limit), several that each repeat the case columns and take the next metric columns that fit
    (report.column_groups); the title above the first, the legend and notes under the last."""
    from rich.table import Table
    from rich.text import Text

    headers, rows = text_rows(summary, digits)  # Text: '[p20, p80]' is data, not rich markup
    keys = len(summary.row_params)
    least, natural = report.column_widths(headers, rows), report.natural_widths(headers, rows)
    groups = [list(range(keys, len(headers)))] if width is None else report.column_groups(least, keys, width)
    out = []
    for n, group in enumerate(groups):
        last, columns = n == len(groups) - 1, [*range(keys), *group]
        # fixed widths where the group fits; one that cannot fit is left to rich to squeeze
        fitted = None if width is None else report.fit_widths([natural[i] for i in columns],
                                                                [least[i] for i in columns], width)
        t = Table(header_style="bold", caption=Text("\n".join([*legend(summary), *notes])) if last else None,
                  caption_justify="left", title=None if title is None or n else Text(title), title_justify="left")
        for j, i in enumerate(columns):
            t.add_column(Text(headers[i]), justify="right", style="cyan" if i < keys else None,
                         width=None if fitted is None else fitted[j], overflow="fold" if i < keys else "ellipsis")
        for row in rows:
            t.add_row(*(Text(row[i]) for i in columns))
        out.append(t)
    return out


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
            fields = {**cell.__dict__, "spread_pct": cell.spread_pct} if cell else {"value": None}
            out.append({"params": params, "metric": metric, "unit": summary.units.get(metric), **fields})
    payload = {"runs": summary.labels, "across_runs": summary.across_runs, "fixed": summary.fixed,
               "left_out": summary.left_out, "rows": out, "targets": list(targets)}
    return json.dumps(payload, indent=2, default=str) + "\n"


def show(summary: Summary, fmt: str | None, digits: int, targets: Sequence[str] = (), title: str | None = None) -> None:
    """Print the summary on stdout: a rich table (default), --markdown or --json; with each --target's
    verdict on the printed values (qbench.targets)."""
    from qbench import targets as target_checks

    results = target_checks.check([target_checks.parse(t) for t in targets], metric_cells(summary), digits)
    notes = target_checks.lines(results)
    if fmt == "markdown":
        sys.stdout.write(markdown(summary, digits, notes, title))
    elif fmt == "json":
        sys.stdout.write(as_json(summary, results))
    else:
        console = report.stdout_console()
        for part in tables(summary, digits, notes, title, console.width):
            console.print(part)


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
