"""Records of earlier schemas brought into today's form as they are read, so every run qbench ever wrote
loads, summarises and compares with runs made today (`qbench compare OLD NEW` pairs them).

  schema 1   one record per measured configuration; execution mode, variant and timing spelt inside
             metric names (`module_switchback_graph_ms`), units guessed from names where not stored
  schema 2   tidy (qbench/metrics): exec, variant and timing are params, metric names say what is measured
             and carry their declared units

Each family whose records changed has a module here with `migrate(record) -> list[record]` (one schema-1
record may become several tidy ones), built with `split` below; a family without one loads unchanged.
qbench.migration.registry dispatches each record read to its family's module (this one imports none of them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def split(record: Mapping[str, Any], parts: list[tuple[dict, dict, dict]], bench: str | None = None) -> list[dict]:
    """Tidy records from one wide record: each part (params, metrics, samples) a record with the wide one's
    status, error, device and source hash, its case id from its params and its units declared
    (qbench.metrics). A record without metrics (an error, a skip) stays one record, renamed to `bench`."""
    from qbench.metrics.registry import units_of
    from qbench.record_schema import case_id

    name = bench or record["bench"]
    if not parts:
        return [{**record, "bench": name}]
    return [{**record, "bench": name, "case": case_id(params), "params": params, "metrics": metrics,
             "units": units_of(name, metrics), "samples": samples} for params, metrics, samples in parts]
