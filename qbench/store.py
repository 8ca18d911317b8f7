"""THE results store: run directories of JSONL records, a CSV export, and loading into pandas.

A run directory holds
  env.json       environment block + exact command line + config (qbench.env)
  results.jsonl  one record per measured configuration, appended and flushed one line at a time
  results.csv    a flat export of the same records, regenerated from the JSONL on close

A record (schema_version 1):
  {"schema_version": 1, "bench": "switchback", "case": "batch_size=8192/dim_in=1024/...",
   "params": {...every swept value...}, "metrics": {"time_standard": 0.83, ...},
   "units": {"time_standard": "ms", ...}, "samples": {"time_standard": [...ms...]},
   "status": "ok" | "error" | "skipped", "error": null | "text", "device": "cuda" | "cpu"}
Metric names follow each bench's declared names (seed-compatible keys kept exactly); `units` is the
per-metric declaration that `qbench compare` reads to know whether lower or higher is better.
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qbench.errors import QbenchUsageError

SCHEMA_VERSION = 1
ENV_FILE = "env.json"
RECORDS_FILE = "results.jsonl"
CSV_FILE = "results.csv"
STATUSES = ("ok", "error", "skipped")


def case_id(params: Mapping[str, Any]) -> str:
    """Stable id of a configuration: its parameters as key=value, sorted by key."""
    return "/".join(f"{k}={_plain(params[k])}" for k in sorted(params))


def _plain(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def make_record(
    bench: str,
    params: Mapping[str, Any],
    metrics: Mapping[str, float] | None = None,
    *,
    units: Mapping[str, str] | None = None,
    samples: Mapping[str, Iterable[float]] | None = None,
    status: str = "ok",
    error: str | None = None,
    device: str = "cpu",
    case: str | None = None,
) -> dict[str, Any]:
    """Build one record in the store's schema (see the module docstring)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
    return {
        "schema_version": SCHEMA_VERSION,
        "bench": bench,
        "case": case or case_id(params),
        "params": dict(params),
        "metrics": {k: _json_number(v) for k, v in (metrics or {}).items()},
        "units": dict(units or {}),
        "samples": {k: [float(x) for x in v] for k, v in (samples or {}).items()},
        "status": status,
        "error": error,
        "device": device,
    }


def _json_number(value: Any) -> Any:
    """NaN/inf are not JSON: store them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def default_run_dir(bench: str, root: str | Path = "results") -> Path:
    return Path(root) / f"{bench}-{utc_stamp()}"


class RunWriter:
    """Writes one run directory. Records are appended with one write + flush + fsync per line, so a
    crash loses at most the record being written; the CSV is regenerated on close().

    The target is checked at construction (refusing a non-empty run without append/force), but the
    directory is created only with the first record: input that fails validation inside a bench
    leaves no empty run behind.
    """

    def __init__(self, path: str | Path, env: Mapping[str, Any], *, append: bool = False, force: bool = False):
        self.path = Path(path)
        self.env = dict(env)
        self.append, self.force = append, force
        check_writable(self.path, append, force)
        self.count = 0
        self._fh = None

    def _open(self) -> None:
        if self.force and not self.append:
            for name in (ENV_FILE, RECORDS_FILE, CSV_FILE):
                (self.path / name).unlink(missing_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.append and (self.path / ENV_FILE).exists()):
            _write_json(self.path / ENV_FILE, self.env)
        self._fh = open(self.path / RECORDS_FILE, "a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        if self._fh is None:
            self._open()
        line = json.dumps(record, allow_nan=False, default=str)
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.count += 1

    def close(self) -> None:
        if self._fh is not None and not self._fh.closed:
            self._fh.close()
            export_csv(self.path)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_writable(path: Path, append: bool, force: bool) -> None:
    """Refuse a path that is a file, or a non-empty run directory without --append/--force."""
    if path.exists() and not path.is_dir():
        raise QbenchUsageError(f"{path} exists and is not a directory; choose another --out")
    if path.is_dir() and any(path.iterdir()) and not (append or force):
        raise QbenchUsageError(
            f"run directory {path} is not empty; pass --append to add to it or --force to replace it"
        )


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Records of one run's results.jsonl. A partial trailing line (a crash mid-write) is skipped
    with a warning; a corrupt line elsewhere is an error naming the line."""
    file = Path(path) / RECORDS_FILE
    lines = file.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                warnings.warn(f"{file}: skipping a partial last line {number} (interrupted run?)", stacklevel=2)
                continue
            raise QbenchUsageError(f"{file}: line {number} is not valid JSON; the run is corrupt") from None
        if not isinstance(record, dict) or "bench" not in record or "metrics" not in record:
            raise QbenchUsageError(f"{file}: line {number} is not a qbench record")
        records.append(record)
    return records


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / RECORDS_FILE).is_file()


def load_run(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(env, records) of one run directory; a clear error when the path is not a run."""
    run = Path(path)
    if not run.exists():
        raise QbenchUsageError(f"{run} does not exist; give a run directory written by qbench")
    if not is_run_dir(run):
        raise QbenchUsageError(f"{run} is not a qbench run (no {RECORDS_FILE} inside)")
    env_file = run / ENV_FILE
    try:
        env = json.loads(env_file.read_text(encoding="utf-8")) if env_file.exists() else {}
    except json.JSONDecodeError:
        raise QbenchUsageError(f"{env_file} is not valid JSON; the run is corrupt") from None
    return env, read_records(run)


def find_runs(path: str | Path) -> list[Path]:
    """A run directory itself, or every run directory directly below a parent directory."""
    root = Path(path)
    if is_run_dir(root):
        return [root]
    if not root.is_dir():
        raise QbenchUsageError(f"{root} does not exist; give a run directory or a folder of runs")
    runs = sorted(p for p in root.iterdir() if is_run_dir(p))
    if not runs:
        raise QbenchUsageError(f"{root} holds no qbench runs")
    return runs


def flatten(record: Mapping[str, Any], run: str = "") -> dict[str, Any]:
    """One flat row: run, bench, case, status, device, error, params.*, metrics as their own names."""
    row: dict[str, Any] = {"run": run} if run else {}
    row.update({k: record.get(k) for k in ("bench", "case", "status", "device", "error")})
    row.update({f"param.{k}": v for k, v in record.get("params", {}).items()})
    row.update(record.get("metrics", {}))
    return row


def export_csv(path: str | Path) -> Path:
    run = Path(path)
    rows = [flatten(r) for r in read_records(run)]
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    target = run / CSV_FILE
    with open(target, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return target


def load_frame(paths: str | Path | Iterable[str | Path]):
    """Records of one run, several runs, or a parent folder of runs as one pandas DataFrame."""
    import pandas as pd

    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows = []
    for given in paths:
        for run in find_runs(given):
            rows.extend(flatten(r, run=str(run)) for r in load_run(run)[1])
    return pd.DataFrame(rows)
