"""The record schema as the loader checks it: what each field of a stored record must hold.

A record read from results.jsonl is trusted only once `problem(record)` returns None; every reader of
runs (summary, compare, plot, resume, the importers' output) then indexes it without further checks:
  bench          a name (letters, digits, '-', '_', '.', '+'), it names files and table titles
  case           text (filled in from params when absent)
  params         an object of scalars: text, a finite number, true/false or null
  metrics        an object of finite numbers or null (null: not measured, or non-finite when measured)
  units          an object of texts (absent: {})
  samples        an object of lists of finite numbers (absent: {})
  status         one of ok, error, skipped (absent: ok)
  error, device, source_hash   text or null
  schema_version an integer no newer than this qbench writes
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 2  # 2: tidy records (qbench/metrics); 1 loads through qbench/migration
STATUSES = ("ok", "error", "skipped")
BENCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
LARGEST = 1.7976931348623157e308  # an int beyond this has no float value, and every metric is read as one


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null"}
    return names.get(type(value), "a number")


def _shown(value: Any) -> str:
    """How an error names a value that failed its check: its type, or why a number failed."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "NaN, infinite or too large"
    bad = next((x for x in value if not is_number(x)), None) if isinstance(value, list) else None
    if bad is not None:
        return "a list holding " + _shown(bad)
    return _type_name(value)


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool, which JSON and Python would otherwise count as 0 or 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= LARGEST and math.isfinite(value)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool)) or is_number(value)


def _mapping_problem(record: Mapping, field: str, check, what: str) -> str | None:
    """The first entry of record[field] that `check` refuses, as "field.key is <type>, not <what>"."""
    body = record[field]
    if not isinstance(body, dict):
        return f"{field} is {_type_name(body)}, not an object"
    for key, value in body.items():
        if not check(value):
            return f"{field}.{key} is {_shown(value)}, not {what}"
    return None


def _samples_ok(values: Any) -> bool:
    return isinstance(values, list) and all(is_number(x) for x in values)


FIELD_CHECKS = (  # field, check of each value, what a value must be; a missing field gets its default
    ("params", _scalar, "text, a finite number, true/false or null"),
    ("metrics", lambda v: v is None or is_number(v), "a finite number or null"),
    ("units", lambda v: isinstance(v, str), "text"),
    ("samples", _samples_ok, "a list of finite numbers"),
)
TEXT_FIELDS = ("case", "error", "device", "source_hash")


def problem(record: Any) -> str | None:
    """What is wrong with a decoded JSON line as a record, in a few words; None when it is a valid record."""
    if not isinstance(record, dict):
        return f"is {_type_name(record)}, not a record object"
    for required in ("bench", "params", "metrics"):
        if required not in record:
            return f"has no {required!r}"
    return _bench_problem(record) or _version_problem(record) or _fields_problem(record)


def _bench_problem(record: Mapping) -> str | None:
    bench = record["bench"]
    if not isinstance(bench, str) or not BENCH_NAME.match(bench):
        shown = repr(bench)[:40] if isinstance(bench, str) else _type_name(bench)
        return f"bench is {shown}, not a bench name (letters, digits, - _ . +)"
    return None


def _version_problem(record: Mapping) -> str | None:
    version = record.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        return f"schema_version is {_type_name(version)}, not an integer"
    if version > SCHEMA_VERSION:
        return f"schema_version {version} is newer than this qbench reads ({SCHEMA_VERSION}); update qbench"
    return None


def _fields_problem(record: Mapping) -> str | None:
    for field, check, what in FIELD_CHECKS:
        if field in record and (found := _mapping_problem(record, field, check, what)):
            return found
    status = record.get("status", "ok")
    if status not in STATUSES:
        shown = repr(status)[:40] if isinstance(status, str) else _type_name(status)
        return f"status is {shown}, not one of {', '.join(STATUSES)}"
    for field in TEXT_FIELDS:
        if record.get(field) is not None and not isinstance(record[field], str):
            return f"{field} is {_type_name(record[field])}, not text"
    return None


def case_id(params: Mapping[str, Any]) -> str:
    """Stable id of a configuration: its parameters as key=value, sorted by key (a whole float as an int)."""
    return "/".join(f"{k}={_plain(params[k])}" for k in sorted(params))


def _plain(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def completed(record: dict[str, Any]) -> dict[str, Any]:
    """A valid record with the optional fields a reader indexes filled in (case from its params, status ok,
    no units, samples or error): older or hand-written records read as new ones."""
    record.setdefault("units", {})
    record.setdefault("samples", {})
    record.setdefault("status", "ok")
    record.setdefault("error", None)
    if record.get("case") is None:
        record["case"] = case_id(record["params"])
    return record


def parse_lines(text: str, file, migrate) -> tuple[list[dict[str, Any]], list[str]]:
    """(valid records, completed and brought into today's form by `migrate` (qbench.migration.registry),
    and 'FILE:LINE: what is wrong' for each other non-blank line) of the text of a records file: one JSON
    record per line."""
    lines = text.splitlines()
    records, problems = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # bad JSON, an int of too many digits, nesting too deep
            last = number == len(lines) and not text.endswith("\n")
            problems.append(f"{file}:{number}: " + ("a partial last line (an interrupted run?)" if last else
                                                    "not valid JSON"))
            continue
        why = problem(record)
        if why is None:
            try:
                records.extend(completed(r) for r in migrate(completed(record)))
            except (KeyError, ValueError) as exc:  # a schema-1 record its family's migration cannot place
                why = exc.args[0] if exc.args else type(exc).__name__
                problems.append(f"{file}:{number}: the {record['bench']} record of schema "
                                f"{record.get('schema_version')} does not migrate: {why}")
        else:
            problems.append(f"{file}:{number}: the record {why}")
    return records, problems
