"""`qbench.load(RUN)`: runs as one tidy pandas DataFrame, the Python API the analysis commands share.

One row per record and metric (a record without metrics, an error say, keeps one row with no metric, so
its status is seen). Columns, in order:
  run, gpu, commit, time      the run directory (or imported file), env.json's GPU name, git commit and UTC time
  bench, case                 the record's bench and case id
  exec, variant, timing       how each value was measured (qbench.metrics.FIELDS: record params, here as columns
                              of their own in every frame, None where a record has no such param)
  <param> ...                 every other parameter of the records as a column of its own (a parameter whose name
                              is one of these columns is named param.<name> instead)
  metric, value, unit         the metric's name, stored value and declared unit
  status, samples             the record's status and the metric's stored samples (a list; empty when none)
Runs are run directories, parent folders of runs, or result files of an importable format (qbench.importers),
read through qbench.store's loader (a corrupt run is a one-line QbenchUsageError, never a traceback).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from qbench.metrics import FIELDS

FIXED = ("run", "gpu", "commit", "time", "bench", "case")
TAIL = ("metric", "value", "unit", "status", "samples")


def run_paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Each given run directory, the runs directly below a given parent folder, or a given result file."""
    from qbench import store

    given = [paths] if isinstance(paths, (str, Path)) else list(paths)
    out: list[Path] = []
    for path in map(Path, given):
        out.extend([path] if path.is_file() else store.find_runs(path))
    return out


def run_rows(label: str, env: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tidy rows of one run's records (see the module docstring)."""
    where = {"run": label, "gpu": env.get("gpu_name"), "commit": env.get("git_commit"), "time": env.get("time_utc")}
    rows = []
    for rec in records:
        params = {(f"param.{k}" if k in FIXED or k in TAIL else k): v for k, v in rec.get("params", {}).items()}
        head = {**where, "bench": rec.get("bench"), "case": rec.get("case"), **params}
        units, samples = rec.get("units", {}), rec.get("samples", {})
        metrics = rec.get("metrics") or {None: None}
        for name, value in metrics.items():
            rows.append({**head, "metric": name, "value": value, "unit": units.get(name),
                         "status": rec.get("status", "ok"), "samples": list(samples.get(name) or [])})
    return rows


def load(paths: str | Path | Iterable[str | Path]):
    """The tidy DataFrame of one or several runs (see the module docstring)."""
    import pandas as pd

    from qbench.importers import load_any

    rows: list[dict[str, Any]] = []
    for path in run_paths(paths):
        env, records = load_any(path)
        rows.extend(run_rows(str(path), env, records))
    named = dict.fromkeys([*FIXED, *FIELDS, *(k for row in rows for k in row), *TAIL])
    frame = pd.DataFrame(rows, columns=list(named))
    middle = [c for c in frame.columns if c not in FIXED and c not in FIELDS and c not in TAIL]
    return frame[[*FIXED, *FIELDS, *middle, *TAIL]]
