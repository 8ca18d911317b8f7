"""Records of earlier schemas brought into today's form as they are read, so every run qbench ever wrote
loads, summarises and compares with runs made today (`qbench compare OLD NEW` pairs them).

  schema 1   one record per measured configuration; execution mode, variant and timing spelt inside
             metric names (`module_switchback_graph_ms`), units guessed from names where not stored
  schema 2   tidy (qbench/metrics): exec, variant and timing are params, metric names say what is measured
             and carry their declared units

Each family whose records changed has a module here with `migrate(record) -> list[record]` (one schema-1
record may become several tidy ones); a family without one loads unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from qbench.record_schema import SCHEMA_VERSION


def _migrations() -> dict[str, Callable[[dict], list[dict]]]:
    from qbench.migration import block, fragmented, grouped, moe, switchback, train

    return {m.OLD_BENCH: m.migrate for m in (switchback, fragmented, moe, block, train, grouped)}


def migrate(record: dict[str, Any]) -> list[dict[str, Any]]:
    """`record` (valid by qbench.record_schema) in today's form: itself when it is current, else its
    family's migration of it (possibly several records), each marked with SCHEMA_VERSION; the units of
    every metric its family declares are today's declarations (qbench.metrics.declared_units)."""
    if record.get("schema_version", SCHEMA_VERSION) >= SCHEMA_VERSION:
        out = [record]
    else:
        step = _migrations().get(record["bench"])
        out = [{**r, "schema_version": SCHEMA_VERSION} for r in (step(record) if step else [dict(record)])]
    return [_with_declared_units(r) for r in out]


def _with_declared_units(record: dict[str, Any]) -> dict[str, Any]:
    from qbench.metrics import declared_units

    record["units"] = declared_units(record["bench"], record["metrics"], record.get("units") or {})
    return record


def split(record: Mapping[str, Any], parts: list[tuple[dict, dict, dict]], bench: str | None = None) -> list[dict]:
    """Tidy records from one wide record: each part (params, metrics, samples) a record with the wide one's
    status, error, device and source hash, its case id from its params and its units declared
    (qbench.metrics). A record without metrics (an error, a skip) stays one record, renamed to `bench`."""
    from qbench.metrics import units_of
    from qbench.store import case_id

    name = bench or record["bench"]
    if not parts:
        return [{**record, "bench": name}]
    return [{**record, "bench": name, "case": case_id(params), "params": params, "metrics": metrics,
             "units": units_of(name, metrics), "samples": samples} for params, metrics, samples in parts]
