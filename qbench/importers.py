"""Readers for the result formats of the tools qbench replaces, so old results join new runs.

Formats (auto-detected from the content, or named with --format):
  bnb-jsonl          bitsandbytes SwitchBack `info.jsonl`: one JSON object per line after a text header
  moe-log            MoE step logs (Tutel-style helloworld): `[Benchmark]` header, STEP lines, `[Summary]`
  fragmented-report  FragmentedLinear text report: `Benchmarking with input_size=...` blocks
  deepflow           DeepFlow LSTM summary: component times, hardware block, memory breakdown, `Time:`

Every reader returns (env, records): records in the store's schema with the bench names, params
and metric names of qbench's own runs (so `qbench compare` joins them), every metric with its unit;
env says where the numbers came from ("source": the format, "gpu_name": what the file says, or
None when it does not name the hardware).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qbench import store, units
from qbench.errors import QbenchUsageError

Reader = Callable[[str], tuple[dict[str, Any], list[dict[str, Any]]]]

# Timing keys of the bitsandbytes benchmark, each in ms per call.
BNB_TIME_KEYS = (
    "standard_fwd", "standard_gw", "standard_gx", "rowwise_fwd", "rowwise_bwd", "global_fwd", "global_bwd",
    "x_quantize_rowwise", "g_quantize_rowwise", "w_quantize_rowwise", "w_quantize_colwise_transpose",
    "w_quantize_global", "w_quantize_global_transpose", "cast_x", "cast_g", "cast_w",
    "time_standard", "time_rowwise", "time_global",
)  # fmt: skip
BNB_PARAM_KEYS = ("batch_size", "dim_in", "dim_out", "wm", "switch")
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


def bnb_record(row: dict[str, Any]) -> dict[str, Any]:
    """One bitsandbytes info.jsonl line -> one switchback record (seed keys kept as metrics)."""
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
    return store.make_record("switchback", params, metrics, units=unit_of, device="cuda")


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
    """bitsandbytes info.jsonl: the non-JSON header lines are skipped (kept in env["header"])."""
    header, records = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        row = _json_object(line)
        if row is None:
            if line.strip() and not records:
                header.append(line.strip())
            continue
        missing = [k for k in (*BNB_PARAM_KEYS, "time_standard") if k not in row]
        if missing:
            raise QbenchUsageError(f"line {number} lacks {', '.join(missing)}; not a bitsandbytes info.jsonl line")
        records.append(bnb_record(row))
    if not records:
        raise QbenchUsageError("no bitsandbytes JSON lines found")
    env = {
        "gpu_name": "NVIDIA A100",  # the published info.jsonl was measured on an A100
        "gpu_count": 1,
        "timing": "host wall clock, mean of `repeat` calls after repeat/2 warm-ups, no L2 flush",
        "header": header,
    }
    return env, records


def _json_object(line: str) -> dict[str, Any] | None:
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _readers() -> dict[str, Reader]:
    from qbench.importers_moe import read_moe_log
    from qbench.importers_text import read_deepflow, read_fragmented_report

    return {
        "bnb-jsonl": read_bnb_jsonl,
        "moe-log": read_moe_log,
        "fragmented-report": read_fragmented_report,
        "deepflow": read_deepflow,
    }


FORMATS = ("bnb-jsonl", "moe-log", "fragmented-report", "deepflow")


def detect_format(text: str) -> str | None:
    """The format whose signature the text carries, or None."""
    if "[Benchmark] world_size" in text and "STEP-" in text:
        return "moe-log"
    if "Benchmarking with input_size=" in text:
        return "fragmented-report"
    if "Hardware Configuration" in text and "\nTime:" in text:
        return "deepflow"
    for line in text.splitlines()[:50]:
        row = _json_object(line)
        if row is not None and "time_standard" in row:
            return "bnb-jsonl"
    return None


def read_file(path: str | Path, fmt: str = "auto") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(env, records) of a file in one of FORMATS; a one-line QbenchUsageError otherwise."""
    source = Path(path)
    if not source.is_file():
        raise QbenchUsageError(f"{source} is not a file; give a results file of a known format ({', '.join(FORMATS)})")
    text = source.read_text(encoding="utf-8", errors="replace")
    if fmt == "auto":
        fmt = detect_format(text) or ""
        if not fmt:
            raise QbenchUsageError(
                f"{source}: unknown format; known formats are {', '.join(FORMATS)} "
                "(`qbench import FILE --format NAME` forces one)"
            )
    elif fmt not in FORMATS:
        raise QbenchUsageError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    try:
        env, records = _readers()[fmt](text)
    except QbenchUsageError as exc:
        raise QbenchUsageError(f"{source}: not a valid {fmt} file: {exc}") from None
    base = {"source": fmt, "source_file": str(source), "imported": True, "gpu_name": None}
    base.update(env)
    return base, records


def load_any(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(env, records) of a qbench run directory, or of a file in a seed format (auto-detected)."""
    target = Path(path)
    if target.is_dir():
        return store.load_run(target)
    return read_file(target)


def import_to_run(
    path: str | Path, fmt: str = "auto", out: str | Path | None = None, *, append: bool = False, force: bool = False
) -> tuple[Path, list[dict[str, Any]]]:
    """Read a file in a seed format and write it as a qbench run directory (default:
    results/<bench>-import-<UTC time>). env.json describes the source, not this machine."""
    import shlex
    import sys
    from datetime import datetime, timezone

    from qbench import __version__

    env, records = read_file(path, fmt)
    target = Path(out) if out else store.default_run_dir(f"{records[0]['bench']}-import")
    env.update(
        command=shlex.join(sys.argv),
        time_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        qbench_version=__version__,
    )
    with store.RunWriter(target, env, append=append, force=force) as writer:
        for record in records:
            writer.write(record)
    return target, records
