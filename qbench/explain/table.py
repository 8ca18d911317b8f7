"""The tables of `qbench explain`: the error per family and kind, and the worst cells with the model's reason."""

from __future__ import annotations

from collections.abc import Sequence

from qbench.explain import Cell
from qbench.explain.summary import Group

GROUP_HEADERS = ("family", "kind", "exec", "cells", "median err", "p90 err", "pred/meas", "target", "met")
KEYS = 3  # the columns that name a group (with a metric column after them where groups are per metric)
WORST_HEADERS = ("case", "metric", "measured ms", "predicted ms", "pred/meas", "limit", "reason")


def _met(g: Group) -> str:
    return "" if g.met is None else "yes" if g.met else "no"


def _per_metric(groups: Sequence[Group]) -> bool:
    return any(g.metric for g in groups)


def group_headers(groups: Sequence[Group]) -> list[str]:
    extra = ["metric"] if _per_metric(groups) else []
    return [*GROUP_HEADERS[:KEYS], *extra, *GROUP_HEADERS[KEYS:]]


def group_rows(groups: Sequence[Group]) -> list[list[str]]:
    extra = _per_metric(groups)
    return [[g.family, g.kind, g.exec, *([g.metric] if extra else []), str(g.cells), f"{g.median:.1%}",
             f"{g.p90:.1%}", f"{g.ratio:.3f}", g.target, _met(g)] for g in groups]


def worst_rows(cells: Sequence[Cell]) -> tuple[list[list[str]], str]:
    """Rows of the worst cells, each case shown by the params that differ between them (and those shared)."""
    from qbench.report import case_labels, format_value

    labels, shared = case_labels(cells)
    rows = [[labels[(c.bench, c.case)], c.metric, format_value(c.measured_ms), format_value(c.predicted_ms),
             f"{c.ratio:.3f}", c.limit, c.reason] for c in cells]
    return rows, shared


def group_table(groups: Sequence[Group], title: str, notes: Sequence[str] = ()):
    from qbench.report import Column, FittedTable

    headers = group_headers(groups)
    keys = len(headers) - len(GROUP_HEADERS) + KEYS
    columns = [Column(h, justify="left", key=True) if i < keys else Column(h) for i, h in enumerate(headers)]
    legend = "err: |predicted / measured - 1|; pred/meas: median ratio (above 1: model slower)"
    return FittedTable(columns, group_rows(groups), title=title, notes=[legend, *notes])


def worst_table(cells: Sequence[Cell], title: str):
    from qbench.report import Column, FittedTable

    rows, shared = worst_rows(cells)
    columns = [Column("case", justify="left", key=True, wrap=True), Column("metric", justify="left", key=True),
               Column("measured ms"), Column("predicted ms"), Column("pred/meas"), Column("limit", justify="left"),
               Column("reason", justify="left", wrap=True)]
    return FittedTable(columns, rows, title=title, notes=[f"every case: {shared}"] if shared else [])


def markdown(groups: Sequence[Group], cells: Sequence[Cell]) -> list[str]:
    from qbench.report import markdown_table

    lines = markdown_table(group_headers(groups), group_rows(groups))
    if not cells:
        return lines
    rows, shared = worst_rows(cells)
    return [*lines, "", *markdown_table(WORST_HEADERS, rows)] + ([f"\nevery case: {shared}"] if shared else [])
