"""`qbench moe`'s measured values and their tidy records.

One measurement (a configuration in one exec and backward thread) gives its values under the names the
timing code produces (`step_time`, `loop_step_time`, `<phase>_time`, `sm_clock_mhz_loop`, per-rank
`blocks_rank<r>` ...), the names schema-1 records stored. tidy() turns them into the records of
qbench/metrics/moe.py: timing per_step, timing loop, and (variant blocks) one per_step record per rank
with param `rank`. The bench records through tidy(), and schema-1 runs load through it, so an old run and a
new one pair in `qbench compare`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from qbench.metrics.moe import PHASES

# measured name -> (timing, tidy metric) for the configuration's records (no rank)
RENAMED = {
    "step_time": ("per_step", "step_ms"),
    "forward_time": ("per_step", "forward_ms"),
    "backward_time": ("per_step", "backward_ms"),
    "step_time_instrumented": ("per_step", "step_instrumented_ms"),
    "host_ms_instrumented": ("per_step", "host_instrumented_ms"),
    "loop_step_time": ("loop", "step_ms"),
    "loop_tflops": ("loop", "tflops"),
    "blocks_total": ("per_step", "block_count"),
    "blocks_remote": ("per_step", "remote_block_count"),
    "summary_step_time": ("per_step", "summary_step_ms"),
    "summary_forward_time": ("per_step", "summary_forward_ms"),
    "summary_backward_time": ("per_step", "summary_backward_ms"),
    **{f"{what}_{kind}": ("per_step" if kind == "step" else "loop", what)
       for what in ("sm_clock_mhz", "power_w", "throttle_reasons") for kind in ("step", "loop")},
    **{f"{phase}_time": ("per_step", f"{stem}_ms") for phase, (stem, _) in PHASES.items()},
    **{f"host_{phase}_ms": ("per_step", f"host_{stem}_ms") for phase, (stem, _) in PHASES.items()},
}
# per-rank names (blocks): the stats' and the seed importer's names, and the per-rank phase samples
PER_RANK = re.compile(r"(.+?)_rank(\d+)$")
RANK_RENAMED = {"blocks": "block_count", "remote_blocks": "remote_block_count", "remote_fraction": "remote_fraction",
                "ag_fwd_ms": "ag_ms", "ga_fwd_ms": "ga_ms", "ag_bwd_ms": "backward_ag_ms",
                "ga_bwd_ms": "backward_ga_ms", "plan_ms": "host_plan_ms",
                **{f"{phase}_time": f"{PHASES[phase][0]}_ms" for phase in ("ag", "ga", "backward_ag", "backward_ga")}}
MEASURED_APART = ("timing", "rank")  # params that split one measurement into several records

Part = tuple[dict, dict, dict]  # (params, metrics, samples) of one tidy record


def place(name: str) -> tuple[str, int | None, str]:
    """(timing, rank or None, tidy metric) of one measured name; a name kept as it is is per_step."""
    per_rank = PER_RANK.match(name)
    if per_rank and per_rank.group(1) in RANK_RENAMED:
        return "per_step", int(per_rank.group(2)), RANK_RENAMED[per_rank.group(1)]
    timing, tidy_name = RENAMED.get(name, ("per_step", name))
    return timing, None, tidy_name


def tidy_params(params: Mapping) -> dict:
    """A schema-1 record's params in the tidy form: `system` is the variant (a2a before systems existed)."""
    out = {k: v for k, v in params.items() if k != "system"}
    return {**out, "variant": params.get("system") or "a2a"}


def tidy(params: Mapping, metrics: Mapping, samples: Mapping | None = None) -> list[Part]:
    """The tidy (params, metrics, samples) of one measurement's values: per_step first, then loop, then
    one per rank. `params` are the tidy params without timing (variant, exec, ...)."""
    groups: dict[tuple[str, int | None], tuple[dict, dict]] = {("per_step", None): ({}, {})}
    for source, keep in ((metrics, False), (samples or {}, True)):
        for name, value in source.items():
            timing, rank, tidy_name = place(name)
            values, kept = groups.setdefault((timing, rank), ({}, {}))
            if keep:
                kept[tidy_name] = list(value)
            else:
                values[tidy_name] = value
    return [({**params, "timing": timing, **({} if rank is None else {"rank": rank})}, values, kept)
            for (timing, rank), (values, kept) in groups.items() if values or kept]


OLD_BENCH = "moe"


def migrate(record: dict) -> list[dict]:
    """A schema-1 moe record as its tidy records (an error or skip stays one record, its params tidy)."""
    from qbench.migration import split

    params = tidy_params(record["params"])
    # an error or skip without metrics: one record, its params (and so its case id) tidy
    return split(record, tidy(params, record.get("metrics") or {}, record.get("samples")) or [(params, {}, {})])
