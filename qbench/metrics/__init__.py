"""The metrics qbench's benches record, each declared once with its unit (and so its better direction),
and the record fields that say how a measurement was taken.

A record is tidy: what was measured is its metric's name (`step_ms`, `host_ms`, `fwd_ms`, `speedup`,
`tflops`), and how it was measured lives in its params, never in the metric name:
  exec      the execution mode (qbench.modes.EXECS: eager, compile, graph)
  variant   the implementation measured (each family module's VARIANTS)
  timing    how the times were taken (TIMINGS below)
Each family declares its metrics in a module of this package (`Metric(name, unit, what)`); writing a
record of a family with an undeclared metric is an error (`UndeclaredMetric`), never a guessed unit.
Benches that qbench only imports (tritonbench, nvbench files) keep the units their files declare.
The families' declarations are read through qbench.metrics.registry (this module imports none of them, so a
family's module imports Metric from here without an import loop).
"""

from __future__ import annotations

from dataclasses import dataclass

FIELDS = ("exec", "variant", "timing")  # the params a tidy split adds to a family's own params

# How a time was taken; no metric name contains one of these (tests/test_layout.py).
TIMINGS = {
    "per_kernel": "each kernel timed alone, the GPU idle in between (the bitsandbytes method); a step's "
                  "time is the sum of its kernels' medians",
    "per_step": "each whole step timed alone, starting on an idle device",
    "loop": "steps issued back to back in blocks, as a training loop runs them (a host faster than the "
            "GPU stays hidden)",
}


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # a qbench.units constant; its direction says whether lower or higher is better
    what: str  # what is measured, with its shape and units where they matter


class UndeclaredMetric(ValueError):
    """A bench recorded a metric its family does not declare."""
