"""`qbench summary --ratio-to PARAM=REF`: each record's metrics divided by those of the record with
PARAM=REF in the same run and otherwise the same configuration, so that a table prints, for instance,
FragmentedLinear's times over the dense layer's (`--ratio-to layer=linear`) and, with
`--across-runs median`, the median over the runs of each run's ratio.

Parameters tied to PARAM (one value within each of its groups, as `fragments` goes with `layer`) are
left out of the match, as in `qbench compare --across`. A ratio record keeps the candidate's
parameters, holds value / reference for every metric both records have (reference nonzero), in the
unit `ratio`, and no samples; records that are not ok on either side give none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qbench import units
from qbench.analysis import join
from qbench.analysis.compare import Run
from qbench.errors import QbenchUsageError


def parse(spec: str) -> tuple[str, str]:
    """'layer=linear' -> ('layer', 'linear') as joins spell the value."""
    param, sep, ref = (part.strip() for part in spec.partition("="))
    if not sep or not param or not ref:
        raise QbenchUsageError(f"--ratio-to {spec!r} must be PARAM=REF, e.g. --ratio-to layer=linear")
    return param, join.param_key(param, ref)


def ratio_runs(runs: Sequence[Run], spec: str) -> list[Run]:
    """Each run as the ratios of its records to their PARAM=REF counterparts (see the module docstring)."""
    param, ref = parse(spec)
    out = []
    for run in runs:
        groups = join.split_by(run.records, param)
        if ref not in groups:
            values = ", ".join(groups) or "none"
            raise QbenchUsageError(f"--ratio-to {spec}: no record of {run.label} has {param}={ref} (values: {values})")
        if len(groups) < 2:
            raise QbenchUsageError(f"--ratio-to {spec}: every record of {run.label} has {param}={ref}; "
                                   "nothing to divide by it")
        tied = join.tied_params(groups)
        base = {_key(rec, tied): rec for rec in groups[ref] if rec.get("status") == "ok"}
        records = []
        for rec in run.records:
            params = join.join_params(rec.get("params", {}))
            if param not in params or join.value_key(params[param]) == ref or rec.get("status") != "ok":
                continue
            reference = base.get(_key(join.without(rec, [param]), tied))
            if reference is not None:
                records.append(_ratio(rec, reference))
        out.append(Run(run.label, run.env, records))
    if not any(run.records for run in out):
        raise QbenchUsageError(f"--ratio-to {spec}: no record has a {param}={ref} counterpart to divide by")
    return out


def _key(record: dict[str, Any], tied: Sequence[str]) -> tuple:
    params = join.join_params(join.without(record, tied).get("params", {}))
    return record["bench"], tuple(sorted((k, join.value_key(v)) for k, v in params.items()))


def _ratio(record: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    mine, theirs = record.get("metrics", {}), reference.get("metrics", {})
    metrics = {m: v / theirs[m] for m, v in mine.items()
               if _number(v) and _number(theirs.get(m)) and theirs[m] != 0}
    return {**record, "metrics": metrics, "units": dict.fromkeys(metrics, units.RATIO), "samples": {}}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
