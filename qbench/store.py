"""THE results store: run directories of JSONL records, a CSV export, and loading into pandas.

A run directory holds
  env.json       environment block + exact command line + config (qbench.env)
  results.jsonl  one record per measured configuration, appended and flushed one line at a time
  results.csv    a flat export of the same records, regenerated from the JSONL on close

A record (schema_version 1):
  {"schema_version": 1, "bench": "switchback", "case": "batch_size=8192/dim_in=1024/...",
   "params": {...every swept value...}, "metrics": {"time_standard": 0.83, ...},
   "units": {"time_standard": "ms", ...}, "samples": {"time_standard": [...ms...]},
   "status": "ok" | "error" | "skipped", "error": null | "text", "device": "cuda" | "cpu",
   "source_hash": "<sha256 of the qbench/ and kernels/ sources, as in env.json>"}
Metric names follow each bench's declared names (seed-compatible keys kept exactly); `units` is the
per-metric declaration that `qbench compare` reads to know whether lower or higher is better.

Every reader of runs loads them here (load_run, read_records): each line is checked against the schema
(qbench.record_schema); a bad line is left out and named once on stderr as FILE:LINE (an error under
--strict, strict_reading), and a run with no valid record is a usage error.
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import json
import math
import os
import secrets
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qbench import record_schema, run_claim
from qbench.env import (
    COMPARABILITY_KEYS,
    autotune_mark,
    autotune_picks,
    launch_paths,
    launch_summary,
    own_source_hash,
)
from qbench.errors import QbenchUsageError, QbenchWarning, read_text
from qbench.migration.registry import migrate
from qbench.paths import check_name, name_problem
from qbench.record_schema import SCHEMA_VERSION, STATUSES, case_id  # case_id: the store's id of a configuration

ENV_FILE = "env.json"
RECORDS_FILE = "results.jsonl"
CSV_FILE = "results.csv"
SHOWN_PROBLEMS = 3  # bad lines a warning names one by one; the rest are counted


def varying_params(records: Sequence[Mapping[str, Any]], names: Iterable[str]) -> list[str]:
    """Those of `names` whose value differs between the records (as text: 8 and "8" are one value), in
    the order given: the parameters a table column or a figure's label must show to tell records apart."""
    return [name for name in names if len({str(r["params"].get(name)) for r in records}) > 1]


def measured_id(record: Mapping[str, Any], split: tuple[str, ...]) -> str:
    """The case id of what one measurement covered: a record's params without the fields (`split`) by which
    its family splits one measurement into several tidy records (switchback: variant, exec and timing)."""
    return case_id({k: v for k, v in record["params"].items() if k not in split})


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
    from qbench.metrics import registry as declared

    if declared.is_family(bench):  # a family's units are its declarations; an undeclared metric is an error
        units = declared.units_of(bench, metrics or {})
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
        "source_hash": own_source_hash(),  # a record copied out of its run still names its code
    }


def _json_number(value: Any) -> Any:
    """NaN/inf are not JSON: store them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def utc_stamp() -> str:
    """UTC time to the microsecond, e.g. 20250101T120000.123456Z: names sort in the order they were taken."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


# Where a command writes when no --out is given: runs/ under the working directory, which the repository
# ignores, so a user's runs never mix with the committed reference runs under results/ nor dirty a checkout.
RUNS_ROOT = "runs"


def default_run_dir(bench: str, root: str | Path = RUNS_ROOT) -> Path:
    """runs/<bench>-<UTC time to the microsecond>-<4 random hex digits>: two runs started at the same
    moment (on two hosts sharing a disk, say) still get different names, and names sort by start time."""
    return Path(root) / f"{bench}-{utc_stamp()}-{secrets.token_hex(2)}"


