"""Reader for the bitsandbytes SwitchBack benchmark's `info.jsonl`.

The file is a few non-JSON header lines (kept in env["header"]), then one JSON object per measured
layer: batch_size (M tokens), dim_in, dim_out, wm, switch, repeat, and times in ms per call (seed
keys such as standard_fwd, global_fwd, x_quantize_rowwise, time_standard, time_global). Each line, with
the TFLOP/s, TOP/s, GB/s, speed-up and % saved derived from it, becomes the tidy "switchback" records a
run of that shape writes (one per variant; qbench/migration/switchback.py places each seed key).
The writer (format_bnb_jsonl, `qbench switchback --format seed`) is the inverse: one JSON line per shape
whose records are all ok, with exactly the seed's keys, in its order and of its types (SEED_KEYS).
"""

from __future__ import annotations

import json
from typing import Any

from qbench import store, units
from qbench.errors import QbenchUsageError
from qbench.migration.switchback import shapes, tidy, wide
from qbench.record_schema import is_number

# Timing keys of the bitsandbytes benchmark, each in ms per call.
BNB_TIME_KEYS = (
    "standard_fwd", "standard_gw", "standard_gx", "rowwise_fwd", "rowwise_bwd", "global_fwd", "global_bwd",
    "x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_rowwise", "w_quantize_colwise_transpose",
    "w_quantize_global", "w_quantize_global_transpose", "cast_x", "cast_g", "cast_w",
    "time_standard", "time_rowwise", "time_global",
)  # fmt: skip
BNB_PARAM_KEYS = ("batch_size", "dim_in", "dim_out", "wm", "switch")
# One info.jsonl line: these keys in this order; repeat, batch_size, dims int, wm int when whole
# (4) else float (4.3637), switch bool, every time a float (ms per call).
SEED_KEYS = ("repeat", "batch_size", "dim_out", "dim_in", "wm", "switch", *BNB_TIME_KEYS)
# Every matmul of the layer does 2*M*K*N flop (M tokens, K in, N out); 16-bit ones in TFLOP/s, int8 in TOP/s.
BNB_MATMULS_16 = ("standard_fwd", "standard_gw", "standard_gx")
BNB_MATMULS_INT8 = ("rowwise_fwd", "rowwise_bwd", "global_fwd", "global_bwd")


def _bnb_traffic(key: str, m: int, k: int, n: int) -> int | None:
    """Bytes a quantizer or cast moves: read fp16 (2 B) + write int8 (1 B) per element, + fp16 scales."""
    elements_and_scales = {
        "x_quantize_rowwise": (m * k, m),
        "g_quantize_rowwise": (m * n, m),
        "w_quantize_rowwise": (n * k, n),
        "w_quantize_colwise_transpose": (n * k, k),
        "w_quantize_global": (n * k, 1),
        "w_quantize_global_transpose": (n * k, 1),
        "cast_x": (m * k, 0),
        "cast_g": (m * n, 0),
        "cast_w": (n * k, 0),
    }
    if key not in elements_and_scales:
        return None
    elements, scales = elements_and_scales[key]
    return 3 * elements + 2 * scales


def bnb_records(row: dict[str, Any]) -> list[dict[str, Any]]:
    """One bitsandbytes info.jsonl line -> the tidy switchback records of its shape, one per variant."""
    params = {k: row[k] for k in BNB_PARAM_KEYS}
    params["dtype"] = "fp16"  # the seed benchmark builds every input with dtype=torch.float16
    metrics: dict[str, Any] = {k: float(row[k]) for k in BNB_TIME_KEYS if k in row}
    unit_of = {k: units.MS for k in metrics}
    if "repeat" in row:
        metrics["repeat"], unit_of["repeat"] = row["repeat"], units.COUNT
    m, k, n = row["batch_size"], row["dim_in"], row["dim_out"]
    for key, value in list(metrics.items()):
        if unit_of[key] != units.MS or not value:
            continue
        if key in BNB_MATMULS_16 or key in BNB_MATMULS_INT8:
            name, unit = (f"{key}_tflops", units.TFLOPS) if key in BNB_MATMULS_16 else (f"{key}_tops", units.TOPS)
            metrics[name], unit_of[name] = 2.0 * m * k * n / (value * 1e-3) / 1e12, unit
        elif (traffic := _bnb_traffic(key, m, k, n)) is not None:
            metrics[f"{key}_gbps"], unit_of[f"{key}_gbps"] = traffic / (value * 1e-3) / 1e9, units.GBPS
    _bnb_totals(metrics, unit_of)
    return [store.make_record("switchback", tidy_params, tidy_metrics, device="cuda")
            for tidy_params, tidy_metrics, _ in tidy(params, metrics)]


