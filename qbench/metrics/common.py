"""Metrics every family that times on a GPU may record beside its times (qbench.telemetry)."""

from __future__ import annotations

from qbench import units
from qbench.metrics import Metric

TELEMETRY = (
    Metric("sm_clock_mhz", units.MHZ, "median SM clock (NVML) over the timed work of the record"),
    Metric("power_w", units.WATTS, "median board power (NVML) over the timed work of the record"),
    Metric("throttle_reasons", units.FLAG, "NVML clock-throttle reason bits seen in any timed round, OR-ed"),
)
