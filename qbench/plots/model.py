"""Analytical-model figure: each component's time and its share, and the memory breakdown against
the modelled device's capacity."""

from __future__ import annotations

from typing import Any

from qbench import units
from qbench.plots.base import no_data, value

TOTALS = ("time_s", "step_budget_s")  # whole-run times: not components
MEMORY_BY_LAYER = ("memory_embedding_gb", "memory_hidden_gb", "memory_softmax_gb", "memory_projection_gb")
MEMORY_BY_KIND = ("memory_weight_gb", "memory_activation_gb", "memory_pointwise_gb")
COLOURS = {name: f"C{i}" for i, name in enumerate(MEMORY_BY_LAYER + MEMORY_BY_KIND)}
CAPACITY_KEYS = ("memory_capacity_gb", "memory_size_gb")


def _first_with(records: list[dict[str, Any]], unit: str) -> dict[str, Any] | None:
    return next((r for r in records if any(u == unit for u in r.get("units", {}).values())), None)


def components_panel(ax, records, env) -> None:
    """Component times (s) as bars with their share of the components' sum."""
    rec = _first_with(records, units.S)
    if rec is None:
        return no_data(ax, "no component times (s) in these records")
    parts = [(k, v) for k, v in rec["metrics"].items() if rec["units"].get(k) == units.S and k not in TOTALS and v]
    parts.sort(key=lambda kv: kv[1])
    total = sum(v for _, v in parts)
    bars = ax.barh([k for k, _ in parts], [v for _, v in parts], color="C0")
    for bar, (_, v) in zip(bars, parts):
        ax.text(
            bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {100 * v / total:.1f}%", va="center", fontsize=7
        )
    ax.set(xscale="log", xlabel="time (s, log scale)")
    time_s = value(rec, "time_s")
    suffix = f", Time = {time_s:.1f} s" if time_s is not None else ""
    workload = rec["params"].get("workload", "model")
    ax.set_title(f"{workload}: per-call component times, % of their sum{suffix}", fontsize=9)


def capacity(rec: dict[str, Any], env: dict[str, Any]) -> float | None:
    for key in CAPACITY_KEYS:
        found = value(rec, key)
        if found is None:
            found = (env.get("hardware") or {}).get(key)
        if found:
            return float(found)
    return None


def memory_panel(ax, records, env) -> None:
    """Two stacked bars (by layer, by kind) against the device capacity line."""
    rec = _first_with(records, units.GB)
    if rec is None:
        return no_data(ax, "no memory breakdown (GB) in these records")
    for x, names in enumerate((MEMORY_BY_LAYER, MEMORY_BY_KIND)):
        bottom = 0.0
        for name in names:
            height = value(rec, name)
            if height:
                ax.bar(x, height, 0.6, bottom=bottom, label=name[len("memory_") : -len("_gb")], color=COLOURS[name])
                bottom += height
    cap = capacity(rec, env)
    if cap:
        ax.axhline(cap, color="red", linestyle="--", label=f"capacity {cap:.1f} GB")
    total = value(rec, "memory_total_gb")
    title = f"memory per data shard: {total:.1f} GB" if total is not None else "memory per data shard"
    if total is not None and cap:
        title += f" = {total / cap:.1f}x capacity"
    ax.set_xticks([0, 1], ["by layer", "by kind"])
    ax.set(ylabel="GB (2^30 bytes)", title=title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


PANELS = (components_panel, memory_panel)
