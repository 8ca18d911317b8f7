"""`qbench train-check` figure: loss vs step per variant with the chain's entropy floor,
and each variant's final loss above the floor."""

from __future__ import annotations

from qbench.plots.base import no_data, value
from qbench.plots.block import COLORS


def _variants(records):
    return [r for r in records if r.get("samples", {}).get("loss_curve")]


def curve_points(record) -> tuple[list[int], list[float]]:
    """(last step of each window, its mean loss): the curve is stored one mean per curve_every steps."""
    every = int(value(record, "curve_every") or 1)
    losses = record["samples"]["loss_curve"]
    steps = record["params"].get("steps") or len(losses) * every
    return [min((i + 1) * every, steps) for i in range(len(losses))], losses


def curves_panel(ax, records, env) -> None:
    shown = _variants(records)
    if not shown:
        return no_data(ax, "no loss curves in these records")
    for rec in shown:
        steps, losses = curve_points(rec)
        variant = rec["params"]["variant"]
        ax.plot(steps, losses, marker=".", linewidth=1.2, label=variant, color=COLORS.get(variant))
    floor = value(shown[0], "entropy_floor")
    if floor is not None:
        ax.axhline(floor, color="0.3", linestyle="--", linewidth=1, label=f"entropy floor {floor:.3f}")
    p = shown[0]["params"]
    ax.set(xlabel="step", ylabel="cross-entropy (nats / token)", yscale="log",
           title=f"{p.get('preset')}: {p.get('layers')} blocks, width {p.get('width')}, {p.get('dtype')}")
    ax.legend(fontsize=7)


def gap_panel(ax, records, env) -> None:
    shown = [r for r in records if value(r, "gap_to_floor") is not None]
    if not shown:
        return no_data(ax, "no final losses in these records")
    names = [r["params"]["variant"] for r in shown]
    gaps = [value(r, "gap_to_floor") for r in shown]
    bars = ax.bar(names, gaps, color=[COLORS.get(n) for n in names])
    for bar, rec in zip(bars, shown):
        gap = value(rec, "gap_to_reference")
        if gap is not None:
            ax.annotate(f"{gap:+.4f} vs 16bit", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    ax.set(ylabel="final loss - entropy floor (nats)", title="final loss above the floor (mean of the last 10%)")


PANELS = (curves_panel, gap_panel)
