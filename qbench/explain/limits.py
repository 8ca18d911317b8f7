"""The binding limit of one record, for the tables that show a record per cell (summary, the bench tables):
compute, memory, launch, host, link, or power where a compute-bound record's clock was held down by the
board's power limit.

    limit_of = limiter(env)          # once per run: the calibration of the run's GPU
    limit_of(record)                 # 'compute', 'host', ... ('' for a record the model does not predict)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from qbench.explain import predictions, rates
from qbench.model.predict import Rates
from qbench.telemetry import POWER_CAPPED

# the metric whose limit stands for the record: its whole step, else its kernels' sum
MAIN = ("step_ms", "kernels_ms", "forward_ms")


def limit(record: Mapping, calibration: Rates) -> str:
    found = predictions(record, calibration)
    main = next((found[m] for m in MAIN if m in found), None)
    if main is None and found:
        main = max(found.values(), key=lambda p: p.ms)
    if main is None:
        return ""
    reasons = record.get("metrics", {}).get("throttle_reasons")
    if main.limit == "compute" and isinstance(reasons, int) and reasons & POWER_CAPPED:
        return "power"
    return main.limit


def limiter(env: Mapping, calibrated: str | None = None) -> Callable[[Mapping], str]:
    """limit_of(record) for the records of one run (its env block names the GPU whose calibration applies)."""
    calibration, _ = rates.for_run(dict(env), calibrated)
    return lambda record: limit(record, calibration)
