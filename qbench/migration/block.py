"""Schema-1 `switchback_model` records (written by `qbench switchback --model` and `qbench block` before the
tidy form) as bench `block` (see qbench/migration/__init__.py): param `model` -> `preset`; the speed-ups
named for what is measured first (`speedup_step` -> `step_speedup`, `speedup_linears` -> `linears_speedup`),
`model_tflops` -> `tflops` ("model" is the analytical model's word), and the step's telemetry without its
`_step` suffix (one timed step per record)."""

from __future__ import annotations

OLD_BENCH = "switchback_model"
BENCH = "block"
RENAMED = {"speedup_step": "step_speedup", "speedup_linears": "linears_speedup", "model_tflops": "tflops",
           "sm_clock_mhz_step": "sm_clock_mhz", "power_w_step": "power_w", "throttle_reasons_step": "throttle_reasons"}


def migrate(record: dict) -> list[dict]:
    from qbench.migration.rename import renamed

    return renamed(record, BENCH, params={"model": "preset"}, metrics=RENAMED)
