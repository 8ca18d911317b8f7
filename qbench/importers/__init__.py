"""Readers for the result formats of the tools qbench replaces, so old results join new runs.

Formats (auto-detected from the content, or named with --format), one module each:
  bnb-jsonl          bnb.py: bitsandbytes SwitchBack `info.jsonl`, one JSON object per line after a text header
  moe-log            moe.py: MoE step logs (Tutel-style helloworld): `[Benchmark]` header, STEP lines, `[Summary]`
  fragmented-report  fragmented.py: FragmentedLinear text report, `Benchmarking with input_size=...` blocks
  deepflow           deepflow.py: DeepFlow LSTM summary: component times, hardware block, memory, `Time:`
  tritonbench        tritonbench.py: tritonbench's --output-json, `tritonbench_<op>[x_<input>-<backend>]_<metric>`
  nvbench            nvbench.py: nvbench's JSON output (file version 1.x): benchmarks, states, summaries

Every reader returns (env, records): records in the store's schema with the bench names, params
and metric names of qbench's own runs (so `qbench compare` joins them), every metric with its unit;
env says where the numbers came from ("source": the format, "gpu_name": what the file says, or
None when it does not name the hardware).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qbench import record_schema, store
from qbench.errors import QbenchUsageError, read_text
from qbench.importers import nvbench, tritonbench
from qbench.importers.bnb import json_object, read_bnb_jsonl
from qbench.importers.deepflow import read_deepflow
from qbench.importers.fragmented import read_fragmented_report
from qbench.importers.moe import read_moe_log
from qbench.paths import check_name

Reader = Callable[[str], tuple[dict[str, Any], list[dict[str, Any]]]]

# format name (as --format spells it) -> reader; adding a format is one module and one line here.
READERS: dict[str, Reader] = {
    "bnb-jsonl": read_bnb_jsonl,
    "moe-log": read_moe_log,
    "fragmented-report": read_fragmented_report,
    "deepflow": read_deepflow,
    "tritonbench": tritonbench.read_tritonbench,
    "nvbench": nvbench.read_nvbench,
}
FORMATS = tuple(READERS)


def detect_format(text: str) -> str | None:
    """The format whose signature the text carries, or None."""
    if tritonbench.looks_like(text):
        return "tritonbench"
    if nvbench.looks_like(text):
        return "nvbench"
    if "[Benchmark] world_size" in text and "STEP-" in text:
        return "moe-log"
    if "Benchmarking with input_size=" in text:
        return "fragmented-report"
    if "Hardware Configuration" in text and "\nTime:" in text:
        return "deepflow"
    for line in text.splitlines()[:50]:
        row = json_object(line)
        if row is not None and "time_standard" in row:
            return "bnb-jsonl"
    return None


def read_file(path: str | Path, fmt: str = "auto") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(env, records) of a file in one of FORMATS; a one-line QbenchUsageError otherwise."""
    source = check_name(path, "results file", "give a results file of a known format")
    if not source.is_file():
        raise QbenchUsageError(f"{source} is not a file; give a results file of a known format ({', '.join(FORMATS)})")
    text = read_text(source, not_text="is not a text file; give a results file of a known format")
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
        env, records = READERS[fmt](text)
    except QbenchUsageError as exc:
        raise QbenchUsageError(f"{source}: not a valid {fmt} file: {exc}") from None
    base = {"source": fmt, "source_file": str(source), "imported": True, "gpu_name": None, "skipped": []}
    base.update(env)
    bad = next(((r, why) for r in records if (why := record_schema.problem(r)) is not None), None)
    if bad is not None:  # a reader's bug, not the file's: refuse rather than store a record no loader reads
        raise QbenchUsageError(f"{source}: the {fmt} reader made an invalid record ({bad[1]}); please report it")
    return base, records


def skip_note(env: dict[str, Any], shown: int = 3) -> str:
    """'N lines skipped: why; why; ...' of an import (env["skipped"] of read_file), or '' when none was."""
    skipped = env.get("skipped") or []
    if not skipped:
        return ""
    more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
    return f"{len(skipped)} skipped: {'; '.join(skipped[:shown])}{more}"


def load_any(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(env, records) of a qbench run directory, or of a file in a seed format (auto-detected)."""
    target = check_name(path, "run or results file", "give a run directory or a results file")
    if target.is_dir():
        return store.load_run(target)
    return read_file(target)


@dataclass(frozen=True)
class Imported:
    """What an import wrote: the run, the records made, the source's env (with its skip notes), and how
    many records replaced one of the same case (imported before, or earlier in the same file)."""

    path: Path
    records: list[dict[str, Any]]
    env: dict[str, Any]
    replaced: int


def import_to_run(
    path: str | Path, fmt: str = "auto", out: str | Path | None = None, *, append: bool = False, force: bool = False
) -> tuple[Path, list[dict[str, Any]]]:
    """(run directory, records) of import_file."""
    done = import_file(path, fmt, out, append=append, force=force)
    return done.path, done.records


def import_file(
    path: str | Path, fmt: str = "auto", out: str | Path | None = None, *, append: bool = False, force: bool = False
) -> Imported:
    """Read a file in a seed format and write it as a qbench run directory (default:
    runs/<bench>-import-<UTC time>). env.json describes the source, not this machine, plus the
    provenance of the qbench code that converted it (its records' names and derived metrics). A case
    the run already holds (the same file imported again with --append) or that the file gives twice is
    replaced by the later record, so a case is never there twice."""
    import shlex
    import sys
    from datetime import datetime, timezone

    from qbench.env import provenance

    env, records = read_file(path, fmt)
    bench = records[0]["bench"]
    target = Path(out) if out else store.default_run_dir(f"{bench}-import")
    env.update(
        command=shlex.join(sys.argv),
        time_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **provenance(),
    )
    with store.RunWriter(target, env, append=append, force=force, bench=bench) as writer:
        for record in records:
            writer.write(record)
    return Imported(target, records, env, writer.replaced)
