"""SwitchBack figure: the original two panels (times at one M; % saved per M) plus the speed-ups of
SwitchBack and its int8 / fp8 peers, from the kernel sums (tidy records of timing per_kernel). "dim" is the
layer width min(dim_in, dim_out); each point averages the up-projection (switch false) and the
down-projection (switch true), as the original did.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from qbench.plots.base import dim_ticks, mean, no_data, one_dtype, value

DIM_LABEL = "dim = min(dim_in, dim_out); mean of up/down projections"
FOCUS_M = 32768  # the original plot's M (tokens) for the time panel
SAVED_MS = (16384, 32768, 65536, 131072)  # the original plot's M lines for the % saved panel
KERNELS = {"exec": "eager", "timing": "per_kernel"}  # the kernel sums' records
TOTALS = (("16bit", "16-bit total"), ("switchback", "SwitchBack (global) total"))  # kernels_ms of each
COMPONENTS = (
    ("16bit", "fwd_ms"), ("16bit", "gw_ms"), ("16bit", "gx_ms"), ("switchback", "fwd_ms"), ("switchback", "bwd_ms"),
    ("switchback", "quantize_x_ms"), ("switchback", "quantize_g_ms"), ("switchback", "quantize_w_ms"),
    ("switchback", "quantize_w_t_ms"),
)  # (variant, metric) of the original plot's component lines
SPEEDUPS = (
    ("switchback", "SwitchBack global (int8)"),
    ("switchback_rowwise", "SwitchBack rowwise (int8)"),
    ("int8_cublas", "torch._int_mm int8"),
    ("fp8", "fp8 (SwitchBack's kernels)"),
    ("fp8_cublas", "fp8 (torch._scaled_mm)"),
)  # kernels_speedup of each


def _dim(record: dict[str, Any]) -> int:
    return min(record["params"]["dim_in"], record["params"]["dim_out"])


def of_variant(records: list[dict[str, Any]], variant: str) -> list[dict[str, Any]]:
    """The kernel-sum records of one variant."""
    return [r for r in records if r["params"].get("variant") == variant
            and all(r["params"].get(k) == v for k, v in KERNELS.items())]


def by_dim(records: list[dict[str, Any]], metric: str, batch: int) -> tuple[list[int], list[float]]:
    """(dims, mean over up/down projections) of one metric at one M; dims without it are skipped."""
    groups: dict[int, list[float | None]] = defaultdict(list)
    for rec in records:
        if rec["params"].get("batch_size") == batch:
            groups[_dim(rec)].append(value(rec, metric))
    points = [(d, mean(v)) for d, v in sorted(groups.items())]
    points = [(d, v) for d, v in points if v is not None]
    return [d for d, _ in points], [v for _, v in points]


def focus_batch(records: list[dict[str, Any]]) -> int | None:
    """FOCUS_M when measured, else the largest M (the regime the layer is meant for)."""
    batches = {r["params"].get("batch_size") for r in records}
    return FOCUS_M if FOCUS_M in batches else max((b for b in batches if b), default=None)


def times_panel(ax, records, env) -> None:
    records, dtype = one_dtype(records)
    batch = focus_batch(records)
    if batch is None:
        return no_data(ax, "no switchback records")
    for variant, label in TOTALS:
        dims, values = by_dim(of_variant(records, variant), "kernels_ms", batch)
        if dims:
            ax.plot(dims, values, marker="o", linewidth=2.5, label=label)
    for variant, name in COMPONENTS:
        dims, values = by_dim(of_variant(records, variant), name, batch)
        if dims:
            ax.plot(dims, values, marker=".", linewidth=1, linestyle="--", label=f"{variant} {name}")
    ax.set(xscale="log", yscale="log", xlabel=DIM_LABEL, ylabel="time (ms)", title=f"M = {batch}, {dtype}")
    dim_ticks(ax, {_dim(r) for r in records})
    ax.legend(fontsize=6, ncol=2)


def saved_panel(ax, records, env) -> None:
    records, dtype = one_dtype(records)
    batches = sorted({r["params"].get("batch_size") for r in records})
    chosen = [b for b in SAVED_MS if b in batches] or batches[-4:]
    for batch in chosen:
        dims, values = by_dim(of_variant(records, "switchback"), "kernels_pct_saved", batch)
        if dims:
            ax.plot(dims, values, marker="o", label=f"M = {batch}")
    if not ax.lines:
        return no_data(ax, "no kernels_pct_saved of variant switchback in these records")
    ax.axhline(0, color="0.5", linewidth=0.8)
    ax.set(xscale="log", xlabel=DIM_LABEL, ylabel="% time saved", title=f"SwitchBack (global) vs 16-bit, {dtype}")
    dim_ticks(ax, {_dim(r) for r in records})
    ax.legend(fontsize=7)


def speedup_panel(ax, records, env) -> None:
    records, dtype = one_dtype(records)
    batch = focus_batch(records)
    missing = []
    for variant, label in SPEEDUPS:
        dims, values = by_dim(of_variant(records, variant), "kernels_speedup", batch) if batch else ([], [])
        if dims:
            ax.plot(dims, values, marker="o", label=label)
        else:
            missing.append(label)
    if not ax.lines:
        return no_data(ax, "no speed-up metrics in these records")
    ax.axhline(1, color="0.5", linewidth=0.8)
    ax.set(xscale="log", xlabel=DIM_LABEL, ylabel="speed-up over 16-bit (x)", title=f"speed-ups, M = {batch}, {dtype}")
    dim_ticks(ax, {_dim(r) for r in records})
    if missing:
        ax.text(0.02, 0.02, "not in this run: " + ", ".join(missing), transform=ax.transAxes, fontsize=6)
    ax.legend(fontsize=7)


PANELS = (times_panel, saved_panel, speedup_panel)
