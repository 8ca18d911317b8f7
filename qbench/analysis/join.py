"""How records of different runs are matched: parameters normalized, join keys, splitting by a parameter.

Runs made by different versions of qbench spell the same configuration differently, so parameters
are normalized before any join (`qbench compare`, `qbench summary --across-runs`):
- a parameter a bench added later is filled with the value the older runs ran with (PARAM_DEFAULTS);
- a `dtype` parameter is spelled the canonical way (old moe runs say float16, every other run fp16).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qbench.dtypes import canonical_dtype
from qbench.store import case_id

# Parameters benches added later, and the value every run made before them implicitly had: `exec`
# (eager | compile | graph) came with the compile and CUDA-graph modes; before it every layer ran eager;
# `backward_thread` (device | calling) came later still, and every run before it had PyTorch's default.
PARAM_DEFAULTS: dict[str, Any] = {"exec": "eager", "backward_thread": "device"}


def join_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A record's params as joins see them: PARAM_DEFAULTS filled in, dtype names made canonical."""
    joined = {**PARAM_DEFAULTS, **params}
    if "dtype" in joined and joined["dtype"] is not None:
        try:
            joined["dtype"] = canonical_dtype(joined["dtype"])
        except ValueError:
            pass  # a dtype qbench has no alias for (a seed's own name): joined as it is spelt
    return joined


def value_key(value: Any) -> str:
    """A parameter value as a join key: 8192.0 and 8192 match, 'FP16' and 'fp16' match."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).lower()


def param_key(param: str, value: Any) -> str:
    """A value of `param` given on the command line, spelt as split_by spells its groups (fp16, 8192)."""
    return value_key(join_params({param: value})[param])


def join_keys(record_sets: list[list[dict[str, Any]]], bench: str) -> list[str]:
    """Parameter names every record set knows for this bench (the join key)."""
    key_sets = []
    for records in record_sets:
        keys: set[str] = set()
        for rec in records:
            if rec["bench"] == bench:
                keys |= set(join_params(rec.get("params", {})))
        key_sets.append(keys)
    return sorted(set.intersection(*key_sets)) if key_sets else []


def index(records: list[dict[str, Any]], bench: str, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Records of one bench keyed by the join parameters (a later duplicate replaces an earlier one)."""
    indexed = {}
    for rec in records:
        if rec["bench"] != bench:
            continue
        params = join_params(rec.get("params", {}))
        indexed["/".join(f"{k}={value_key(params.get(k))}" for k in keys)] = rec
    return indexed


def split_by(records: list[dict[str, Any]], param: str) -> dict[str, list[dict[str, Any]]]:
    """Records grouped by their (normalized) value of `param`, each without that parameter (params
    and case id), so that the groups join on the remaining parameters. Groups in order of appearance."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        joined = join_params(rec.get("params", {}))
        if param not in joined:
            continue
        groups.setdefault(value_key(joined[param]), []).append(without(rec, [param]))
    return groups


def without(record: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """A copy of the record without these parameters (in params and in its case id)."""
    params = {k: v for k, v in record.get("params", {}).items() if k not in names}
    return {**record, "params": params, "case": case_id(params)}


def tied_params(groups: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Parameters that go with the split one: one value within each group, and not the same value in
    all of them (moe's `transport` and `block_size` under `system`). A join on them would match nothing.
    Groups of one record say nothing about what varies with what, so then no parameter is tied."""
    if len(groups) < 2 or any(len(records) < 2 for records in groups.values()):
        return []
    names = {k for records in groups.values() for rec in records for k in join_params(rec.get("params", {}))}
    tied = []
    for name in sorted(names):
        per_group = [{value_key(join_params(r.get("params", {})).get(name)) for r in recs} for recs in groups.values()]
        if all(len(values) == 1 for values in per_group) and len(set.union(*per_group)) > 1:
            tied.append(name)
    return tied
