"""nvbench's JSON (file version 1.0.0, as nvbench's json_printer writes it), for the tools that read it
(nvbench_compare and the like).

One benchmark per bench and time metric, named `<bench>/<metric>`; its axes are the parameters of its records
(int64, float64 or string axes by the values' type); one state per record, named by its axis values, on
device 0. Summaries of a state, with nvbench's tags, values written as strings as nvbench writes them:
  nv/cold/sample_size              the stored samples
  nv/cold/time/gpu/mean            their mean, in seconds
  nv/cold/time/gpu/stdev/relative  their standard deviation over the mean
  qbench/time/stored               the record's stored value, in seconds (its median, or a sum of medians)
A metric stored without samples gets only the last.
"""

from __future__ import annotations

import statistics
from typing import Any

from qbench.exporters.rows import TIME_SCALE, Row, ok_rows

FILE_VERSION = {"major": 1, "minor": 0, "patch": 0, "string": "1.0.0"}


def _typed(value: Any) -> tuple[str, str]:
    """(nvbench axis type, the value as nvbench writes it: a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "string", str(value)
    if isinstance(value, int) or float(value).is_integer():
        return "int64", str(int(value))
    return "float64", repr(float(value))


def _summary(tag: str, name: str, hint: str, description: str, kind: str, value: Any) -> dict[str, Any]:
    return {"tag": tag, "name": name, "hint": hint, "description": description,
            "data": [{"name": "value", "type": kind, "value": str(value)}]}


def summaries(row: Row) -> list[dict[str, Any]]:
    scale = TIME_SCALE[row.unit]
    out = []
    if len(row.samples) > 1:
        seconds = [x * scale for x in row.samples]
        mean = statistics.fmean(seconds)
        out += [_summary("nv/cold/sample_size", "Samples", "sample_size", "Number of stored samples", "int64",
                         len(seconds)),
                _summary("nv/cold/time/gpu/mean", "GPU Time", "duration", "Mean of the stored samples", "float64",
                         mean),
                _summary("nv/cold/time/gpu/stdev/relative", "Noise", "percentage",
                         "Relative standard deviation of the stored samples", "float64",
                         statistics.stdev(seconds) / mean if mean else 0.0)]
    out.append(_summary("qbench/time/stored", "Stored", "duration", "The record's stored value", "float64",
                        row.value * scale))
    return out


def _benchmark(index: int, name: str, rows: list[Row]) -> dict[str, Any]:
    names = list(dict.fromkeys(k for r in rows for k in r.params))
    axes = []
    for axis in names:
        values = list(dict.fromkeys(_typed(r.params[axis]) for r in rows if axis in r.params))
        axes.append({"name": axis, "type": values[0][0], "flags": "",
                     "values": [{"input_string": text, "description": "", **({"value": text} if kind == "string"
                                 else {"value": int(text) if kind == "int64" else float(text)})}
                                for kind, text in values]})
    states = []
    for r in rows:
        axis_values = [{"name": k, "type": _typed(v)[0], "value": _typed(v)[1]} for k, v in r.params.items()]
        states.append({"name": "Device=0 " + " ".join(f"{a['name']}={a['value']}" for a in axis_values),
                       "device": 0, "type_config_index": 0, "axis_values": axis_values,
                       "summaries": summaries(r), "is_skipped": False})
    return {"name": name, "index": index, "devices": [0], "axes": axes, "states": states}


def document(frame, envs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[Row]] = {}
    for row in ok_rows(frame, times_only=True):
        groups.setdefault(f"{row.bench}/{row.metric}", []).append(row)
    env = next(iter(envs.values()), {})
    return {"meta": {"argv": [env.get("command") or "qbench"], "version": {"json": FILE_VERSION}},
            "devices": [{"id": 0, "name": env.get("gpu_name") or "cpu",
                         "number_of_sms": env.get("sm_count")}],
            "benchmarks": [_benchmark(i, name, rows) for i, (name, rows) in enumerate(groups.items())]}
