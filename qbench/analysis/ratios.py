"""`qbench summary --ratio-to PARAM=REF`: each record's metrics divided by those of the record with
PARAM=REF in the same run and otherwise the same configuration, so that a table prints, for instance,
FragmentedLinear's times over the dense layer's (`--ratio-to variant=dense`) and, with
`--across-runs median`, the median over the runs of each run's ratio.

Parameters tied to PARAM (one value within each of its groups, as `fragments` goes with `variant`) are
left out of the match, as in `qbench compare --across`. A ratio record keeps the candidate's
parameters, holds value / reference for every metric both records have (reference nonzero), in the
unit `ratio`, and no samples; records that are not ok on either side give none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qbench import units
from qbench.analysis import join
from qbench.analysis.compare import Run
from qbench.errors import QbenchUsageError


def parse(spec: str) -> tuple[str, str]:
    """'variant=dense' -> ('variant', 'dense') as joins spell the value."""
    param, sep, ref = (part.strip() for part in spec.partition("="))
    if not sep or not param or not ref:
        raise QbenchUsageError(f"--ratio-to {spec!r} must be PARAM=REF, e.g. --ratio-to variant=16bit")
    return param, join.param_key(param, ref)


@dataclass(frozen=True)
class Ratios:
    runs: list[Run]  # each run as the ratios of its records
    left_out: dict[str, int]  # why -> how many records of the other PARAM values gave no ratio (LEFT_OUT)


def ratio_runs(runs: Sequence[Run], spec: str) -> Ratios:
    """Each run as the ratios of its records to their PARAM=REF counterparts (see the module docstring), and
    how many records gave no ratio, by reason. A usage error where no record of any run gives one."""
    param, ref = parse(spec)
    out, left_out = [], Counter()
    for run in runs:
        groups = join.split_by(run.records, param)
        _require_both_sides(run, groups, spec, param, ref)
        tied = join.tied_params(groups)
        ok_last = sorted(groups[ref], key=lambda rec: rec.get("status") == "ok")  # an ok record wins its key
        base = {_key(rec, tied): rec for rec in ok_last}
        records = []
        for rec in run.records:
            reference, why = _counterpart(rec, base, param, ref, tied)
            if why:
                left_out[why] += 1
            elif reference is not None:
                records.append(_ratio(rec, reference))
        out.append(Run(run.label, run.env, records))
    if not any(run.records for run in out):
        raise QbenchUsageError(_nothing_matched(spec, param, ref, runs, left_out))
    return Ratios(out, dict(left_out))


NO_PARAM, NOT_OK, NO_COUNTERPART, COUNTERPART_NOT_OK = "no_param", "not_ok", "no_counterpart", "counterpart_not_ok"


def _counterpart(rec: dict, base: dict, param: str, ref: str, tied: Sequence[str]) -> tuple[dict | None, str]:
    """(the PARAM=REF record to divide by, '') or (None, why none: one of the reasons above); (None, '') for a
    PARAM=REF record itself, which is the divisor and no candidate."""
    params = join.join_params(rec.get("params", {}))
    if param not in params:
        return None, NO_PARAM
    if join.value_key(params[param]) == ref:
        return None, ""
    if rec.get("status") != "ok":
        return None, NOT_OK
    reference = base.get(_key(join.without(rec, [param]), tied))
    if reference is None:
        return None, NO_COUNTERPART
    return (reference, "") if reference.get("status") == "ok" else (None, COUNTERPART_NOT_OK)


def _require_both_sides(run: Run, groups: dict[str, list], spec: str, param: str, ref: str) -> None:
    if ref not in groups:
        values = ", ".join(groups) or "none"
        raise QbenchUsageError(f"--ratio-to {spec}: no record of {run.label} has {param}={ref} (values: {values})")
    if len(groups) < 2:
        raise QbenchUsageError(f"--ratio-to {spec}: every record of {run.label} has {param}={ref}; "
                               "nothing to divide by it")


def left_out_line(spec: str, left_out: dict[str, int]) -> str:
    """'--ratio-to variant=dense: 4 records have no variant=dense counterpart in their run (left out)', every
    reason joined by '; '; '' where every record gave a ratio."""
    reasons = _reasons(*parse(spec), left_out)
    return f"--ratio-to {spec}: {reasons} (left out)" if reasons else ""


def _reasons(param: str, ref: str, left_out: dict[str, int]) -> str:
    why = {NO_COUNTERPART: f"no {param}={ref} counterpart in their run", NO_PARAM: f"no {param} parameter",
           NOT_OK: "a status other than ok", COUNTERPART_NOT_OK: f"a {param}={ref} counterpart that is not ok"}
    return "; ".join(f"{_have(n)} {why[reason]}" for reason, n in left_out.items() if n)


def _have(n: int) -> str:
    return "1 record has" if n == 1 else f"{n} records have"


def _nothing_matched(spec: str, param: str, ref: str, runs: Sequence[Run], left_out: Counter) -> str:
    """The usage error where no record has a counterpart: the values of PARAM the runs have, and the
    parameters whose values the PARAM=REF records share with none of the others (what keeps them apart)."""
    records = [rec for run in runs for rec in run.records]
    groups = join.split_by(records, param)
    others = [rec for value, recs in groups.items() if value != ref for rec in recs]
    apart = [f"{name} ({param}={ref}: {_values(groups[ref], name)}; the others: {_values(others, name)})"
             for name in _apart(groups[ref], others)]
    reason = f"; they differ in {', '.join(apart)}" if apart else ""
    return (f"--ratio-to {spec}: no record gives a ratio ({_reasons(param, ref, left_out)}); the runs have "
            f"{param}={', '.join(groups)}{reason}")


def _apart(refs: Sequence[dict], others: Sequence[dict]) -> list[str]:
    """The parameters no PARAM=REF record shares a value of with any other record."""
    names = dict.fromkeys(k for rec in [*refs, *others] for k in join.join_params(rec.get("params", {})))
    return [n for n in names if not (_value_set(refs, n) & _value_set(others, n))]


def _value_set(records: Sequence[dict], name: str) -> set[str]:
    return {join.value_key(join.join_params(rec.get("params", {})).get(name)) for rec in records}


def _values(records: Sequence[dict], name: str) -> str:
    return ", ".join(sorted(_value_set(records, name), key=lambda v: (len(v), v)))  # 2, 8, 32, 128


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
