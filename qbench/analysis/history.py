"""`qbench history`: each case's metric as a series over code revisions, with its spread and change points.

Runs are grouped by revision (qbench.analysis.revisions: a commit, in git's order where the repository is at
hand, else in the order of the runs' times) and by GPU (env.json's gpu_name): runs of different GPUs never
share a series. Records are matched across runs on their parameters as qbench.analysis.join normalizes them
(a parameter added later is read at the value older runs had), so a series follows one configuration.

A point is one revision's value of one case and metric:
  value   the median over the revision's runs of each run's stored value (one run: its stored value)
  spread  several runs: the lowest and highest run value; one run: p20-p80 of its stored samples; else none
The change-point rule, between each point and the one before it (the step is b / a - 1, in percent):
  '='  the step is within the noise floor: the larger of --threshold and either point's spread width
       ((high - low) / value): a step the runs' own spread could make is no change
  '+' / '-'  worse / better (by the unit's declared direction; '^' / 'v' for units with no better side):
       the step exceeds the floor and the two points differ beyond chance: a two-sided Mann-Whitney U test on
       their samples (pooled over each revision's runs) gives p < 0.05, or, where either point keeps fewer than
       two samples, every run of one point lies beyond every run of the other (at least two runs each)
  '~'  beyond the floor but not shown to differ (p >= 0.05, runs overlapping, or nothing to test with)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from qbench import units
from qbench.analysis import join, revisions
from qbench.analysis import patterns as match
from qbench.analysis.compare import ALPHA, Run, mann_whitney_p
from qbench.analysis.summary import pick_metrics
from qbench.errors import QbenchUsageError
from qbench.samples import percentile

DEFAULT_THRESHOLD_PCT = 5.0  # as compare's: a step below 5% is never called a change


@dataclass(frozen=True)
class Point:
    revision: str  # the revision's label
    value: float
    low: float | None = None
    high: float | None = None
    run_values: tuple[float, ...] = ()
    samples: tuple[float, ...] = ()  # pooled over the revision's runs
    marker: str = ""  # against the previous point ('' for the first)
    step_pct: float | None = None
    p_value: float | None = None

    @property
    def width_pct(self) -> float:
        """The spread's width relative to the value, in percent (0 without a spread)."""
        if self.low is None or self.high is None or not self.value:
            return 0.0
        return 100.0 * (self.high - self.low) / abs(self.value)


@dataclass
class Series:
    gpu: str | None
    bench: str
    params: dict[str, Any]  # the normalized join parameters of the configuration
    metric: str
    unit: str | None
    points: list[Point] = field(default_factory=list)

    def changes(self) -> list[Point]:
        return [p for p in self.points if p.marker not in ("", "=")]


@dataclass
class History:
    revisions: list[str]  # labels, oldest first
    order: str  # 'git' or 'time'
    series: list[Series]
    threshold_pct: float
    runs: dict[str, list[str]]  # revision label -> its runs


def _selected(runs: Sequence[Run], patterns: Sequence[str]) -> list[tuple[Run, dict]]:
    keep = match.matcher(patterns)  # every -k must match
    kept = [(run, rec) for run in runs for rec in run.records if rec.get("status", "ok") == "ok"
            and keep(f"{rec['bench']}/{rec['case']}")]
    if not kept:
        raise QbenchUsageError("no ok record of these runs matches" + match.described(patterns))
    return kept


def _series_key(run: Run, rec: dict, keys: dict[str, list[str]]) -> tuple:
    params = join.join_params(rec.get("params", {}))
    names = keys[rec["bench"]]
    return (run.env.get("gpu_name"), rec["bench"], tuple((k, join.value_key(params.get(k))) for k in names))


def _join_keys(entries: list[tuple[Run, dict]]) -> dict[str, list[str]]:
    """bench -> the parameters every run of that bench knows (the series key)."""
    per_run: dict[str, dict[str, list[dict]]] = {}
    for run, rec in entries:
        per_run.setdefault(rec["bench"], {}).setdefault(run.label, []).append(rec)
    return {bench: join.join_keys(list(sets.values()), bench) for bench, sets in per_run.items()}


def _point(label: str, cells: list[tuple[float, list[float]]]) -> Point:
    """One revision's point from its runs' (stored value, samples)."""
    values = tuple(v for v, _ in cells)
    pooled = tuple(x for _, s in cells for x in s)
    value = percentile(list(values), 50)
    if len(values) > 1:
        return Point(label, value, min(values), max(values), values, pooled)
    if len(pooled) > 1:
        return Point(label, value, percentile(list(pooled), 20), percentile(list(pooled), 80), values, pooled)
    return Point(label, value, run_values=values, samples=pooled)


