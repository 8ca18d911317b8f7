"""Compare runs: join records, ratios, significance, geometric mean (the regression gate on the result:
qbench.analysis.compare_gate; repeated runs merged and --across splits: qbench.analysis.run_groups).

The first run is the reference. Records are joined on (bench, params): on the parameters the runs
have in common (so an imported seed, which knows fewer parameters, still joins with a qbench run),
normalized by qbench.analysis.join (a missing `exec` is eager, `float16` is fp16). `--across PARAM` compares
within runs instead: the records with one value of PARAM are the reference, each other value a
candidate, joined on the remaining parameters (qbench.analysis.run_groups.across_param). For every metric in
both records: ratio = candidate / reference, signed % change, and whether that is better or worse
by the unit's declared direction (qbench.units). With >= 2 samples on both sides a two-sided
Mann-Whitney U test decides whether a change beyond the noise threshold is significant.

Markers: '+' worse, '-' better, '~' beyond the threshold but not significant (with --group: or the sides' runs
overlap), '=' within the threshold, 'x' not comparable, '!' newly failing, '*' fixed, 'n/a' missing on one side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qbench import store, units
from qbench.analysis import join
from qbench.analysis import patterns as match
from qbench.env import COMPARABILITY_KEYS
from qbench.errors import QbenchUsageError
from qbench.paths import check_name

ALPHA = 0.05  # significance level of the U test
FEW_SAMPLES = 9  # below this many samples per side the U test has little power: say so
MISSING_IN_CANDIDATE = "missing in candidate"  # the note of an 'n/a' row; such rows fail a gate
MISSING_IN_REFERENCE = "missing in reference"


@dataclass(frozen=True)
class Run:
    label: str
    env: dict[str, Any]
    records: list[dict[str, Any]]


@dataclass
class Row:
    bench: str
    case: str
    metric: str
    unit: str | None
    candidate: str
    reference_value: float | None
    candidate_value: float | None
    ratio: float | None = None
    change_pct: float | None = None
    p_value: float | None = None
    marker: str = "="
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CompareOptions:
    metrics: tuple[str, ...] = ()
    threshold_pct: float = 5.0
    patterns: tuple[str, ...] = ()  # -k: a row is kept where every regex matches its 'bench/case metric'
    cross_env: bool = False
    only_changed: bool = False
    sort: str = "name"
    alpha: float = ALPHA


@dataclass
class Comparison:
    rows: list[Row]
    env_warnings: list[str] = field(default_factory=list)
    geomeans: dict[tuple[str, str], float] = field(default_factory=dict)  # (candidate, metric) -> ratio
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # candidate -> marker -> n
    unfiltered: list[Row] = field(default_factory=list)  # every row before -k / --only-changed
    reference: str = "reference"  # how tables name the reference (--across names its value)


def load_any(path: str | Path) -> Run:
    """A qbench run directory, or a file in a seed format (imported on the fly); a run without
    records is a usage error (it would compare as "nothing changed")."""
    target = check_name(path, "run", "give a run directory or a results file")
    if target.is_file():
        from qbench.importers import load_any as import_file

        env, records = import_file(target)
        return Run(str(target), env, records)
    env, records = store.load_run(target)
    if not records:
        raise QbenchUsageError(f"{target} is an empty run (no records in {store.RECORDS_FILE}); rerun it or drop it")
    return Run(str(target), env, records)


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value, or None when either side has fewer than 2 samples."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import mannwhitneyu

    if len(set(a) | set(b)) == 1:
        return 1.0  # all samples equal: no evidence of a difference (scipy would warn)
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def env_differences(reference: Run, candidate: Run) -> list[str]:
    """Environment keys that differ (GPU, driver, torch, triton, CUDA, dtype), as readable lines."""
    lines = []
    for key in (*COMPARABILITY_KEYS, "dtype"):
        a, b = _env_value(reference, key), _env_value(candidate, key)
        if a != b and not (a is None and b is None):
            lines.append(f"{candidate.label} vs {reference.label}: {key} {a!r} -> {b!r}")
    return lines


def _env_value(run: Run, key: str) -> Any:
    if key != "dtype":
        return run.env.get(key)
    params = (join.join_params(r.get("params", {})) for r in run.records)
    dtypes = sorted({str(p["dtype"]) for p in params if "dtype" in p})  # float16 and fp16 are one dtype
    return ",".join(dtypes) or None


def _hardware_differs(reference: Run, candidate: Run) -> bool:
    a, b = reference.env.get("gpu_name"), candidate.env.get("gpu_name")
    return (a or None) != (b or None)


def _verdict(row: Row, direction: int, options: CompareOptions, runs_overlap: bool = False) -> None:
    """Fill ratio, change, p-value and marker of a row whose two values are both present. runs_overlap
    (--group, _runs_overlap): a change beyond the threshold is not significant, whatever the U test says."""
    ref, cand = row.reference_value, row.candidate_value
    if ref is None or cand is None or ref == 0 or direction == 0:
        row.marker = "x"
        row.note = "no better/worse for this unit" if direction == 0 else "missing or zero value"
        if ref not in (None, 0) and cand is not None:
            row.ratio, row.change_pct = cand / ref, 100.0 * (cand - ref) / abs(ref)
        return
    row.ratio = cand / ref
    row.change_pct = 100.0 * (cand - ref) / abs(ref)
    if abs(row.change_pct) <= options.threshold_pct:
        row.marker = "="
        return
    worse = (row.change_pct > 0) == (direction < 0)
    significant = (row.p_value is None or row.p_value < options.alpha) and not runs_overlap
    row.marker = ("+" if worse else "-") if significant else "~"
    if runs_overlap:
        row.note = "the sides' runs overlap"
    elif row.p_value is None:
        row.note = "no samples to test"


def _compare_records(ref_rec, cand_rec, metric: str, candidate: str, options: CompareOptions) -> Row:
    unit = (ref_rec.get("units", {}) or {}).get(metric) or (cand_rec.get("units", {}) or {}).get(metric)
    cand_unit = (cand_rec.get("units", {}) or {}).get(metric)
    row = Row(
        bench=ref_rec["bench"],
        case=ref_rec["case"],
        metric=metric,
        unit=unit,
        candidate=candidate,
        reference_value=ref_rec["metrics"].get(metric),
        candidate_value=cand_rec["metrics"].get(metric),
    )
    a = ref_rec.get("samples", {}).get(metric, [])
    b = cand_rec.get("samples", {}).get(metric, [])
    row.p_value = mann_whitney_p(a, b)
    if row.p_value is not None and min(len(a), len(b)) < FEW_SAMPLES:
        row.note = "few samples"
    if cand_unit and unit and cand_unit != unit:
        row.marker, row.note = "x", f"units differ: {unit} vs {cand_unit}"
        return row
    _verdict(row, units.direction(unit), options, _runs_overlap(ref_rec, cand_rec, metric))
    return row


def _runs_overlap(ref_rec, cand_rec, metric: str) -> bool:
    """--group: whether some run of one side lies within the other side's runs for this metric. Pooled
    samples test the spread within runs; between runs a host or a GPU can drift further (one H200, an A/B of
    three runs a side: nn.Linear, the same code on both sides, -16.6% in its eager forward + backward with
    U-test p = 1.29e-16; results/fragmented-h200-low-rank-ab), so a change counts only when every run of the
    candidate lies beyond every run of the reference."""
    a = (ref_rec.get("run_values") or {}).get(metric)
    b = (cand_rec.get("run_values") or {}).get(metric)
    if not a or not b:
        return False
    return not (max(a) < min(b) or max(b) < min(a))


def _status_row(ref_rec, cand_rec, candidate: str) -> Row | None:
    """'!' newly failing, '*' fixed, 'x' failing on both sides; None when both are ok."""
    a, b = ref_rec.get("status", "ok"), cand_rec.get("status", "ok")
    if a == "ok" and b == "ok":
        return None
    marker = "!" if a == "ok" else "*" if b == "ok" else "x"
    note = (cand_rec.get("error") if b != "ok" else ref_rec.get("error")) or f"{a} -> {b}"
    return Row(ref_rec["bench"], ref_rec["case"], "status", None, candidate, None, None, marker=marker, note=note)


def _metrics_of(ref_rec, cand_rec, wanted: tuple[str, ...]) -> list[str]:
    names = [m for m in ref_rec.get("metrics", {}) if m in cand_rec.get("metrics", {})]
    return [m for m in names if m in wanted] if wanted else names


def _missing_row(record: dict[str, Any], candidate: str, note: str) -> Row:
    """An 'n/a' row: the configuration exists on one side only."""
    return Row(record["bench"], record["case"], "*", None, candidate, None, None, marker="n/a", note=note)


def _pair_rows(reference: Run, candidate: Run, options: CompareOptions) -> list[Row]:
    ref_benches, cand_benches = {r["bench"] for r in reference.records}, {r["bench"] for r in candidate.records}
    one_sided = ref_benches ^ cand_benches  # a bench one side lacks entirely: each of its cases is missing there
    label = candidate.label
    rows = [_missing_row(r, label, MISSING_IN_CANDIDATE) for r in reference.records if r["bench"] in one_sided]
    rows += [_missing_row(r, label, MISSING_IN_REFERENCE) for r in candidate.records if r["bench"] in one_sided]
    for bench in sorted(ref_benches & cand_benches):
        keys = join.join_keys([reference.records, candidate.records], bench)
        ref_index, cand_index = join.index(reference.records, bench, keys), join.index(candidate.records, bench, keys)
        for key, ref_rec in ref_index.items():
            cand_rec = cand_index.get(key)
            if cand_rec is None:
                rows.append(_missing_row(ref_rec, candidate.label, MISSING_IN_CANDIDATE))
                continue
            status = _status_row(ref_rec, cand_rec, candidate.label)
            if status is not None:
                rows.append(status)
                continue
            rows.extend(
                _compare_records(ref_rec, cand_rec, m, candidate.label, options)
                for m in _metrics_of(ref_rec, cand_rec, options.metrics)
            )
        rows.extend(
            _missing_row(cand_index[k], candidate.label, MISSING_IN_REFERENCE)
            for k in cand_index.keys() - ref_index.keys()
        )
    return rows


def geometric_mean(values: Sequence[float]) -> float | None:
    positive = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not positive:
        return None
    return math.exp(sum(math.log(v) for v in positive) / len(positive))


def _geomeans(rows: list[Row]) -> dict[tuple[str, str], float]:
    grouped: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row.ratio is not None and row.marker in "=+-~":
            grouped.setdefault((row.candidate, row.metric), []).append(row.ratio)
    return {key: gm for key, values in grouped.items() if (gm := geometric_mean(values)) is not None}


def _counts(rows: list[Row]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        per = counts.setdefault(row.candidate, {})
        per[row.marker] = per.get(row.marker, 0) + 1
    return counts


def _selected(rows: list[Row], patterns: Sequence[str]) -> list[Row]:
    """The rows whose 'bench/case metric' every -k matches (all without one)."""
    keep = match.matcher(patterns)
    return [r for r in rows if keep(f"{r.bench}/{r.case} {r.metric}")]


def _filter_and_sort(rows: list[Row], options: CompareOptions) -> list[Row]:
    """-k's rows (already selected), without the unchanged ones under --only-changed, in --sort order."""
    if options.only_changed:
        rows = [r for r in rows if r.marker != "="]
    if options.sort == "ratio":
        return sorted(rows, key=lambda r: (r.candidate, -abs(math.log(r.ratio)) if r.ratio and r.ratio > 0 else 0))
    return sorted(rows, key=lambda r: (r.candidate, r.bench, r.case, r.metric))


