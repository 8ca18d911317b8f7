"""Runs as compare takes them when one command ran several times: `--group N` merges each group of N
repeated runs into one (each metric the median of the runs' values, samples pooled), `--across PARAM`
turns the records of runs into one Run per value of PARAM (the reference first). compare_runs then joins
the Runs these return as it joins any others (qbench.analysis.compare).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from qbench.analysis import join
from qbench.analysis.compare import Run
from qbench.errors import QbenchUsageError


def across_param(runs: Sequence[Run], spec: str, cross_env: bool = False) -> list[Run]:
    """`--across PARAM[=REF]`: the records of these runs as one Run per value of PARAM, the reference
    first: REF, else the value runs made before PARAM existed had (exec: eager), else the first value
    seen. compare_runs then joins them on the remaining parameters. Where several runs hold records of
    one value (repeats of one command), they merge as --group merges repeated runs (merge_runs: each
    metric the median of the runs' values, samples pooled, a change counted only where the two sides'
    runs do not overlap); a value that one run alone holds keeps that run's records."""
    param, _, ref = (part.strip() for part in spec.partition("="))
    gpus = {run.env.get("gpu_name") or None for run in runs}
    if len(gpus) > 1 and not cross_env:  # pooled records would hide which GPU measured which value
        raise QbenchUsageError(f"--across pools runs from different GPUs ({gpus}); pass --cross-env to pool them")
    groups = join.split_by([rec for run in runs for rec in run.records], param)
    if not groups:
        raise QbenchUsageError(f"--across {param}: no record of these runs has a parameter {param!r}")
    if ref:
        ref = join.param_key(param, ref)
    else:
        default = join.PARAM_DEFAULTS.get(param)
        ref = default if default in groups else next(iter(groups))
    if ref not in groups:
        raise QbenchUsageError(f"--across {spec}: no record has {param}={ref} (values: {', '.join(groups)})")
    if len(groups) < 2:
        raise QbenchUsageError(f"--across {param}: every record has {param}={ref}; nothing to put beside it")
    tied = join.tied_params(groups)  # they label the groups instead of splitting the join
    per_run = [join.split_by(run.records, param) for run in runs]
    runs_out = []
    for value in [ref, *(v for v in groups if v != ref)]:
        holders = [Run(run.label, run.env, [join.without(rec, tied) for rec in split[value]])
                   for run, split in zip(runs, per_run) if split.get(value)]
        merged = holders[0] if len(holders) == 1 else merge_runs(holders, option="--across")
        label = ", ".join(f"{k}={join.join_params(groups[value][0]['params']).get(k)}" for k in tied)
        runs_out.append(Run(f"{param}={value}" + (f" ({label})" if label else ""), runs[0].env, merged.records))
    return runs_out


def group_runs(runs: Sequence[Run], size: int) -> list[Run]:
    """`--group N`: RUNS in groups of `size` consecutive runs (the repeated runs of one side of an A/B), each
    group merged into one Run (merge_runs); the first group is the reference."""
    if size < 1 or len(runs) % size or len(runs) // size < 2:
        raise QbenchUsageError(f"--group {size}: {len(runs)} runs do not split into two or more groups of {size} "
                               "consecutive runs (give the reference's runs first, then each candidate's)")
    return [merge_runs(runs[i:i + size]) for i in range(0, len(runs), size)]


def merge_runs(runs: Sequence[Run], option: str = "--group") -> Run:
    """Repeated runs of one command as one Run: per configuration (joined as compare joins) each metric is
    the median over the runs of their values, as `summary --across-runs median` prints it (the runs' own
    values kept as `run_values`), and the samples of every run are pooled for the U test; a change counts
    (+ or -) only where the two sides' runs do not overlap (_runs_overlap). A configuration some run of the
    group lacks is left out (it then shows as missing on this side)."""
    gpus = {run.env.get("gpu_name") or None for run in runs}
    if len(gpus) > 1:
        names = ", ".join(run.label for run in runs)
        raise QbenchUsageError(f"{option}: the runs {names} come from different GPUs ({gpus})")
    records = []
    for bench in sorted({rec["bench"] for run in runs for rec in run.records}):
        keys = join.join_keys([run.records for run in runs], bench)
        indexes = [join.index(run.records, bench, keys) for run in runs]
        for key in indexes[0]:
            group = [index.get(key) for index in indexes]
            if all(rec is not None for rec in group):
                records.append(_merged_record(group))
    return Run(_group_label([run.label for run in runs]), runs[0].env, records)


def _group_label(labels: Sequence[str]) -> str:
    """dir/new1, dir/new2, dir/new3 -> dir/new{1,2,3}: the runs of a group as the shell would expand them."""
    if len(labels) == 1:
        return labels[0]
    prefix = os.path.commonprefix(list(labels))
    return f"{prefix}{{{','.join(label[len(prefix):] for label in labels)}}}"


def _merged_record(group: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's records of several runs as one: a failed one as it is, else the first with each
    metric that every run has a number for replaced by the runs' median, and their samples pooled."""
    from qbench.samples import percentile

    failed = next((rec for rec in group if rec.get("status", "ok") != "ok"), None)
    if failed is not None:
        return failed
    metrics, samples, run_values = {}, {}, {}
    for name in group[0].get("metrics", {}):
        values = [rec.get("metrics", {}).get(name) for rec in group]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            metrics[name], run_values[name] = percentile(values, 50), values
            pooled = [x for rec in group for x in rec.get("samples", {}).get(name, [])]
            if pooled:
                samples[name] = pooled
    return {**group[0], "metrics": metrics, "samples": samples, "run_values": run_values}
