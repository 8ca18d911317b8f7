"""Predictions of `qbench fragmented` records (tidy: variant dense | fragmented | blockdiag | lowrank, task
train | eval | inference): forward, backward, optimizer step and the eager training step.

The flop and byte counts are the roofline floors' (qbench.model.floors.fragmented, which names the variant
`layer` with dense as `linear`, and the task `mode`); here they run at the calibrated rates.
"""

from __future__ import annotations

from collections.abc import Mapping

from qbench.model import floors
from qbench.model.hardware import Hardware
from qbench.model.predict import Prediction, Rates, chain, with_host, work


def _counts(params: Mapping, metrics: Mapping) -> dict[str, floors.Floor]:
    """Flops and bytes of each pass. `parameters` and `selected_fragments` are counts of the layer, not times."""
    old = {**params, "layer": "linear" if params["variant"] == "dense" else params["variant"],
           "mode": params.get("task", "train")}
    counting = {k: metrics[k] for k in ("parameters", "selected_fragments") if k in metrics}
    # the floors only need a device for their times; the counts do not depend on it
    unit = Hardware("count", {str(old["dtype"]): 1.0, "bf16": 1.0, "fp16": 1.0, "fp32": 1.0}, 1, 1, 1, 1, 1)
    return floors.fragmented(old, counting, unit)


def predict(record: Mapping, rates: Rates) -> dict[str, Prediction]:
    params, metrics = record["params"], record["metrics"]
    counts = _counts(params, metrics)
    dtype, clock = str(params["dtype"]), metrics.get("sm_clock_mhz")
    passes = {name: work(counts[f"{name}_ms"].flops, counts[f"{name}_ms"].bytes_moved, dtype, rates, clock,
                         cublas=dtype, what=name) for name in ("forward", "backward", "optimizer")}
    out = {f"{name}_ms": p for name, p in passes.items()}
    out["forward_replay_ms"] = passes["forward"]
    out["backward_optimizer_ms"] = chain({"backward": passes["backward"], "optimizer": passes["optimizer"]})
    fwd_bwd = chain({"forward": passes["forward"], "backward": passes["backward"]})
    step = chain(passes)
    eager = params.get("exec", "eager") == "eager"
    out["fwd_bwd_ms"] = with_host(fwd_bwd, metrics.get("host_fwd_bwd_ms") if eager else None)
    out["step_ms"] = with_host(step, metrics.get("host_step_ms") if eager else None)
    return out
