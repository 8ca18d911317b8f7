"""`qbench summary --target METRIC:LO..HI`: whether each cell of a metric meets a target, judged on the
value as printed (a target is met or missed by the printed value, never by unrounded digits or by
rounding it up), and how many cells do. Either bound may be left out: `fwd_bwd_ms:..1.3` is "at most
1.3", `step_speedup:1.15..` "at least 1.15", `step_over_kernels:0.95..1.05` a band."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qbench import report
from qbench.errors import QbenchUsageError


@dataclass(frozen=True)
class Target:
    metric: str
    low: float | None
    high: float | None

    def text(self) -> str:
        if self.low is None:
            return f"{self.metric} <= {self.high:g}"
        if self.high is None:
            return f"{self.metric} >= {self.low:g}"
        return f"{self.metric} in [{self.low:g}, {self.high:g}]"

    def met(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


def parse(spec: str) -> Target:
    """'M:LO..HI' (either bound optional) -> Target."""
    metric, sep, band = (part.strip() for part in spec.rpartition(":"))
    low_text, dots, high_text = (part.strip() for part in band.partition(".."))
    if not sep or not metric or not dots or not (low_text or high_text):
        raise QbenchUsageError(f"--target {spec!r} must be METRIC:LO..HI, METRIC:..HI or METRIC:LO.., "
                               "e.g. --target fwd_bwd_ms:..1.3")
    try:
        low, high = (float(t) if t else None for t in (low_text, high_text))
    except ValueError:
        raise QbenchUsageError(f"--target {spec!r}: the bounds must be numbers") from None
    if any(b is not None and not math.isfinite(b) for b in (low, high)) or (
            low is not None and high is not None and low > high):
        raise QbenchUsageError(f"--target {spec!r}: the bounds must be finite, the lower one first")
    return Target(metric, low, high)


def check(targets: list[Target], cells: dict[str, list[tuple[str, float]]], digits: int) -> list[dict[str, Any]]:
    """Per target: {'target', 'cells', 'met', 'missed': [(case text, printed value)]}. cells: metric ->
    (case text, value) of every cell of that metric that has a value (the metrics shown)."""
    results = []
    for target in targets:
        if target.metric not in cells:
            raise QbenchUsageError(f"--target {target.metric}: not among the metrics shown; add --metric "
                                   f"{target.metric}")
        missed = []
        for case, value in cells[target.metric]:
            printed = report.format_sig(value, digits)
            if not target.met(float(printed)):
                missed.append((case or "the one case", printed))
        results.append({"target": target.text(), "cells": len(cells[target.metric]),
                        "met": len(cells[target.metric]) - len(missed), "missed": missed})
    return results


def lines(results: list[dict[str, Any]]) -> list[str]:
    """One line per target: how many cells meet it, and the ones that miss it."""
    out = []
    for r in results:
        missed = "; ".join(f"{case}: {value}" for case, value in r["missed"])
        out.append(f"target {r['target']}: {r['met']} of {r['cells']} cells met"
                   + (f"; missed: {missed}" if missed else ""))
    return out
