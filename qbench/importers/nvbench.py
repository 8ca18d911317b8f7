"""Reader for nvbench's JSON output (`--json FILE`, file version 1.x).

The file holds `benchmarks`, each with `states`: one measured configuration, its `axis_values` (name, type
int64 | float64 | string, value written as text) and its `summaries` (tag, data: [{name: value, type, value}]).
Each state that was not skipped becomes one "nvbench" record: params are the benchmark's name and the axis
values; metrics are its summaries that carry a value, named from their tags with units made qbench's (times in
ms, bandwidths in GB/s):
  nv/cold/time/gpu/mean -> gpu_time_ms        nv/cold/time/cpu/mean -> cpu_time_ms
  nv/batch/time/gpu/mean -> batch_gpu_time_ms nv/cold/time/gpu/stdev/relative -> gpu_noise (a fraction)
  nv/cold/bw/global/bytes_per_second -> global_memory_gbps
  nv/cold/sample_size -> samples               any other tag: its path with '/' as '_', unscaled
env names the device of the first state (`devices[].name`).
"""

from __future__ import annotations

import json
from typing import Any

from qbench import store, units
from qbench.errors import QbenchUsageError

# tag -> (metric name, scale to the unit, unit)
KNOWN = {
    "nv/cold/time/gpu/mean": ("gpu_time_ms", 1e3, units.MS),
    "nv/cold/time/cpu/mean": ("cpu_time_ms", 1e3, units.MS),
    "nv/batch/time/gpu/mean": ("batch_gpu_time_ms", 1e3, units.MS),
    "nv/cold/time/gpu/stdev/relative": ("gpu_noise", 1.0, None),
    "nv/cold/bw/global/bytes_per_second": ("global_memory_gbps", 1e-9, units.GBPS),
    "nv/cold/sample_size": ("samples", 1.0, units.COUNT),
}


def looks_like(text: str) -> bool:
    head = text[:20000]
    return text.lstrip().startswith("{") and '"benchmarks"' in head and '"axis_values"' in head


def _typed(entry: dict[str, Any]) -> Any:
    kind, value = entry.get("type"), entry.get("value")
    try:
        return int(value) if kind == "int64" else float(value) if kind == "float64" else value
    except (TypeError, ValueError):
        return value


def _metrics(summaries: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, str]]:
    metrics, declared = {}, {}
    for summary in summaries:
        value = next((_typed(d) for d in summary.get("data", []) if d.get("name") == "value"), None)
        if not isinstance(value, (int, float)):
            continue
        name, scale, unit = KNOWN.get(summary.get("tag", ""), (summary.get("tag", "").replace("/", "_"), 1.0, None))
        metrics[name] = value * scale
        if unit:
            declared[name] = unit
    return metrics, declared


def _records(bench: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for state in bench.get("states", []):
        if state.get("is_skipped"):
            continue
        if not isinstance(state.get("summaries"), list):
            raise QbenchUsageError("summaries are not a list: an nvbench file older than file version 1.0")
        params = {"benchmark": bench.get("name"), **{a["name"]: _typed(a) for a in state.get("axis_values", [])}}
        metrics, declared = _metrics(state["summaries"])
        out.append(store.make_record("nvbench", params, metrics, units=declared))
    return out


def read_nvbench(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise QbenchUsageError(f"not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise QbenchUsageError("no list of benchmarks in it")
    records = [rec for bench in data["benchmarks"] for rec in _records(bench)]
    if not records:
        raise QbenchUsageError("no measured state in it")
    devices = data.get("devices") or [{}]
    return {"gpu_name": devices[0].get("name")}, records