def _bnb_totals(metrics: dict[str, Any], unit_of: dict[str, str]) -> None:
    """speedup_<v> = time_standard / time_<v> (x); pct_saved_<v> = 100 * (1 - time_<v> / time_standard)."""
    standard = metrics.get("time_standard")
    for variant in ("global", "rowwise"):
        total = metrics.get(f"time_{variant}")
        if not standard or not total:
            continue
        metrics[f"speedup_{variant}"], unit_of[f"speedup_{variant}"] = standard / total, units.SPEEDUP
        metrics[f"pct_saved_{variant}"] = 100.0 * (1.0 - total / standard)
        unit_of[f"pct_saved_{variant}"] = units.PERCENT_SAVED


def read_bnb_jsonl(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """bitsandbytes info.jsonl: the non-JSON header lines before the first JSON line are kept in
    env["header"]; a later line that is not a valid result (cut mid-line, a missing key, a value of the
    wrong type or range) is skipped and named in env["skipped"]."""
    header, records, skipped = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        row = json_object(line)
        if row is None:
            if line.strip() and not records and not skipped:
                header.append(line.strip())
            elif line.strip():
                skipped.append(f"line {number}: not a JSON object (cut mid-line?)")
            continue
        why = row_problem(row)
        if why is not None:
            skipped.append(f"line {number}: {why}")
            continue
        records.extend(bnb_records(row))
    if not records:
        found = f" ({skipped[0]})" if skipped else ""
        raise QbenchUsageError(f"no valid bitsandbytes JSON line found{found}")
    env = {
        "gpu_name": "NVIDIA A100",  # the published info.jsonl was measured on an A100
        "gpu_count": 1,
        "timing": "host wall clock, mean of `repeat` calls after repeat/2 warm-ups, no L2 flush",
        "header": header,
        "skipped": skipped,
    }
    return env, records


def row_problem(row: dict[str, Any]) -> str | None:
    """Why one info.jsonl object is not a result line: a missing key, or a value of the wrong type or range
    (sizes positive integers, wm a positive number, switch true/false, times finite and >= 0 ms)."""
    missing = [k for k in (*BNB_PARAM_KEYS, "time_standard") if k not in row]
    if missing:
        return f"lacks {', '.join(missing)}"
    for key in ("batch_size", "dim_in", "dim_out"):
        if isinstance(row[key], bool) or not isinstance(row[key], int) or row[key] <= 0:
            return f"{key} is {row[key]!r:.40}, not a positive integer"
    if not is_number(row["wm"]) or row["wm"] <= 0:
        return f"wm is {row['wm']!r:.40}, not a positive number"
    if not isinstance(row["switch"], (bool, int)) or row["switch"] not in (0, 1):
        return f"switch is {row['switch']!r:.40}, not true/false"
    for key in (*BNB_TIME_KEYS, "repeat"):
        if key in row and (not is_number(row[key]) or row[key] < 0):
            return f"{key} is {row[key]!r:.40}, not a finite time >= 0"
    if row["time_standard"] <= 0:
        return "time_standard is 0; every ratio divides by it"
    return None


def json_object(line: str) -> dict[str, Any] | None:
    """The JSON object a line holds, or None (header lines, lists, malformed JSON)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def seed_line(values: dict[str, Any]) -> dict[str, Any] | None:
    """The info.jsonl line of one shape (SEED_KEYS exactly) from its params and wide metrics in one dict,
    or None when one of the keys is missing (a run of a subset of --variants)."""
    if any(values.get(k) is None for k in SEED_KEYS):
        return None
    wm = values["wm"]
    line: dict[str, Any] = {k: int(values[k]) for k in ("repeat", "batch_size", "dim_out", "dim_in")}
    line["wm"] = int(wm) if float(wm).is_integer() else float(wm)
    line["switch"] = bool(values["switch"])
    line.update({k: float(values[k]) for k in BNB_TIME_KEYS})
    return line


def shape_line(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The info.jsonl line of one shape's tidy records (migration.switchback.wide rebuilds the seed keys),
    or None when one of them is not ok or a seed key is missing."""
    if any(r.get("status", "ok") != "ok" for r in records):
        return None
    from qbench.metrics import FIELDS

    params = {k: v for k, v in records[0]["params"].items() if k not in FIELDS}
    return seed_line({**wide(records), **params})


def format_bnb_jsonl(records: list[dict[str, Any]]) -> tuple[list[str], int]:
    """(info.jsonl lines, how many shapes were left out: a record not ok, or missing seed keys)."""
    lines = [shape_line(group) for group in shapes([r for r in records if r.get("bench") == "switchback"])]
    return [json.dumps(line) for line in lines if line is not None], sum(line is None for line in lines)
