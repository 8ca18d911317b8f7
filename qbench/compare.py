"""Compare runs: join records, ratios, significance, geometric mean, regression gate.

The first run is the reference. Records are joined on (bench, params): on the parameters the runs
have in common (so an imported seed, which knows fewer parameters, still joins with a qbench run),
normalized by qbench.join (a missing `exec` is eager, `float16` is fp16). `--across PARAM` compares
within runs instead: the records with one value of PARAM are the reference, each other value a
candidate, joined on the remaining parameters (across_param). For every metric in
both records: ratio = candidate / reference, signed % change, and whether that is better or worse
by the unit's declared direction (qbench.units). With >= 2 samples on both sides a two-sided
Mann-Whitney U test decides whether a change beyond the noise threshold is significant.

Markers: '+' worse, '-' better, '~' beyond the threshold but not significant (with --group: or the sides' runs
overlap), '=' within the threshold, 'x' not comparable, '!' newly failing, '*' fixed, 'n/a' missing on one side.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qbench import join, metric_names, store, units
from qbench.env import COMPARABILITY_KEYS
from qbench.errors import QbenchUsageError

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
    pattern: str | None = None
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
    target = Path(path)
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


def _selected(rows: list[Row], pattern: str | None) -> list[Row]:
    """The rows whose 'bench/case metric' matches -k (all without it)."""
    if not pattern:
        return rows
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise QbenchUsageError(f"-k {pattern!r} is not a valid regular expression ({exc})") from None
    return [r for r in rows if regex.search(f"{r.bench}/{r.case} {r.metric}")]


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
    selected = _selected(rows, options.pattern)  # -k narrows the geometric means and counts too
    comparison = Comparison(rows, warnings, _geomeans(selected), _counts(selected), unfiltered=rows)
    comparison.rows = _filter_and_sort(selected, options)
    return comparison


def across_param(runs: Sequence[Run], spec: str, cross_env: bool = False) -> list[Run]:
    """`--across PARAM[=REF]`: the records of these runs as one Run per value of PARAM, the reference
    first: REF, else the value runs made before PARAM existed had (exec: eager), else the first value
    seen. compare_runs then joins them on the remaining parameters. Where several runs hold records of
    one value (repeats of one command), they merge as --group merges repeated runs (merge_runs: each
    metric the median of the runs' values, samples pooled, a change counted only where the two sides'
    runs do not overlap); a value that one run alone holds keeps that run's records."""
    param, _, ref = (part.strip() for part in spec.partition("="))
    gpus = {run.env.get("gpu_name") or None for run in runs}
    if len(gpus) > 1 and not cross_env:  # pooled records would hide which GPU measured which value
        raise QbenchUsageError(f"--across pools runs from different GPUs ({gpus}); pass --cross-env to pool them")
    groups = join.split_by([rec for run in runs for rec in run.records], param)
    if not groups:
        raise QbenchUsageError(f"--across {param}: no record of these runs has a parameter {param!r}")
    if ref:
        ref = join.param_key(param, ref)
    else:
        default = join.PARAM_DEFAULTS.get(param)
        ref = default if default in groups else next(iter(groups))
    if ref not in groups:
        raise QbenchUsageError(f"--across {spec}: no record has {param}={ref} (values: {', '.join(groups)})")
    if len(groups) < 2:
        raise QbenchUsageError(f"--across {param}: every record has {param}={ref}; nothing to put beside it")
    tied = join.tied_params(groups)  # they label the groups instead of splitting the join
    per_run = [join.split_by(run.records, param) for run in runs]
    runs_out = []
    for value in [ref, *(v for v in groups if v != ref)]:
        holders = [Run(run.label, run.env, [join.without(rec, tied) for rec in split[value]])
                   for run, split in zip(runs, per_run) if split.get(value)]
        merged = holders[0] if len(holders) == 1 else merge_runs(holders, option="--across")
        label = ", ".join(f"{k}={join.join_params(groups[value][0]['params']).get(k)}" for k in tied)
        runs_out.append(Run(f"{param}={value}" + (f" ({label})" if label else ""), runs[0].env, merged.records))
    return runs_out


def group_runs(runs: Sequence[Run], size: int) -> list[Run]:
    """`--group N`: RUNS in groups of `size` consecutive runs (the repeated runs of one side of an A/B), each
    group merged into one Run (merge_runs); the first group is the reference."""
    if size < 1 or len(runs) % size or len(runs) // size < 2:
        raise QbenchUsageError(f"--group {size}: {len(runs)} runs do not split into two or more groups of {size} "
                               "consecutive runs (give the reference's runs first, then each candidate's)")
    return [merge_runs(runs[i:i + size]) for i in range(0, len(runs), size)]


def merge_runs(runs: Sequence[Run], option: str = "--group") -> Run:
    """Repeated runs of one command as one Run: per configuration (joined as compare joins) each metric is
    the median over the runs of their values, as `summary --across-runs median` prints it (the runs' own
    values kept as `run_values`), and the samples of every run are pooled for the U test; a change counts
    (+ or -) only where the two sides' runs do not overlap (_runs_overlap). A configuration some run of the
    group lacks is left out (it then shows as missing on this side)."""
    gpus = {run.env.get("gpu_name") or None for run in runs}
    if len(gpus) > 1:
        names = ", ".join(run.label for run in runs)
        raise QbenchUsageError(f"{option}: the runs {names} come from different GPUs ({gpus})")
    records = []
    for bench in sorted({rec["bench"] for run in runs for rec in run.records}):
        keys = join.join_keys([run.records for run in runs], bench)
        indexes = [join.index(run.records, bench, keys) for run in runs]
        for key in indexes[0]:
            group = [index.get(key) for index in indexes]
            if all(rec is not None for rec in group):
                records.append(_merged_record(group))
    return Run(_group_label([run.label for run in runs]), runs[0].env, records)


