"""`qbench model --against RUN`: every measured time of a stored run next to its roofline floor.

For each ok record whose workload the model knows (switchback, fragmented, moe) and each metric that
has a floor: measured ms, floor ms, bound, flops, bytes, intensity and the fraction of roofline
(floor / measured). Fractions above 1 are flagged: the count is wrong or the data sat in cache.
Records are read in their tidy form (qbench/metrics): a switchback record's floors are the model's floors
of the seed's keys (qbench.model.floors.switchback) placed by the table its old runs migrate through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from qbench import store
from qbench.benches.model.config import load_hardware
from qbench.errors import QbenchUsageError
from qbench.model import floors, hardware
from qbench.model.hardware import Hardware


@dataclass(frozen=True)
class Row:
    bench: str
    case: str
    metric: str
    measured_ms: float
    floor_ms: float
    bound: str
    flops: float
    bytes_moved: float
    intensity: float
    fraction: float


def choose_hardware(gpu: str | None, calibrated: str | None, env: dict | None = None) -> Hardware:
    """--calibrated FILE, else --gpu NAME, else the GPU recorded in the run's environment."""
    try:
        if calibrated:
            return load_hardware(calibrated)
        if gpu:
            return hardware.preset(gpu)
    except ValueError as exc:
        raise QbenchUsageError(str(exc)) from None
    name = _gpu_name(env or {})
    found = hardware.preset_for_gpu(name) if name else None
    if found is None:
        where = f"the run's GPU {name!r}" if name else "the run (no GPU recorded)"
        raise QbenchUsageError(f"no hardware preset for {where}; pass --gpu h200|h100|a100-40gb|a100-80gb "
                               "or --calibrated FILE")
    return found


def _gpu_name(env: dict) -> str | None:
    """The device name from an env block, wherever the env module put it."""
    for key in ("gpu", "gpu_name", "device_name"):
        value = env.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict) and value.get("name"):
            return value["name"]
        if isinstance(value, list) and value and isinstance(value[0], dict) and value[0].get("name"):
            return value[0]["name"]
    return None


def rows_for(records: list[dict], hw: Hardware) -> list[Row]:
    out = []
    for rec in records:
        if rec.get("status") != "ok" or not _has_sizes(rec):
            continue
        try:
            found = record_floors(rec, hw)
        except (KeyError, ValueError):  # a layer or dtype word the model does not know: no floor for it
            continue
        for metric, floor in found.items():
            measured = rec.get("metrics", {}).get(metric)
            if not isinstance(measured, (int, float)) or measured <= 0:
                continue
            out.append(Row(rec["bench"], rec["case"], metric, float(measured), floor.floor_ms, floor.bound,
                           floor.flops, floor.bytes_moved, floor.intensity, floor.floor_ms / measured))
    return out


def record_floors(record: dict, hw: Hardware) -> dict[str, floors.Floor]:
    """{metric: Floor} of one stored record: a switchback record's by its variant, exec and timing."""
    if record["bench"] != "switchback":
        return floors.for_record(record, hw)
    from qbench.migration.switchback import WIDE

    p = record["params"]
    where = (p.get("variant"), p.get("exec"), p.get("timing"))
    out = {}
    for key, floor in floors.switchback(p, hw).items():
        out.update({name: floor for *place, name in WIDE.get(key, ()) if tuple(place) == where})
    return out


# The sizes the floors of each bench read from a record's params; a record without them has no floor.
RECORD_SIZES = {"switchback": ("batch_size", "dim_in", "dim_out"),
                "fragmented": ("batch_size", "in_features", "out_features"),
                "moe": ("world_size", "model_dim", "hidden_size", "samples", "top_k", "num_local_experts")}


def _has_sizes(record: dict) -> bool:
    from qbench.record_schema import is_number

    params = record["params"]
    return all(is_number(params.get(k)) and params[k] > 0 for k in RECORD_SIZES.get(record["bench"], ()))


def against(run: str | Path, gpu: str | None = None, calibrated: str | None = None) -> tuple[Hardware, list[Row]]:
    env, records = store.load_run(run)
    hw = choose_hardware(gpu, calibrated, env)
    rows = rows_for(records, hw)
    if not rows:
        benches = sorted({r.get("bench", "?") for r in records})
        raise QbenchUsageError(f"{run}: no record the model knows (benches here: {', '.join(benches) or 'none'}; "
                               "the model has floors for switchback, fragmented and moe)")
    return hw, rows


