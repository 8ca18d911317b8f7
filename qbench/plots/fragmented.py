"""FragmentedLinear figure: forward time, backward (+ optimizer) time and peak memory per shape,
one line per (variant, task, fragments) and, where a run varies them, execution mode and backward thread;
the dense baseline in black."""

from __future__ import annotations

from typing import Any

from qbench.plots.base import no_data, one_dtype, value
from qbench.store import varying_params

# Colour maps per (variant, task): fragment counts get darker shades of the same colour.
CMAPS = {
    ("fragmented", "train"): "Blues",
    ("fragmented", "eval"): "Greens",
    ("fragmented", "inference"): "Oranges",
    ("blockdiag", None): "Purples",
    ("lowrank", None): "Greys",
}


def shape_key(record: dict[str, Any]) -> tuple[int, int, int]:
    p = record["params"]
    return (p.get("in_features", 0), p.get("out_features", 0), p.get("batch_size", 0))


def shape_label(key: tuple[int, int, int]) -> str:
    in_f, out_f, batch = key
    size = str(in_f) if in_f == out_f else f"{in_f}x{out_f}"
    return f"{size}\nb={batch}"


# Parameters that split a variant's line when a run varies them: each execution mode and backward thread
# is its own line (their times differ), told apart by marker (linestyle for the dense baseline).
SPLIT_PARAMS = ("exec", "backward_thread")
MARKERS, BASELINE_STYLES = ("o", "^", "D", "v", "P", "X"), ("-", ":", "-.", "--", (0, (1, 3)), (0, (5, 1)))


def series(records: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Records grouped by line: (variant, task, fragments, split), split naming the SPLIT_PARAMS values
    where the records differ in them ("" otherwise)."""
    varying = varying_params(records, SPLIT_PARAMS)
    lines: dict[tuple, list[dict[str, Any]]] = {}
    for rec in records:
        p = rec["params"]
        split = " ".join(str(p.get(k)) for k in varying)
        lines.setdefault((p.get("variant"), p.get("task"), p.get("fragments", 0), split), []).append(rec)
    return lines


def _line_order(item) -> tuple:
    (variant, task, count, split), _ = item
    return (variant != "dense", str(variant), str(task), count or 0, split)


def _style(variant: str, task: str, fragments: int, all_fragments: list[int], split: int = 0):
    from matplotlib import colormaps

    if variant == "dense":
        return {"color": "black", "linewidth": 2.5, "marker": "s",
                "linestyle": BASELINE_STYLES[split % len(BASELINE_STYLES)]}
    cmap = colormaps[CMAPS.get((variant, task), CMAPS.get((variant, None), "Reds"))]
    shade = 0.35 + 0.6 * (all_fragments.index(fragments) / max(1, len(all_fragments) - 1)) if fragments else 0.7
    return {"color": cmap(shade), "linewidth": 1.2, "marker": MARKERS[split % len(MARKERS)],
            "linestyle": "--" if task != "train" else "-"}


def _metric_panel(ax, records, metric: str, ylabel: str) -> None:
    records, dtype = one_dtype([r for r in records if value(r, metric) is not None])
    if not records:
        return no_data(ax, f"no {metric} in these records")
    shapes = sorted({shape_key(r) for r in records})
    fragments = sorted({r["params"].get("fragments", 0) for r in records if r["params"].get("fragments")})
    lines = series(records)
    splits = sorted({key[3] for key in lines})
    for (variant, task, count, split), recs in sorted(lines.items(), key=_line_order):
        points = sorted((shapes.index(shape_key(r)), value(r, metric)) for r in recs)
        label = variant if variant == "dense" else f"{variant} {task} N={count}" if count else f"{variant} {task}"
        label += f" [{split}]" if split else ""
        ax.plot(*zip(*points), label=label, **_style(variant, task, count, fragments, splits.index(split)))
    ax.set_xticks(range(len(shapes)), [shape_label(s) for s in shapes], fontsize=7)
    ax.set(yscale="log", ylabel=ylabel, title=f"{metric} ({dtype})")
    ax.legend(fontsize=6, ncol=2)


def forward_panel(ax, records, env) -> None:
    _metric_panel(ax, records, "forward_ms", "forward (ms)")


def backward_panel(ax, records, env) -> None:
    """backward_optimizer_ms (zero_grad + backward + Adam: the seed's "Backward time") when present."""
    has_combined = any(value(r, "backward_optimizer_ms") is not None for r in records)
    metric = "backward_optimizer_ms" if has_combined else "backward_ms"
    _metric_panel(ax, records, metric, "backward + optimizer (ms)" if has_combined else "backward (ms)")


def memory_panel(ax, records, env) -> None:
    _metric_panel(ax, records, "peak_memory_mb", "peak memory (MB)")


PANELS = (forward_panel, backward_panel, memory_panel)
