"""Bencher Metric Format: {benchmark name: {measure: {value, lower_value, upper_value}}}.

One benchmark per record, named `<bench>/<case>`; one measure per metric, named as the metric (Bencher makes a
measure for a name it does not know), in the metric's own unit. value is the stored value; lower_value and
upper_value are p20 and p80 of the stored samples, widened to hold the value where it lies outside them (a
switchback total, a sum of medians; Bencher reads the bounds as an interval around the value), and left out
for a metric stored without samples.
"""

from __future__ import annotations

from typing import Any

from qbench.exporters.rows import ok_rows
from qbench.samples import percentile


def document(frame, envs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, dict[str, Any]] = {}
    for row in ok_rows(frame):
        measure: dict[str, float] = {"value": row.value}
        if len(row.samples) > 1:
            measure.update(lower_value=min(percentile(row.samples, 20), row.value),
                           upper_value=max(percentile(row.samples, 80), row.value))
        out.setdefault(f"{row.bench}/{row.case}", {})[row.metric] = measure
    return out
