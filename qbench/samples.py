"""The samples of one timed region and their statistics: percentiles, medians, drift.

qbench.timing (the one timer) returns a Timing; the tables, spreads and run groups take percentiles of
stored samples with the same percentile function, so a median means one thing everywhere. No clock
here. All values are milliseconds where they are times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def percentile(values: list[float] | tuple[float, ...], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    """Samples of one timed region (ms) and their summary statistics."""

    samples_ms: tuple[float, ...]
    device: str = "cpu"

    @property
    def median(self) -> float:
        return percentile(self.samples_ms, 50)

    @property
    def p20(self) -> float:
        return percentile(self.samples_ms, 20)

    @property
    def p80(self) -> float:
        return percentile(self.samples_ms, 80)

    @property
    def mean(self) -> float:
        return sum(self.samples_ms) / len(self.samples_ms) if self.samples_ms else math.nan

    @property
    def min(self) -> float:
        return min(self.samples_ms) if self.samples_ms else math.nan

    def summary(self) -> dict[str, float]:
        return {"median": self.median, "p20": self.p20, "p80": self.p80, "mean": self.mean, "min": self.min}


# Drift: a step that slows down while it is timed (thermal throttling, a diverging layer, a leak)
# measured something other than the configuration; the median would hide it.
DRIFT_LIMIT = 0.20  # the last tenth of the timed steps more than 20% slower than the first tenth
DRIFT_MIN_SAMPLES = 20  # fewer samples make a tenth one sample: noise, not drift, would decide


def drift(samples_ms: list[float] | tuple[float, ...]) -> float | None:
    """Relative slow-down of the last tenth of the samples over the first tenth (their medians):
    0.25 means 25% slower at the end. None with fewer than DRIFT_MIN_SAMPLES samples."""
    n = len(samples_ms)
    if n < DRIFT_MIN_SAMPLES:
        return None
    tenth = n // 10
    first, last = percentile(samples_ms[:tenth], 50), percentile(samples_ms[-tenth:], 50)
    return last / first - 1.0 if first > 0 else None


def drift_error(samples_ms: list[float] | tuple[float, ...], limit: float = DRIFT_LIMIT) -> str | None:
    """The error text of a run whose step time drifted beyond `limit` (None: no drift, or too few samples)."""
    value = drift(samples_ms)
    if value is None or value <= limit:
        return None
    return (f"step time drifted: the last tenth of the {len(samples_ms)} timed steps is {value:.0%} slower than "
            f"the first tenth (limit {limit:.0%})")
