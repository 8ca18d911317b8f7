"""`qbench explain RUN...`: every timed metric of a run beside the time the model predicts for it, their
ratio, the limit that binds (compute, memory, launch, host, link) and the model's reason; per family
the median and p90 of |predicted / measured - 1| and the worst cells.

Predictions come from each family's module here, from calibrated rates only (qbench.explain.rates);
the measured value of a cell is read after its prediction is made, to compare. The hardware bound
(qbench.model.predict.bound_ms) is a separate number: a measurement below it is flagged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from qbench.model.predict import Prediction, Rates, error


@dataclass(frozen=True)
class Cell:
    bench: str
    case: str
    metric: str
    kind: str  # component (one kernel), kernels (their sum), step (a module or layer step), phase (MoE)
    exec: str  # eager, compile, graph ('' where the record has none), and for MoE the world size: 'eager ws=4'
    measured_ms: float
    predicted_ms: float
    limit: str
    reason: str
    bound_ms: float  # the hardware bound of the same work

    @property
    def below_bound(self) -> bool:
        """Faster than the hardware allows: a flop or byte count, or the timer, is wrong."""
        return self.measured_ms < self.bound_ms

    @property
    def ratio(self) -> float:
        return self.predicted_ms / self.measured_ms

    @property
    def error(self) -> float:
        return error(self.predicted_ms, self.measured_ms)


def _predictors() -> dict[str, Callable[[Mapping, Rates], dict[str, Prediction]]]:
    from qbench.explain import block, fragmented, moe, switchback

    return {"switchback": switchback.predict, "fragmented": fragmented.predict, "moe": moe.predict,
            "block": block.predict}


FAMILIES = ("switchback", "fragmented", "moe", "block")
STEPS = ("step_ms", "chain_ms", "forward_replay_ms")
PHASES = ("gate_ms", "plan_ms", "dispatch_ms", "experts_ms", "combine_ms", "forward_ms", "backward_ms",
          "backward_experts_ms", "backward_exchange_ms", "optimizer_ms", "backward_optimizer_ms", "linear_ms",
          "fwd_bwd_ms")


def kind_of(metric: str) -> str:
    if metric == "kernels_ms":
        return "kernels"
    if metric in STEPS:
        return "step"
    if metric in PHASES:
        return "phase"
    return "component"


def predictions(record: Mapping, rates: Rates) -> dict[str, Prediction]:
    """The model's {metric: Prediction} of one ok record ({} for a family or variant it does not model).
    Reads the record's params and its telemetry and host time, never the metric it predicts."""
    predict = _predictors().get(record.get("bench"))
    if predict is None or record.get("status") != "ok":
        return {}
    try:
        return predict(record, rates)
    except (KeyError, ValueError, TypeError, ZeroDivisionError):  # a record without the sizes the model reads
        return {}


def _where(record: Mapping) -> str:
    params = record["params"]
    where = str(params.get("exec", ""))
    return f"{where} ws={params['world_size']}" if record["bench"] == "moe" else where


def cells(records: list[Mapping], rates: Rates) -> list[Cell]:
    out = []
    for rec in records:
        for metric, pred in predictions(rec, rates).items():
            measured = rec["metrics"].get(metric)
            if not isinstance(measured, (int, float)) or isinstance(measured, bool) or measured <= 0:
                continue
            out.append(Cell(rec["bench"], rec["case"], metric, kind_of(metric),
                            _where(rec), float(measured), pred.ms, pred.limit, pred.why,
                            pred.bound_ms))
    return out
