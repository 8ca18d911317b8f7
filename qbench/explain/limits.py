"""The binding limit of one record, or of one metric of it, for the tables that show a record per cell (summary,
the bench tables): compute, memory, launch, host, link, or power where a compute-bound prediction's clock was held
down by the board's power limit.

    limit_of = limiter(env)          # once per run: the calibration of the run's GPU
    limit_of(record)                 # 'compute', 'host', ... ('' for a record the model does not predict)
    limit_of(record, "fwd_ms")       # the limit of that metric's prediction ('' where it has none)

    run = for_run(env)               # the same, for a run that may have no calibration (a CPU run): never raises
    run.missing                      # why no limit shows ('' where a calibration applies)
    run.per_metric(record)           # {metric: limit} of every metric the model predicts
    run.predicted(record)            # {metric: predicted ms} of the same metrics
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from qbench.errors import QbenchUsageError
from qbench.explain import predictions, rates
from qbench.model.predict import Prediction, Rates
from qbench.telemetry import POWER_CAPPED

# the metric whose limit stands for the record: its whole step, else its kernels' sum
MAIN = ("step_ms", "kernels_ms", "forward_ms")


def _power_capped(record: Mapping) -> bool:
    reasons = record.get("metrics", {}).get("throttle_reasons")
    return isinstance(reasons, int) and not isinstance(reasons, bool) and bool(reasons & POWER_CAPPED)


def _named(prediction: Prediction, capped: bool) -> str:
    """A prediction's limit; 'power' for a compute-bound one whose record's clock the power cap held down."""
    return "power" if capped and prediction.limit == "compute" else prediction.limit


def _main(found: Mapping[str, Prediction]) -> str | None:
    """The metric whose limit stands for the record: the first of MAIN it has, else its longest prediction."""
    main = next((m for m in MAIN if m in found), None)
    return main or max(found, key=lambda m: found[m].ms, default=None)


def limit(record: Mapping, calibration: Rates, metric: str | None = None) -> str:
    """The limit binding the model's prediction of `metric` of the record (None: of the record, its main
    metric's); '' where the model does not predict it."""
    found = predictions(record, calibration)
    name = _main(found) if metric is None else metric
    return _named(found[name], _power_capped(record)) if name in found else ""


def metric_limits(record: Mapping, calibration: Rates) -> dict[str, str]:
    """{metric: limit} of every metric the model predicts for the record ({} for one it does not predict)."""
    capped = _power_capped(record)
    return {m: _named(p, capped) for m, p in predictions(record, calibration).items()}


def limiter(env: Mapping, calibrated: str | None = None) -> Callable[..., str]:
    """limit_of(record, metric=None) for the records of one run (its env block names the GPU whose calibration
    applies); a usage error where none does."""
    calibration, _ = rates.for_run(dict(env), calibrated)
    return lambda record, metric=None: limit(record, calibration, metric)


@dataclass(frozen=True)
class RunLimits:
    """The limits of one run's records, or why it has none (`missing`: a CPU run, a GPU with no calibration)."""

    calibration: Rates | None
    missing: str = ""

    def of(self, record: Mapping, metric: str | None = None) -> str:
        return "" if self.calibration is None else limit(record, self.calibration, metric)

    def per_metric(self, record: Mapping) -> dict[str, str]:
        return {} if self.calibration is None else metric_limits(record, self.calibration)

    def predicted(self, record: Mapping) -> dict[str, float]:
        """{metric: the model's predicted ms} of every metric it predicts for the record."""
        if self.calibration is None:
            return {}
        return {m: p.ms for m, p in predictions(record, self.calibration).items()}


def for_run(env: Mapping) -> RunLimits:
    """The limits of a run's records from the calibration of its GPU (rates.for_run); where the run has no GPU or
    its GPU no calibration, none, and why."""
    try:
        return RunLimits(rates.for_run(dict(env))[0])
    except QbenchUsageError:
        gpu = env.get("gpu_name") or env.get("smi_name")
        return RunLimits(None, f"no calibration for {gpu or 'a CPU run'}")