def _group_label(labels: Sequence[str]) -> str:
    """dir/new1, dir/new2, dir/new3 -> dir/new{1,2,3}: the runs of a group as the shell would expand them."""
    if len(labels) == 1:
        return labels[0]
    prefix = os.path.commonprefix(list(labels))
    return f"{prefix}{{{','.join(label[len(prefix):] for label in labels)}}}"


def _merged_record(group: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's records of several runs as one: a failed one as it is, else the first with each
    metric that every run has a number for replaced by the runs' median, and their samples pooled."""
    from qbench.timing import percentile

    failed = next((rec for rec in group if rec.get("status", "ok") != "ok"), None)
    if failed is not None:
        return failed
    metrics, samples, run_values = {}, {}, {}
    for name in group[0].get("metrics", {}):
        values = [rec.get("metrics", {}).get(name) for rec in group]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            metrics[name], run_values[name] = percentile(values, 50), values
            pooled = [x for rec in group for x in rec.get("samples", {}).get(name, [])]
            if pooled:
                samples[name] = pooled
    return {**group[0], "metrics": metrics, "samples": samples, "run_values": run_values}


def _mark_cross_env(rows: list[Row], allowed: bool) -> None:
    for row in rows:
        if row.marker in ("n/a", "!", "*"):
            continue
        if allowed:
            row.note = (row.note + "; " if row.note else "") + "different hardware (--cross-env)"
        else:
            row.marker, row.note = "x", "different hardware (pass --cross-env to compare anyway)"


def parse_threshold(text: str, given_as: str | None = None) -> float:
    """'5%' or '5' -> 5.0 (percent). given_as: how the user wrote it, for the message (default --threshold)."""
    where = given_as or f"--threshold {text!r}"
    try:
        value = float(str(text).strip().rstrip("%"))
    except ValueError:
        raise QbenchUsageError(f"{where}: {text!r} is not a percentage; write e.g. 5 or 5%") from None
    if not 0 <= value < float("inf"):  # NaN fails both comparisons
        raise QbenchUsageError(f"{where}: the percentage must be a finite number >= 0")
    return value


def parse_fail_on(items: Sequence[str]) -> list[tuple[str, float]]:
    """['time_global:5'] -> [('time_global', 5.0)]."""
    gates = []
    for item in items:
        name, sep, pct = str(item).rpartition(":")
        if not sep or not name:
            raise QbenchUsageError(f"--fail-on {item!r} must be METRIC:PCT, e.g. --fail-on time_global:5")
        gates.append((name, parse_threshold(pct, f"--fail-on {item!r}")))
    return gates


def require_metrics(runs: Sequence[Run], metrics: Sequence[str], gates: Sequence[tuple[str, float]]) -> None:
    """--metric and --fail-on name metrics some record has: a misspelt name would select nothing and
    a gate on it would always pass."""
    known = metric_names.of(rec for run in runs for rec in run.records)
    asked = [("--metric", name) for name in metrics] + [("--fail-on", name) for name, _ in gates]
    for flag, name in asked:
        if name not in known:
            raise QbenchUsageError(f"{flag} {name}: no record of these runs has this metric "
                                   f"(they have: {metric_names.listed(known)})")


def require_gates_evaluable(comparison: Comparison, gates: Sequence[tuple[str, float]]) -> None:
    """Each --fail-on metric is compared (=, +, -, ~) on at least one case: a gate that can judge
    nothing (the metric is on one side only, or every row is 'x') is a usage error, not a pass."""
    for name, _ in gates:
        rows = [r for r in comparison.unfiltered if r.metric == name]
        if not any(r.marker in ("=", "+", "-", "~") for r in rows):
            why = rows[0].note if rows else "no case has it in both the reference and a candidate"
            raise QbenchUsageError(f"--fail-on {name}: no case can be compared on it: {why}")


def missing_cases(comparison: Comparison) -> list[Row]:
    """Cases the reference has and a candidate lacks (they fail a gate unless --allow-missing)."""
    return [r for r in comparison.rows if r.marker == "n/a" and r.note == MISSING_IN_CANDIDATE]


def regressions(comparison: Comparison, gates: Sequence[tuple[str, float]]) -> list[Row]:
    """Rows that break a --fail-on gate: the metric got worse by more than PCT (and the change is not
    marked '~', i.e. not shown to be noise), or its configuration newly fails."""
    hits: list[Row] = []
    if not gates:
        return hits
    for row in comparison.rows:
        if row.marker == "!":
            hits.append(row)
            continue
        for name, pct in gates:
            if row.metric == name and row.marker == "+" and abs(row.change_pct or 0.0) > pct:
                hits.append(row)
    return hits


def gate_failures(comparison: Comparison, gates: Sequence[tuple[str, float]], allow_missing: bool) -> list[str]:
    """One line per reason the --fail-on gate fails; empty when it passes (or no gate is set)."""
    lines = []
    if hits := regressions(comparison, gates):
        lines.append("regression beyond --fail-on: " + ", ".join(sorted({f"{h.metric} ({h.case})" for h in hits})[:5]))
    missing = missing_cases(comparison) if gates and not allow_missing else []
    if missing:
        names = ", ".join(sorted({r.case for r in missing})[:5])
        lines.append(f"{len(missing)} reference cases missing in a candidate ({names}); --allow-missing accepts that")
    return lines