def table(rows: list[Row], hw: Hardware):
    """Each measured time beside its floor, fitted to the console (report.FittedTable); a case shows the
    parameters that differ between the rows (report.case_labels), the ones every case shares once below."""
    from rich.text import Text

    from qbench.report import Column, FittedTable, case_labels, format_value

    labels, shared = case_labels(rows)  # with several benches a label starts with its bench
    columns = [Column("case", justify="left", key=True, wrap=True), Column("metric", justify="left", key=True),
               *(Column(c) for c in ("measured ms", "floor ms")), Column("bound", justify="left"),
               *(Column(c) for c in ("AI flop/B", "of roofline"))]
    cells = []
    for r in rows:
        frac = f"{100 * r.fraction:.0f}%" + (" (count or cache?)" if r.fraction > 1 else "")
        cells.append([labels[(r.bench, r.case)], r.metric, format_value(r.measured_ms), format_value(r.floor_ms),
                      r.bound, format_value(r.intensity) if r.intensity != float("inf") else "inf",
                      Text(frac, style="red" if r.fraction > 1 else "")])
    benches = sorted({r.bench for r in rows})
    notes = ([f"bench: {benches[0]}"] if len(benches) == 1 else []) + ([f"every case: {shared}"] if shared else [])
    return FittedTable(columns, cells, title=f"Roofline on {hw.name} ({hw.source})", notes=notes)


# The parameters of each workload that are sizes or ratios (finite numbers), as typed on the command line.
NUMERIC = {
    "gemm": ("m", "k", "n"),
    "switchback": ("batch_size", "dim_in", "dim_out"),
    "fragmented": ("batch_size", "in_features", "out_features", "fragments"),
    "moe": ("world_size", "model_dim", "hidden_size", "samples", "top_k", "num_local_experts", "capacity_factor",
            "a2a_ffn_overlap_degree"),
}


# The other parameters each workload's floors read (qbench.model.floors); any other key is a typo.
WORDS = {"gemm": ("dtype",), "switchback": ("dtype",), "fragmented": ("dtype", "variant", "task"),
         "moe": ("dtype", "variant")}


def _check_numbers(workload: str, params: dict) -> None:
    """Only keys the workload's floors read; each size a finite number > 0 (`batch_size=abc`, `=1e400` or
    `=0` named here, not deep in the arithmetic); the capacity factor may be 0 or negative (dropless, capped)."""
    known = (*NUMERIC.get(workload, ()), *WORDS.get(workload, ()))
    unknown = [key for key in params if key not in known]
    if unknown:
        raise QbenchUsageError(f"{workload}: unknown parameter {unknown[0]!r}; the floors of {workload} read "
                               f"{', '.join(known)}")
    for key in NUMERIC.get(workload, ()):
        value = params.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise QbenchUsageError(f"{workload}: {key}={value!r} is not a finite number; give e.g. {key}=1024")
        if value <= 0 and key != "capacity_factor":
            raise QbenchUsageError(f"{workload}: {key}={value!r} must be > 0")


def floors_of(workload: str, params: dict, hw: Hardware) -> dict[str, floors.Floor]:
    """{metric: Floor} of one GEMM (params m, k, n, dtype) or of a qbench workload's record params."""
    _check_numbers(workload, params)
    try:
        if workload == "gemm":
            return {"gemm": floors.gemm(params["m"], params["k"], params["n"], params["dtype"], hw)}
        return floors.for_record({"bench": workload, "params": params, "metrics": {}}, hw)
    except KeyError as exc:
        name = exc.args[0]
        given = [k for k, v in params.items() if v == name]  # a lookup by value, e.g. variant=bogus
        if given:
            raise QbenchUsageError(f"{workload}: {given[0]}={name!r} is not a value the model knows") from None
        raise QbenchUsageError(f"{workload}: missing parameter {name}=VALUE") from None


def floors_table(workload: str, result: dict[str, floors.Floor], hw: Hardware):
    """Flops, bytes, intensity, ridge, bound and floor time of each metric, fitted to the console."""
    from qbench.report import Column, FittedTable, format_value

    columns = [Column("metric", justify="left", key=True),
               *(Column(c) for c in ("GFLOP", "MB moved", "flop/B", "ridge")), Column("bound", justify="left"),
               Column("floor ms")]
    rows = [[name, f"{f.flops / 1e9:.3f}", f"{f.bytes_moved / 1e6:.3f}", format_value(f.intensity), f"{f.ridge:.0f}",
             f.bound, f"{f.floor_ms:.4f}"] for name, f in result.items()]
    return FittedTable(columns, rows, title=f"{workload} floors on {hw.name}")