class RunWriter:
    """Writes one run directory. Records are appended with one write + flush + fsync per line, so a
    crash loses at most the record being written; the CSV is regenerated on close().

    A new run claims its directory at construction, before anything is measured: mkdir (which fails if
    the directory exists; an existing one must be empty), then an exclusive create of env.json. Each
    is one atomic step, and whoever loses either race is refused, so two runs never share a directory.
    A claim with no record written by close() is undone: input rejected by a bench leaves no empty run.
    --force replaces the old files when the first record arrives (a run that measures nothing keeps
    the old one). --append adds to a run of the same bench; a record whose case the run already holds
    replaces that record (the file is rewritten atomically), so a case is never there twice.
    """

    def __init__(
        self, path: str | Path, env: Mapping[str, Any], *, append: bool = False, force: bool = False,
        bench: str | None = None,
    ):  # fmt: skip
        if append and force:
            raise QbenchUsageError("--append adds to a run and --force replaces it; pass only one of them")
        self.path, self.env = check_name(path, "run directory", "choose another --out"), dict(env)
        self.append, self.force = append, force
        self.count = 0
        self.replaced = 0  # records that replaced one of the same case (--append, or a case written twice)
        self._fh = None
        self._lock: int | None = None  # the run directory, open and flock'ed while this writer owns it
        self._claimed: str | None = None  # "dir" or "env": what the claim created, undone if nothing is written
        self._autotune_mark = self._stored_mark = autotune_mark()
        if self.path.exists() and not self.path.is_dir():
            raise QbenchUsageError(f"{self.path} exists and is not a directory; choose another --out")
        self._benches, self._prior = _existing(self.path) if append else (set(), set())
        if bench is not None:
            self._check_bench(bench)
        self._made = False  # --append / --force made the directory (removed again if nothing is written)
        if not (append or force):
            self._claim()
        else:
            self._reach()

    def _reach(self) -> None:
        """--append / --force: the directory must exist and be writable, or be creatable, now, not at the
        first record."""
        if self.path.is_dir():
            run_claim.probe_writable(self.path, RECORDS_FILE)
            self._lock = run_claim.lock_dir(self.path)
            if self._lock is None:
                raise QbenchUsageError(f"another run is writing {self.path}; wait for it or choose another --out")
            return
        try:
            self.path.mkdir(parents=True)
            self._made = True
            self._lock = run_claim.lock_dir(self.path)
        except OSError as exc:
            blocked = any(p.exists() and not p.is_dir() for p in self.path.parents)
            raise _cannot_create(self.path, "a parent is a file" if blocked else exc.strerror) from None

    def _claim(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.mkdir()
            self._claimed = "dir"
        except FileExistsError:
            if not self.path.is_dir():
                raise _cannot_create(self.path, "a parent is a file") from None
            self._claimed = "env"
        except OSError as exc:
            raise _cannot_create(self.path, exc.strerror) from None
        self._lock = run_claim.lock_dir(self.path)
        if self._lock is None:
            self._claimed = None  # another live run holds it
            raise _not_empty(self.path)
        if self._claimed == "env" and any(self.path.iterdir()):
            if not run_claim.abandoned(self.path, ENV_FILE):
                self._claimed = None
                self._unlock()
                raise _not_empty(self.path)
            (self.path / ENV_FILE).unlink()  # a run killed before its first record: its claim is void
        try:  # the step that decides a race for the same (new or empty) directory
            os.close(os.open(self.path / ENV_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            self._claimed = None  # the other run owns it now
            self._unlock()
            raise _not_empty(self.path) from None
        except OSError as exc:
            self._unlock()
            raise _cannot_create(self.path, exc.strerror) from None
        _write_json(self.path / ENV_FILE, self.env)

    def _check_bench(self, bench: str) -> None:
        if self._benches and bench not in self._benches:
            raise QbenchUsageError(
                f"--append: {self.path} holds a {'/'.join(sorted(self._benches))} run, not {bench}; "
                "append to a run of the same bench or choose another --out"
            )

    def _open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.force:
            for name in (ENV_FILE, RECORDS_FILE, CSV_FILE):
                (self.path / name).unlink(missing_ok=True)
        if self._claimed is None and not (self.append and (self.path / ENV_FILE).exists()):
            _write_json(self.path / ENV_FILE, self.env)
        records = self.path / RECORDS_FILE
        if self.append and records.exists() and not records.read_bytes().endswith(b"\n"):
            _rewrite_records(self.path, drop=set())  # a crash left a partial last line: drop it before appending
        self._fh = open(records, "a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        self._check_bench(record["bench"])
        line = json.dumps(record, allow_nan=False, default=str)  # a record JSON cannot hold fails before any file
        if self._fh is None:
            self._open()
        ident = (record["bench"], record["case"])
        if ident in self._prior:
            self._fh.close()
            _rewrite_records(self.path, drop={ident})
            self.replaced += 1
            self._fh = open(self.path / RECORDS_FILE, "a", encoding="utf-8")
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._prior.add(ident)  # a later record of this case (a file that gives it twice) replaces this one
        self.count += 1
        self._store_new_picks()

    def _store_new_picks(self) -> None:
        """The autotuner picks noted since the last record, into env.json now: a run killed before close()
        (SIGKILL, the OOM killer) still names the configs its records ran with."""
        mark = autotune_mark()
        if mark != self._stored_mark:
            _store_autotune(self.path / ENV_FILE, self._autotune_mark)
            self._stored_mark = mark

    def close(self) -> None:
        try:
            self._finish()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None

    def _finish(self) -> None:
        if self._fh is not None and not self._fh.closed:
            self._fh.close()
            export_csv(self.path)
            _store_autotune(self.path / ENV_FILE, self._autotune_mark)
        elif self._fh is None and self._claimed is not None:
            (self.path / ENV_FILE).unlink(missing_ok=True)
            if self._claimed == "dir":
                _remove_if_empty(self.path)
            self._claimed = None
        elif self._fh is None and self._made:
            _remove_if_empty(self.path)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _not_empty(path: Path) -> QbenchUsageError:
    return QbenchUsageError(
        f"run directory {path} is not empty (or another run is writing it); "
        "pass --append to add to it or --force to replace it, or choose another --out"
    )


def _cannot_create(path: Path, why: str | None) -> QbenchUsageError:
    return QbenchUsageError(f"cannot create run directory {path} ({why}); choose another --out")


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass  # something else was put there meanwhile: leave it


def _existing(path: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """(benches, (bench, case) pairs) of the records already in a run; empty sets for a new one."""
    if not (path / RECORDS_FILE).is_file():
        return set(), set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a partial last line is dropped by _open before appending
        records = read_records(path)
    return {r["bench"] for r in records}, {(r["bench"], r.get("case")) for r in records}


def _rewrite_records(path: Path, drop: set[tuple[str, str]]) -> None:
    """Rewrite results.jsonl without the records of the cases in `drop` (and without a partial line)."""
    file = path / RECORDS_FILE
    text = file.read_text(encoding="utf-8")
    lines = text.splitlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            if number == len(lines) and not text.endswith("\n"):
                continue  # a crash's partial last line
            record = None  # another bad line stays as it was: the loader names it, this writer does not judge it
        if not isinstance(record, dict) or (record.get("bench"), record.get("case")) not in drop:
            kept.append(line + "\n")
    tmp = file.with_suffix(".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    tmp.replace(file)  # atomic: a crash leaves either the old file or the new one


def _store_autotune(env_file: Path, since: int) -> None:
    """Add the autotuner picks noted since the mark to env.json["autotune"] (a pick for a kernel and key
    already there, from an earlier run appended to, is replaced), and the kernels' launch paths to
    env.json["launch_paths"], summed up in env.json["launch_path"]."""
    picks, paths = autotune_picks(since), launch_paths(since)
    if not (picks or paths) or not env_file.exists():
        return
    env = json.loads(env_file.read_text(encoding="utf-8"))
    merged = {(p["kernel"], json.dumps(p["key"], sort_keys=True)): p for p in [*env.get("autotune", []), *picks]}
    env["autotune"] = [merged[k] for k in sorted(merged)]
    env["launch_paths"] = dict(sorted({**env.get("launch_paths", {}), **paths}.items()))
    env["launch_path"] = launch_summary(env["launch_paths"])
    _write_json(env_file, env)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


# --strict on a reading command: a run with a line that is not a valid record is an error, not a warning
_STRICT = contextvars.ContextVar("strict_reading", default=False)


@contextlib.contextmanager
def strict_reading(strict: bool = True) -> Iterator[None]:
    """Inside this block, read_records refuses a run with bad lines (as read_records(path, strict=True))."""
    token = _STRICT.set(strict)
    try:
        yield
    finally:
        _STRICT.reset(token)


def read_records(path: str | Path, strict: bool | None = None) -> list[dict[str, Any]]:
    """The valid records of one run's results.jsonl (qbench.record_schema), optional fields filled in.
    A line that is not a valid record (a crash's partial last line, bad JSON, a field of the wrong type)
    is left out and named, as FILE:LINE: what is wrong, in one QbenchWarning per run; with `strict`
    (default: inside strict_reading()) it is a one-line QbenchUsageError instead."""
    file = Path(path) / RECORDS_FILE
    records, problems = record_schema.parse_lines(_run_text(file), file, migrate)
    _judge(file, problems, strict)
    return records


def _judge(file: Path, problems: list[str], strict: bool | None) -> None:
    """Refuse (strict) or name once in a warning the bad lines of a run's records."""
    if problems and (_STRICT.get() if strict is None else strict):
        more = f" (and {_counted(len(problems) - 1, 'more bad line')})" if len(problems) > 1 else ""
        raise QbenchUsageError(f"{problems[0]}{more}; --strict reads no run with bad lines")
    if problems:
        shown = "; ".join(problems[:SHOWN_PROBLEMS])
        more = f"; and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
        warnings.warn(f"{file}: {_counted(len(problems), 'line')} left out, not valid records: {shown}{more}",
                      QbenchWarning, stacklevel=3)


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def is_run_dir(path: str | Path) -> bool:
    return name_problem(path) is None and (Path(path) / RECORDS_FILE).is_file()


def is_claimed_dir(path: str | Path) -> bool:
    """A run directory that a run claimed and left before its first record (env.json, no results.jsonl)."""
    run = Path(path)
    return name_problem(run) is None and (run / ENV_FILE).is_file() and not is_run_dir(run)


def load_run(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(env, records) of one run directory; a clear error when the path is not a run."""
    run = check_name(path, "run", "give a run directory written by qbench")
    if not run.exists():
        raise QbenchUsageError(f"{run} does not exist; give a run directory written by qbench")
    if not is_run_dir(run) and (run / ENV_FILE).is_file():
        raise QbenchUsageError(f"{run} is an empty run ({ENV_FILE} but no {RECORDS_FILE}: it stopped before a record)")
    if not is_run_dir(run):
        raise QbenchUsageError(f"{run} is not a qbench run (no {RECORDS_FILE} inside)")
    env = read_env(run)
    file = run / RECORDS_FILE
    records, problems = record_schema.parse_lines(_run_text(file), file, migrate)
    if not records:  # one error naming the first bad line, not a warning beside it
        more = f", and {_counted(len(problems) - 1, 'more bad line')}" if len(problems) > 1 else ""
        first = f": {problems[0]}{more}" if problems else ""
        raise QbenchUsageError(f"{run} is an empty run (no valid record in {RECORDS_FILE}{first}); rerun it or "
                               "drop it")
    _judge(file, problems, None)
    return env, records


def read_env(path: str | Path) -> dict[str, Any]:
    """The environment block of a run directory ({} where it has no env.json); a clear error when it is corrupt."""
    env_file = Path(path) / ENV_FILE
    try:
        env = json.loads(_run_text(env_file)) if env_file.exists() else {}
    except (ValueError, RecursionError):
        raise QbenchUsageError(f"{env_file} is not valid JSON; the run is corrupt") from None
    if not isinstance(env, dict):
        raise QbenchUsageError(f"{env_file} is not a JSON object; the run is corrupt")
    for key in COMPARABILITY_KEYS:  # compared and grouped by value: each must be one plain value
        if isinstance(env.get(key), (dict, list)):
            raise QbenchUsageError(f"{env_file}: {key} is not a single value; the run is corrupt")
    return env


def _run_text(file: Path) -> str:
    """The text of a run's file; a binary or unreadable file is named as corrupt, not a traceback."""
    return read_text(file, not_text="is not UTF-8 text; the run is corrupt")


def find_runs(path: str | Path) -> list[Path]:
    """A run directory itself, or every run directory directly below a parent directory."""
    root = check_name(path, "run folder", "give a run directory or a folder of runs")
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


def write_export(path: str | Path, name: str, lines: Iterable[str]) -> Path:
    """A file derived from a run's records (the seed format, say), written into the run directory
    atomically: one line per item, nothing half-written if the process dies."""
    target = Path(path) / name
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    tmp.replace(target)
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
