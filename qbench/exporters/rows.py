"""What every exporter reads from qbench.load's tidy frame: the ok rows of one metric kind, each with its
parameters (the frame's parameter columns that are set) and its samples."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from qbench import tidy, units

TIME_SCALE = {units.MS: 1e-3, units.S: 1.0}  # unit -> seconds per unit


@dataclass(frozen=True)
class Row:
    run: str
    bench: str
    case: str
    params: dict[str, Any]
    metric: str
    value: float
    unit: str | None
    samples: tuple[float, ...]


def param_names(frame) -> list[str]:
    return [c for c in frame.columns if c not in tidy.FIXED and c not in tidy.TAIL]


def _plain(value: Any) -> Any:
    """A pandas cell as JSON takes it: numpy scalars as Python numbers, NaN (a parameter the record lacks)
    as None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def ok_rows(frame, times_only: bool = False) -> Iterator[Row]:
    """Every ok row with a numeric value (times_only: of a time metric, ms or s)."""
    names = param_names(frame)
    for rec in frame.to_dict("records"):
        value = _plain(rec["value"])
        if rec["status"] != "ok" or not isinstance(rec["metric"], str) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, bool) or (times_only and rec["unit"] not in TIME_SCALE):
            continue
        params = {n.removeprefix("param."): p for n in names if (p := _plain(rec[n])) is not None}
        yield Row(rec["run"], rec["bench"], rec["case"], params, rec["metric"], float(value), rec["unit"],
                  tuple(float(x) for x in rec["samples"] or ()))
