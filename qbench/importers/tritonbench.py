"""Reader for tritonbench's `--output-json`: one flat JSON object of metric values.

tritonbench names every value `tritonbench_<benchmark>[x_<input>-<backend>]_<metric>`, where <benchmark> is
the operator and mode (`gemm_fwd`), <input> the input's label (its x value: a size or a shape) and <backend>
the implementation measured (`aten_matmul`, `triton_tutorial_matmul`, ...); values are numbers, or text that
starts with one. Aggregate keys (`tritonbench_<benchmark>[<backend>]-<metric>-avg`, `tritonbench_<benchmark>-pass`)
are derived from the others and not read. Each (benchmark, input, backend) becomes one "tritonbench" record
with params op, x_val, backend and its metrics, units from tritonbench's metric names (latency in ms): a
name-based guess made for this foreign format only (qbench's own metrics are declared in qbench.metrics).
"""

from __future__ import annotations

import json
import re
from typing import Any

from qbench import store, units
from qbench.errors import QbenchUsageError

KEY = re.compile(r"^tritonbench_(?P<op>.+?)\[x_(?P<x>.*)-(?P<backend>[^-\]]+)\]_(?P<metric>.+)$")
NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
UNITS = {"latency": units.MS, "tflops": units.TFLOPS, "gbps": units.GBPS, "speedup": units.SPEEDUP,
         "accuracy": units.FLAG, "compile_time": units.MS, "cpu_peak_mem": units.GB, "gpu_peak_mem": units.GB}
ENDINGS = (("_ms", units.MS), ("_tflops", units.TFLOPS), ("_gbps", units.GBPS))  # other tritonbench names


def unit_of(name: str) -> str | None:
    """A tritonbench metric's unit: UNITS', else the one its name's ending spells, else none (no verdict)."""
    return UNITS.get(name) or next((unit for ending, unit in ENDINGS if name.endswith(ending)), None)


def looks_like(text: str) -> bool:
    return text.lstrip().startswith("{") and '"tritonbench_' in text[:2000]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    match = NUMBER.match(str(value)) if value is not None else None
    return float(match.group(1)) if match else None


def _x_value(text: str) -> Any:
    return int(text) if text.isdigit() else text


def read_tritonbench(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise QbenchUsageError(f"not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise QbenchUsageError("the file is not a JSON object of tritonbench metrics")
    grouped: dict[tuple[str, str, str], dict[str, float]] = {}
    for key, value in data.items():
        match, number = KEY.match(key), _number(value)
        if match is None or number is None:
            continue
        params = (match["op"], match["x"], match["backend"])
        grouped.setdefault(params, {})[match["metric"]] = number
    if not grouped:
        raise QbenchUsageError("no tritonbench_<benchmark>[x_<input>-<backend>]_<metric> value in it")
    records = []
    for (op, x, backend), metrics in grouped.items():
        declared = {m: u for m in metrics if (u := unit_of(m))}
        records.append(store.make_record("tritonbench", {"op": op, "x_val": _x_value(x), "backend": backend},
                                         metrics, units=declared))
    return {"gpu_name": None}, records