def judge(previous: Point, point: Point, direction: int, threshold_pct: float) -> Point:
    """The point with its step, p-value and marker against the previous point (the module's rule)."""
    from dataclasses import replace

    if not previous.value:
        return replace(point, marker="x")
    step = 100.0 * (point.value - previous.value) / abs(previous.value)
    floor = max(threshold_pct, previous.width_pct, point.width_pct)
    p = mann_whitney_p(previous.samples, point.samples)
    if abs(step) <= floor:
        return replace(point, marker="=", step_pct=step, p_value=p)
    if p is not None:
        differs = p < ALPHA
    else:
        a, b = previous.run_values, point.run_values
        differs = min(len(a), len(b)) >= 2 and (max(a) < min(b) or max(b) < min(a))
    if not differs:
        marker = "~"
    elif direction == 0:
        marker = "^" if step > 0 else "v"
    else:
        marker = "+" if (step > 0) == (direction < 0) else "-"
    return replace(point, marker=marker, step_pct=step, p_value=p)


def build(runs: Sequence[Run], metrics: Sequence[str] = (), patterns: Sequence[str] = (),
          threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> History:
    """The history of these runs (see the module docstring)."""
    entries = _selected(runs, patterns)
    chosen = pick_metrics([rec for _, rec in entries], metrics)
    order, of_run, how = revisions.ordered(runs)
    keys = _join_keys(entries)
    cells: dict[tuple, dict[str, list[tuple[float, list[float]]]]] = {}
    found_units: dict[tuple, str | None] = {}
    for run, rec in entries:
        base = _series_key(run, rec, keys)
        for metric in chosen:
            value = rec["metrics"].get(metric)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            samples = [x for x in rec.get("samples", {}).get(metric, []) if x is not None]
            cells.setdefault((*base, metric), {}).setdefault(of_run[run.label].label, []).append((value, samples))
            found_units.setdefault((*base, metric), (rec.get("units") or {}).get(metric))
    labels = [r.label for r in order]
    series = [_series(key, per_rev, labels, found_units[key], threshold_pct) for key, per_rev in cells.items()]
    series.sort(key=lambda s: (str(s.gpu), s.bench, chosen.index(s.metric), _sort_params(s.params)))
    members: dict[str, list[str]] = {}
    for run in runs:
        members.setdefault(of_run[run.label].label, []).append(run.label)
    return History(labels, how, series, threshold_pct, members)


def _sort_params(params: dict[str, Any]) -> tuple:
    return tuple((0, float(v), "") if _numeric(v) else (1, 0.0, str(v)) for v in params.values())


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _series(key: tuple, per_rev: dict, labels: list[str], unit: str | None, threshold_pct: float) -> Series:
    gpu, bench, params, metric = key
    points = [_point(label, per_rev[label]) for label in labels if label in per_rev]
    direction = units.direction(unit)
    judged = points[:1] + [judge(a, b, direction, threshold_pct) for a, b in zip(points, points[1:])]
    return Series(gpu, bench, dict(params), metric, unit, judged)


def require_gates_judgeable(history: History, gates: Sequence[tuple[str, float]]) -> None:
    """Each --fail-on metric has some series with a point at the latest revision and one before it: a gate
    that can judge nothing is a usage error, not a pass."""
    latest = history.revisions[-1] if history.revisions else None
    for name, _ in gates:
        if not any(s.metric == name and len(s.points) > 1 and s.points[-1].revision == latest for s in history.series):
            raise QbenchUsageError(f"--fail-on {name}: no case has it both at the latest revision ({latest}) and "
                                   "at one before it; give runs of at least two commits")


def regressions(history: History, gates: Sequence[tuple[str, float]]) -> list[tuple[Series, Point]]:
    """--fail-on: series of a gated metric whose point at the latest revision is worse ('+') than the point
    before it by more than the gate's percentage."""
    hits = []
    latest = history.revisions[-1] if history.revisions else None
    for s in history.series:
        last = s.points[-1] if len(s.points) > 1 and s.points[-1].revision == latest else None
        for name, pct in gates:
            if last is not None and s.metric == name and last.marker == "+" and abs(last.step_pct or 0) > pct:
                hits.append((s, last))
    return hits
