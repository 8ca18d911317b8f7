"""MoE figure: step time split by phase per configuration, step time and TFLOP/s against experts per
rank, and the per-rank token load (blocks, remote share) when the records carry it. The panels draw the
per_step records of each configuration (the loop's step is not split into phases), the load panel its
per-rank records (param `rank`, variant blocks)."""

from __future__ import annotations

from typing import Any

from qbench.plots.base import dim_ticks, no_data, value
from qbench.store import varying_params

# Phase metrics a record may carry (ms, medians over steps); drawn stacked when present.
# (qbench moe: each the median over steps of the max over ranks, so their sum need not equal step_ms;
# the rest of the step is drawn as "other").
PHASES = ("gate_ms", "plan_ms", "dispatch_ms", "experts_ms", "combine_ms", "backward_exchange_ms",
          "backward_experts_ms")
LOAD = ("expert_load_max_over_mean", "rank_load_max_over_mean", "block_imbalance")
# the parameters a sweep varies (a run's records differ only in these), with their short label names
KEY_PARAMS = ("world_size", "num_local_experts", "top_k", "routing", "capacity_factor", "replicate_hot", "dtype",
              "a2a_ffn_overlap_degree", "gemm", "variant", "locality", "exec", "backward_thread")
SHORT = {"num_local_experts": "E", "world_size": "ranks", "top_k": "k", "capacity_factor": "cf",
         "a2a_ffn_overlap_degree": "D", "backward_thread": "bwd"}


def _label(record: dict[str, Any], keys: list[str], sep: str) -> str:
    return sep.join(f"{SHORT.get(k, k)}={record['params'].get(k)}" for k in keys)


def labels(records: list[dict[str, Any]]) -> list[str]:
    """Short x labels from the parameters that differ between the records."""
    varying = varying_params(records, KEY_PARAMS) or ["num_local_experts"]
    return [_label(r, varying, "\n") for r in records]


def _per_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each configuration's record of timing per_step (schema-2 imports and runs; no per-rank records)."""
    return [r for r in records if r["params"].get("timing", "per_step") == "per_step" and "rank" not in r["params"]]


