"""The migration of a family whose schema-1 record maps onto one tidy record by renaming: its bench, param
names (and values), metric names (also of its samples), and params it gained since (fragmented, block,
train_check)."""

from __future__ import annotations

from collections.abc import Mapping


def renamed(record: dict, bench: str, *, params: Mapping[str, str], metrics: Mapping[str, str],
            values: Mapping[str, Mapping] | None = None, add: Mapping | None = None) -> list[dict]:
    """`record` as one tidy record of `bench`: params renamed in their places (old name -> new), a renamed
    param's value mapped by values[new name] where given, `add` params appended, metric and sample names
    renamed; an error or skip record is renamed alike."""
    from qbench.migration import split

    new_params = {}
    for key, value in record["params"].items():
        name = params.get(key, key)
        new_params[name] = (values or {}).get(name, {}).get(value, value)
    new_params.update(add or {})
    parts = (new_params, {metrics.get(k, k): v for k, v in record["metrics"].items()},
             {metrics.get(k, k): v for k, v in (record.get("samples") or {}).items()})
    return split(record, [parts], bench=bench)
