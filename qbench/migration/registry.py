"""Every record read in today's form: the schema-1 records of each family through its migration module
(qbench/migration/<family>.py, keyed by the bench name its old records carry), the units of every metric
a family declares from its declarations. The store's readers call `migrate` on each valid record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qbench.record_schema import SCHEMA_VERSION


def _migrations() -> dict[str, Callable[[dict], list[dict]]]:
    from qbench.migration import block, fragmented, grouped, moe, switchback, train

    return {m.OLD_BENCH: m.migrate for m in (switchback, fragmented, moe, block, train, grouped)}


def migrate(record: dict[str, Any]) -> list[dict[str, Any]]:
    """`record` (valid by qbench.record_schema) in today's form: itself when it is current, else its
    family's migration of it (possibly several records), each marked with SCHEMA_VERSION; the units of
    every metric its family declares are today's declarations (qbench.metrics.registry.declared_units)."""
    if record.get("schema_version", SCHEMA_VERSION) >= SCHEMA_VERSION:
        out = [record]
    else:
        step = _migrations().get(record["bench"])
        out = [{**r, "schema_version": SCHEMA_VERSION} for r in (step(record) if step else [dict(record)])]
    return [_with_declared_units(r) for r in out]


def _with_declared_units(record: dict[str, Any]) -> dict[str, Any]:
    from qbench.metrics.registry import declared_units

    record["units"] = declared_units(record["bench"], record["metrics"], record.get("units") or {})
    return record
