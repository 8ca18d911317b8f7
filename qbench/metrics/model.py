"""Metrics of bench `model`: the measured ceilings of `qbench model calibrate` (workload calibrate: op matmul,
copy or launch) and the analytical model's own records (`qbench model lstm`, `qbench model search-hw`,
DeepFlow output read by `qbench import`), whose times are predicted seconds per step, not measurements."""

from __future__ import annotations

from qbench import units
from qbench.metrics import Metric
from qbench.metrics.common import TELEMETRY
from qbench.model.search_hw import KEYS as SEARCH_PARTS  # the parts a power split divides the TDP into

BENCH = "model"
VARIANTS: tuple[str, ...] = ()

CALIBRATE = (
    Metric("time_ms", units.MS, "median time of one call of the op (matmul n x n x n, copy of n fp32, empty launch)"),
    Metric("tflops", units.TFLOPS, "2 n^3 flops of a floating-point matmul over time_ms"),
    Metric("tops", units.TOPS, "2 n^3 integer ops of an int8 matmul over time_ms"),
    Metric("gbps", units.GBPS, "bytes read and written by the copy over time_ms"),
)
# DeepFlow's step-time components, predicted seconds: forward / backward compute (cf, cb), the recurrent
# reduction and weight update (r, w), softmax, embedding and projection forward and backward
_COMPONENTS = ("cf", "cb", "r", "w", "softmax_f", "softmax_b", "embedding_f", "embedding_b", "projection_f",
               "projection_b", "apply_softmax")
_MEMORY = ("total", "embedding", "hidden", "softmax", "projection", "weight", "activation", "pointwise",
           "model_shard", "capacity")

LSTM = (
    Metric("time_s", units.S, "predicted time of one training step"),
    Metric("step_budget_s", units.S, "the time budget per step of DeepFlow's search harness (its time_per_step line)"),
    *(Metric(f"{c}_s", units.S, f"predicted {c.replace('_', ' ')} time of one step") for c in _COMPONENTS),
    *(Metric(f"memory_{m}_gb", units.GB, f"predicted {m.replace('_', ' ')} memory (per data shard; model_shard "
             "and capacity per device)") for m in _MEMORY),
    Metric("overflow_rate", units.RATIO, "memory needed over capacity, per data shard"),
    Metric("overflow_rate_model_shard", units.RATIO, "memory needed over capacity, per device"),
    Metric("fits", units.FLAG, "1 when the step's memory fits the device"),
    Metric("parameters", units.COUNT, "the model's parameters"),
    Metric("budget_s", units.S, "the step-time budget asked for"),
    Metric("meets_budget", units.FLAG, "1 when time_s is within budget_s"),
)
SEARCH = (
    Metric("best_s", units.S, "the best predicted step time found so far"),
    Metric("step", units.COUNT, "the search's step size at this iteration"),
    Metric("memory_gb", units.GB, "predicted memory per device"),
    Metric("capacity_gb", units.GB, "memory capacity per device at this power split"),
    *(Metric(f"f_{part}", "of TDP", f"the {part} share of the power budget") for part in SEARCH_PARTS),
)

METRICS = (*CALIBRATE, *TELEMETRY, *LSTM, *SEARCH)  # calibrate records the clock and power of its kernels
