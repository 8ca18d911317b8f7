"""The regression gate of `qbench compare`: --threshold and --fail-on METRIC:PCT parsed, the metrics
they name checked against the runs (a misspelt one is a usage error, not a pass), and the reasons a
comparison fails the gate (a gated metric worse beyond PCT, a configuration newly failing, a reference
case missing in a candidate unless --allow-missing).
"""

from __future__ import annotations

from collections.abc import Sequence

from qbench import metric_names
from qbench.analysis.compare import MISSING_IN_CANDIDATE, Comparison, Row, Run
from qbench.errors import QbenchUsageError
from qbench.report import counted


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
    """['kernels_ms:5'] -> [('kernels_ms', 5.0)]."""
    gates = []
    for item in items:
        name, sep, pct = str(item).rpartition(":")
        if not sep or not name:
            raise QbenchUsageError(f"--fail-on {item!r} must be METRIC:PCT, e.g. --fail-on kernels_ms:5")
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
        missing_text = counted(len(missing), "reference case")
        lines.append(f"{missing_text} missing in a candidate ({names}); --allow-missing accepts that")
    return lines
