"""Helpers every figure module of qbench/plots uses: a metric's value, one dtype per panel, empty
panels, width ticks, a mean that skips missing values. The panel modules import these from here (not
from the package), so the package can import its panel modules at the top without an import loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DTYPE_ORDER = ("fp16", "bf16", "fp32", "float16", "bfloat16", "float32")


def value(record: dict[str, Any], name: str) -> float | None:
    """A metric, or a parameter when no metric has that name; None when absent."""
    got = record.get("metrics", {}).get(name)
    if got is None:
        got = record.get("params", {}).get(name)
    return got if isinstance(got, (int, float)) and not isinstance(got, bool) else None


def one_dtype(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """Records of a single dtype (the first of DTYPE_ORDER present), so lines do not mix dtypes."""
    dtypes = {r["params"].get("dtype") for r in records}
    if len(dtypes) <= 1:
        return records, next(iter(dtypes), None)
    chosen = min(dtypes, key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else 99)
    return [r for r in records if r["params"].get("dtype") == chosen], chosen


def no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="0.4", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def dim_ticks(ax, dims: Iterable[float]) -> None:
    """Plain-number ticks at the measured sizes of a log axis (not 2x10^3)."""
    from matplotlib.ticker import NullFormatter

    shown = sorted(set(dims))
    ax.set_xticks(shown, [str(int(d)) for d in shown], fontsize=7, rotation=45)
    ax.xaxis.set_minor_formatter(NullFormatter())


def mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None
