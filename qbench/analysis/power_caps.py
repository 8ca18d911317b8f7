"""The cells of `qbench summary --spreads` whose timings ran power-capped: the records whose NVML throttle
reasons (qbench.telemetry, throttle_reasons_<what>) include the software power cap or the hardware power
brake, named as the summary names a cell ('k=v, ...' of the parameters that vary) with the timings and runs.
A spread there may be the power limit at work rather than noise."""

from __future__ import annotations

import re
from collections.abc import Sequence

from qbench import store
from qbench.analysis.compare import Run
from qbench.telemetry import power_capped


def capped_lines(runs: Sequence[Run], pattern: str | None = None) -> list[str]:
    """One legend line naming the power-capped cells, or none when no record says so."""
    regex = re.compile(pattern) if pattern else None  # a bad -k was refused by the summary already
    records = [(run, rec) for run in runs for rec in run.records
               if rec.get("status", "ok") == "ok" and (regex is None or regex.search(f"{rec['bench']}/{rec['case']}"))]
    names = store.varying_params([rec for _, rec in records], dict.fromkeys(k for _, r in records for k in r["params"]))
    cells: dict[str, list[str]] = {}
    for run, rec in records:
        if whats := power_capped(rec):
            case = ", ".join(f"{k}={rec['params'].get(k)}" for k in names) or rec["case"]
            cells.setdefault(case, []).append(f"{'/'.join(whats)} in {run.label}")
    if not cells:
        return []
    return [f"power-capped (NVML sw_power_cap or hw_power_brake while timed): {len(cells)} cells: "
            + "; ".join(f"{case} ({', '.join(where)})" for case, where in cells.items())]