def _ranks_of(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(per_step record, its per-rank records in rank order) of each configuration that has per-rank records."""
    from qbench.benches.moe.cases import resume_id

    ranks: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if "rank" in r["params"]:
            ranks.setdefault(resume_id(r["params"]), []).append(r)
    rows = [(r, ranks.get(resume_id(r["params"]), [])) for r in _per_step(records)]
    return [(r, sorted(found, key=lambda x: x["params"]["rank"])) for r, found in rows if found]


def breakdown_panel(ax, records, env) -> None:
    records = sorted(_per_step(records),
                     key=lambda r: (r["params"].get("world_size", 0), r["params"].get("num_local_experts", 0)))
    xs = list(range(len(records)))
    has_phases = any(value(r, p) is not None for r in records for p in PHASES)
    stacks = PHASES if has_phases else ("forward_ms", "backward_ms")
    width = 0.4 if has_phases else 0.6
    bottom = [0.0] * len(records)
    for name in stacks:
        heights = [value(r, name) or 0.0 for r in records]
        ax.bar([x - (width / 2 if has_phases else 0) for x in xs], heights, width, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if has_phases:
        other = [max(0.0, (value(r, "step_ms") or 0) - b) for r, b in zip(records, bottom)]
        ax.bar([x - width / 2 for x in xs], other, width, bottom=bottom, color="0.8", label="other")
        ax.bar([x + width / 2 for x in xs], [value(r, "step_ms") or 0 for r in records], width, label="step_ms")
    summaries = [(x, value(r, "summary_step_ms")) for x, r in zip(xs, records)]
    summaries = [(x, s) for x, s in summaries if s is not None]
    if summaries:
        ax.scatter(*zip(*summaries), marker="_", s=400, color="black", label="seed summary (mean)", zorder=3)
    ax.set_xticks(xs, labels(records), fontsize=7)
    ax.set(ylabel="ms per step (median over steps)", title="step time by phase")
    ax.legend(fontsize=7)


def _series(records: list[dict[str, Any]]) -> dict[str, list[tuple]]:
    """(experts per rank, step_ms, tflops) points per series: one series per value of the other parameters
    that vary (execution mode, backward thread, variant, ...), so that each line joins comparable records."""
    records = _per_step(records)
    others = varying_params(records, [k for k in KEY_PARAMS if k != "num_local_experts"])
    series: dict[str, list[tuple]] = {}
    for rec in records:
        experts = value(rec, "experts_per_rank") or value(rec, "num_local_experts")
        if experts is not None and value(rec, "step_ms") is not None:
            series.setdefault(_label(rec, others, ", "), []).append((experts, value(rec, "step_ms"),
                                                                    value(rec, "tflops")))
    return {name: sorted(points) for name, points in series.items()}


def experts_panel(ax, records, env) -> None:
    series = _series(records)
    if not series:
        return no_data(ax, "no step_ms / experts in these records")
    twin = ax.twinx() if any(p[2] is not None for points in series.values() for p in points) else None
    for i, (name, points) in enumerate(series.items()):
        suffix = f" [{name}]" if name else ""
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=f"C{2 * i}",
                label="step time (ms)" + suffix)
        if twin is not None:
            twin.plot([p[0] for p in points], [p[2] for p in points], marker="s", linestyle="--",
                      color=f"C{2 * i + 1}", label="TFLOP/s" + suffix)
    replicated = any(value(r, "experts_per_rank") is not None for r in records)
    xlabel = "experts per rank" + (" (incl. replicated slots)" if replicated else " (num_local_experts)")
    ax.set(xscale="log", xlabel=xlabel, ylabel="step time (ms)")
    ax.set_title("step time and TFLOP/s vs experts per rank")
    lines = ax.lines + (twin.lines if twin is not None else [])
    if twin is not None:
        twin.set_ylabel("TFLOP/s per GPU (dashed)")
    ax.legend(lines, [x.get_label() for x in lines], fontsize=7)
    dim_ticks(ax, [p[0] for points in series.values() for p in points])


def ranks_panel(ax, records, env) -> None:
    """Token blocks per rank (local vs pulled from other ranks), one group per configuration."""
    rows = _ranks_of(records)
    if not rows:
        return load_panel(ax, _per_step(records))
    width = 0.8 / max(len(ranks) for _, ranks in rows)
    for g, (_, ranks) in enumerate(rows):
        for i, rank in enumerate(ranks):
            total, remote = value(rank, "block_count"), value(rank, "remote_block_count") or 0
            x = g + (i - (len(ranks) - 1) / 2) * width
            ax.bar(x, total - remote, width * 0.9, color="C0", label="local blocks" if g == i == 0 else None)
            ax.bar(
                x,
                remote,
                width * 0.9,
                bottom=total - remote,
                color="C3",
                label="remote blocks" if g == i == 0 else None,
            )
    ax.set_xticks(range(len(rows)), labels([r for r, _ in rows]), fontsize=7)
    ax.set(ylabel="token blocks per rank", title="load per rank (bars: rank 0, 1, ...)")
    ax.legend(fontsize=7)


def load_panel(ax, records) -> None:
    """Load imbalance (busiest / mean) per configuration, for records without per-rank counts."""
    names = [n for n in LOAD if any(value(r, n) is not None for r in records)]
    if not names:
        return no_data(ax, "no load metrics in these records")
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(records))]
        ax.bar(xs, [value(r, name) or 0 for r in records], width * 0.9, label=name)
    ax.axhline(1, color="0.5", linewidth=0.8)
    ax.set_xticks(range(len(records)), labels(records), fontsize=7)
    ax.set(ylabel="busiest / mean", title="load imbalance")
    ax.legend(fontsize=7)


PANELS = (breakdown_panel, experts_panel, ranks_panel)
