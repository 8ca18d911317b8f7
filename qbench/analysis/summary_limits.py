"""`qbench summary --limits`: beside each cell the limit that binds the model's prediction of that cell's metric
for its record (qbench.explain.limits: compute, memory, launch, host, link, power), from the calibration of the
GPU each run was measured on; with `--predicted` also the model's predicted time of it (qbench explain's).

Each ok record of a run is given its {metric: limit} under the key LIMITS before the summary is built (in memory
only; nothing is stored), so that a --ratio-to record, which keeps the keys of the record it divides, carries
that record's limits. Across runs a cell shows the limit every run's record names, else MIXED.
"""

from __future__ import annotations

from collections.abc import Sequence

from qbench.analysis.compare import Run

LIMITS = "limits"  # the record key the limits travel under, from here to the summary's cells
PREDICTED = "predicted_ms"  # the record key the model's predicted times travel under
MIXED = "mixed"  # across runs: the runs' records name different limits


def with_limits(runs: Sequence[Run], predicted: bool = False) -> tuple[list[Run], dict[str, str]]:
    """(each run with its ok records' limits under LIMITS, and where `predicted` their predicted times under
    PREDICTED, run label -> why none of its records has one: the runs with no calibration for their GPU, a CPU
    run)."""
    from qbench.explain.limits import for_run

    out, missing = [], {}
    for run in runs:
        found = for_run(run.env)
        if found.missing:
            missing[run.label] = found.missing
        records = [{**rec, LIMITS: found.per_metric(rec), **({PREDICTED: found.predicted(rec)} if predicted else {})}
                   if rec.get("status", "ok") == "ok" else rec for rec in run.records]
        out.append(Run(run.label, run.env, records))
    return out, missing


def of(record: dict, metric: str) -> str:
    """The limit of one metric of a record ('' where it has none, or --limits is not given)."""
    return record.get(LIMITS, {}).get(metric, "")


def predicted_of(record: dict, metric: str) -> float | None:
    """The model's predicted ms of one metric of a record (None where it predicts none, or --limits is not given)."""
    return record.get(PREDICTED, {}).get(metric)


def agreed(limits: Sequence[str]) -> str:
    """The limit of a cell over several runs: the one every run's record names ('' if none names one), else MIXED."""
    return MIXED if len(set(limits)) > 1 else next(iter(limits), "")


MEANING = ("limit after a value: what binds the model's prediction of it for its record (power: compute at a "
           "power-capped clock)")
PREDICTED_MEANING = ("model X: the time the model predicts for the cell from the GPU's calibration alone (qbench "
                     "explain; across runs the median of the runs' predictions)")


def legend(shown: Sequence[str], missing: dict[str, str], runs: int, ratio_to: str | None) -> list[str]:
    """The legend's lines about the limits: what they are (`shown`: the limit of every cell), or why none shows
    (`missing` of `runs` runs: those with no calibration)."""
    from qbench.explain import FAMILIES

    lines = []
    if any(shown):
        divided = f"; with --ratio-to, the limit of the record divided, not of its {ratio_to} counterpart"
        lines.append(MEANING + (divided if ratio_to else ""))
    elif len(missing) < runs:
        lines.append(f"limits: none shown, the model predicts none of these cells (it predicts the times of ok "
                     f"{', '.join(FAMILIES)} records)")
    if MIXED in shown:
        lines.append(f"{MIXED}: the runs' records name different limits")
    why = "; ".join(dict.fromkeys(missing.values()))
    if missing:
        lines.append(f"limits: none shown, {why}" if len(missing) == runs else
                     f"limits: none for {', '.join(missing)}: {why}")
    return lines
