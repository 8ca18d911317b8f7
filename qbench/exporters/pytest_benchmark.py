"""pytest-benchmark's --benchmark-json layout (what github-action-benchmark reads with `tool: 'pytest'`).

One benchmark per record and time metric: name `<metric>[<case>]`, fullname `<bench>::<metric>[<case>]`, group
the metric, params the record's parameters. Stats in seconds, as pytest-benchmark writes them, from the stored
samples: min, max, mean, stddev, quartiles (q1, q3: the 25th and 75th percentiles), iqr, outlier counts, ops
(1 / mean, what github-action-benchmark tracks) and the samples as data; median is the record's stored value
(qbench's number; the median of the samples, or a sum of medians for a switchback total). A metric stored
without samples gets one round, its stored value.
"""

from __future__ import annotations

import statistics
from typing import Any

from qbench import __version__
from qbench.exporters.rows import TIME_SCALE, ok_rows
from qbench.samples import percentile


def stats(value_s: float, samples_s: list[float]) -> dict[str, Any]:
    data = samples_s or [value_s]
    q1, q3 = percentile(data, 25), percentile(data, 75)
    mean = statistics.fmean(data)
    stddev = statistics.stdev(data) if len(data) > 1 else 0.0
    iqr = q3 - q1
    low, high = q1 - 1.5 * iqr, q3 + 1.5 * iqr  # Tukey's fences, as pytest-benchmark counts iqr_outliers
    iqr_outliers = sum(1 for x in data if x < low or x > high)
    stddev_outliers = sum(1 for x in data if abs(x - mean) > stddev) if stddev else 0
    return {
        "min": min(data), "max": max(data), "mean": mean, "stddev": stddev, "rounds": len(data),
        "median": value_s, "iqr": iqr, "q1": q1, "q3": q3, "iqr_outliers": iqr_outliers,
        "stddev_outliers": stddev_outliers, "outliers": f"{stddev_outliers};{iqr_outliers}",
        "ld15iqr": min(x for x in data if x >= low), "hd15iqr": max(x for x in data if x <= high),
        "ops": 1.0 / mean if mean else 0.0, "total": sum(data), "data": data, "iterations": 1,
    }


def machine_info(env: dict[str, Any]) -> dict[str, Any]:
    return {"node": env.get("host"), "processor": env.get("cpu"), "machine": env.get("cpu"),
            "python_version": env.get("python"), "release": env.get("platform"), "system": "Linux",
            "gpu": env.get("gpu_name"), "torch": env.get("torch"), "cuda": env.get("cuda")}


def document(frame, envs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    benchmarks = []
    for row in ok_rows(frame, times_only=True):
        scale = TIME_SCALE[row.unit]
        benchmarks.append({
            "group": row.metric, "name": f"{row.metric}[{row.case}]",
            "fullname": f"{row.bench}::{row.metric}[{row.case}]", "params": row.params, "param": row.case,
            "extra_info": {"unit": row.unit, "run": row.run}, "options": {"timer": "qbench.timing"},
            "stats": stats(row.value * scale, [x * scale for x in row.samples]),
        })
    env = next(iter(envs.values()), {})
    return {"machine_info": machine_info(env),
            "commit_info": {"id": env.get("git_commit"), "dirty": env.get("git_dirty"), "time": env.get("time_utc"),
                            "project": "qbench"},
            "benchmarks": benchmarks, "datetime": env.get("time_utc"), "version": f"qbench {__version__}"}