def _benches_apart(reference: Run, candidate: Run) -> str:
    """'' or, where the two runs hold no bench in common, what each holds (for the no-common-case message)."""
    ref, cand = ({r["bench"] for r in run.records} for run in (reference, candidate))
    if not ref or not cand or ref & cand:
        return ""
    return f" (benches {', '.join(sorted(cand))} against {', '.join(sorted(ref))})"


def compare_runs(runs: Sequence[Run], options: CompareOptions) -> Comparison:
    """Compare every run after the first against the first."""
    if len(runs) < 2:
        raise QbenchUsageError("compare needs at least two runs: the reference first, then the candidates")
    reference, rows, warnings = runs[0], [], []
    for candidate in runs[1:]:
        warnings.extend(env_differences(reference, candidate))
        pair = _pair_rows(reference, candidate, options)
        if not any(r.marker != "n/a" for r in pair):
            raise QbenchUsageError(f"{candidate.label} and {reference.label} have no case in common"
                                   + _benches_apart(reference, candidate))
        if _hardware_differs(reference, candidate):
            _mark_cross_env(pair, options.cross_env)
        rows.extend(pair)
    selected = _selected(rows, options.patterns)  # -k narrows the geometric means and counts too
    comparison = Comparison(rows, warnings, _geomeans(selected), _counts(selected), unfiltered=rows)
    comparison.rows = _filter_and_sort(selected, options)
    return comparison







def _mark_cross_env(rows: list[Row], allowed: bool) -> None:
    for row in rows:
        if row.marker in ("n/a", "!", "*"):
            continue
        if allowed:
            row.note = (row.note + "; " if row.note else "") + "different hardware (--cross-env)"
        else:
            row.marker, row.note = "x", "different hardware (pass --cross-env to compare anyway)"
