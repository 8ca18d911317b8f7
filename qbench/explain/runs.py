"""Explain stored runs: each run's records against the calibration of the GPU it ran on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qbench import store
from qbench.errors import QbenchUsageError
from qbench.explain import FAMILIES, Cell, cells, rates


@dataclass(frozen=True)
class Explained:
    cells: list[Cell]
    records: list[dict]
    calibrations: list[str]  # the device name of each calibration used


def explain(runs: Sequence[str], calibrated: str | None = None, keep=lambda text: True) -> Explained:
    out, records, used = [], [], []
    for run in runs:
        env, loaded = store.load_run(run)
        kept = [r for r in loaded if r.get("bench") in FAMILIES and keep(f"{r['bench']}/{r['case']}")]
        if not kept:
            continue
        calibration, _ = rates.for_run(env, calibrated)
        out += cells(kept, calibration)
        records += kept
        used.append(calibration.name)
    if not out:
        raise QbenchUsageError(f"no record the model predicts in {', '.join(runs)} (it predicts ok records of "
                               f"{', '.join(FAMILIES)}, in the cases -k keeps)")
    return Explained(out, records, sorted(set(used)))
