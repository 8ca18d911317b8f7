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
on their parameters as qbench.analysis.join normalizes them (a missing `exec` is eager, `float16` is fp16).
With `--limits` each cell also holds the limit binding the model's prediction of its metric for its record
(qbench.analysis.summary_limits).
Printing (rich, Markdown, JSON) is qbench.analysis.summary_output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from qbench import metric_names, units
from qbench.analysis import join, patterns, summary_limits
from qbench.analysis.compare import Run, load_any
from qbench.errors import QbenchUsageError
from qbench.samples import percentile

ACROSS_RUNS = ("median",)
TIMES = (units.MS, units.S)  # the default metrics of records that keep no samples
RUN_PARAM, BENCH_PARAM = "run", "bench"  # pseudo-parameters when the records come from several runs / benches


@dataclass(frozen=True)
class SummaryOptions:
    metrics: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()  # -k: a record is kept where every regex matches its 'bench/case'
    by: str | None = None
    across_runs: str | None = None
    ratio_to: str | None = None  # PARAM=REF: each record over its PARAM=REF counterpart (qbench.analysis.ratios)
    every_metric: bool = False  # with no --metric: every metric of the records, not only the sampled ones
    limits: bool = False  # each cell's binding limit (qbench.analysis.summary_limits)
    predicted: bool = False  # also the model's predicted time of each cell (implies limits)


@dataclass(frozen=True)
class Cell:
    value: float | None  # the stored median (across runs: the median of the runs' values)
    p20: float | None = None
    p80: float | None = None
    samples: int = 0  # how many stored samples p20/p80 come from; 0: the stored median alone
    off_samples: bool = False  # the stored median is not the median of the stored samples
    runs: tuple[float | None, ...] | None = None  # across runs: each run's value, in the order given
    limit: str = ""  # with --limits: what binds the model's prediction of the metric ('' where it predicts none)
    predicted: float | None = None  # with --predicted: the model's time of the metric (ms; None where none)

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
    ratio_to: str | None = None  # PARAM=REF when the cells are ratios to those records (qbench.analysis.ratios)
    ratio_left_out: str = ""  # how many records gave no ratio and why, one line (ratios.left_out_line)
    limits: bool = False  # --limits: the cells carry their binding limits
    limits_missing: dict[str, str] = field(default_factory=dict)  # --limits: run label -> why it has none
    predicted: bool = False  # --predicted: the cells carry the model's times


def record_cell(record: dict[str, Any], metric: str) -> Cell | None:
    """The cell of one record's metric; None when the record lacks the metric."""
    if metric not in record.get("metrics", {}):
        return None
    value = record["metrics"][metric]
    limit, predicted = summary_limits.of(record, metric), summary_limits.predicted_of(record, metric)
    samples = [x for x in record.get("samples", {}).get(metric, []) if x is not None]
    if not samples:
        return Cell(value, limit=limit, predicted=predicted)
    median = percentile(samples, 50)
    off = value is None or not math.isclose(median, value, rel_tol=1e-9, abs_tol=1e-12)
    return Cell(value, percentile(samples, 20), percentile(samples, 80), len(samples), off, limit=limit,
                predicted=predicted)


def across_cell(cells: Sequence[Cell | None]) -> Cell:
    """The median over runs of each run's value (None where a run lacks the case), and the limit their records
    agree on (summary_limits.agreed)."""
    values = tuple(c.value if c is not None else None for c in cells)
    present = [v for v in values if v is not None]
    limit = summary_limits.agreed([c.limit for c in cells if c is not None])
    predicted = [c.predicted for c in cells if c is not None and c.predicted is not None]
    return Cell(percentile(present, 50) if present else None, runs=values, limit=limit,
                predicted=percentile(predicted, 50) if predicted else None)


def _select(runs: Sequence[Run], options: SummaryOptions) -> tuple[list[tuple[int, dict]], list[str]]:
    """(run index, record) of the ok records that every -k keeps, and the not-ok ones as text."""
    keep = patterns.matcher(options.patterns)
    kept, left_out = [], []
    for index, run in enumerate(runs):
        for rec in run.records:
            if not keep(f"{rec['bench']}/{rec['case']}"):
                continue
            if rec.get("status", "ok") != "ok":
                left_out.append(f"{rec['bench']}/{rec['case']}: {rec.get('status')} {rec.get('error') or ''}".strip())
                continue
            kept.append((index, rec))
    if not kept:
        raise QbenchUsageError("no ok record of these runs matches" + patterns.described(options.patterns))
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
    missing = {}
    if options.predicted and options.ratio_to:
        raise QbenchUsageError("--predicted gives the model's time of each cell, which a --ratio-to ratio is not; "
                               "give one of them")
    limits = options.limits or options.predicted
    if limits:  # before any ratio: a ratio record keeps the limits of the record it divides
        runs, missing = summary_limits.with_limits(runs, options.predicted)
    result = _ratios(runs, options) if options.ratio_to else build(runs, options)
    result.limits, result.limits_missing, result.predicted = limits, missing, options.predicted
    return result


def _ratios(runs: Sequence[Run], options: SummaryOptions) -> Summary:
    """The summary of each record over its --ratio-to counterpart (qbench.analysis.ratios)."""
    from qbench.analysis import ratios

    divided = ratios.ratio_runs(runs, options.ratio_to)
    result = build(divided.runs, options)
    result.ratio_to = options.ratio_to
    result.ratio_left_out = ratios.left_out_line(options.ratio_to, divided.left_out)
    return result
