"""The tables of `qbench explain`: the error per family and kind, and the worst cells with the model's reason."""

from __future__ import annotations

from collections.abc import Sequence

from qbench.explain import Cell
from qbench.explain.summary import Group

GROUP_HEADERS = ("family", "kind", "exec", "cells", "median err", "p90 err", "pred/meas", "target", "met")
WORST_HEADERS = ("case", "metric", "measured ms", "predicted ms", "pred/meas", "limit", "reason")


def _met(g: Group) -> str:
    return "" if g.met is None else "yes" if g.met else "no"


def group_rows(groups: Sequence[Group]) -> list[list[str]]:
    return [[g.family, g.kind, g.exec, str(g.cells), f"{g.median:.1%}", f"{g.p90:.1%}", f"{g.ratio:.3f}",
             g.target, _met(g)] for g in groups]


def worst_rows(cells: Sequence[Cell]) -> tuple[list[list[str]], str]:
    """Rows of the worst cells, each case shown by the params that differ between them (and those shared)."""
    from qbench.report import case_labels, format_value

    labels, shared = case_labels(cells)
    rows = [[labels[(c.bench, c.case)], c.metric, format_value(c.measured_ms), format_value(c.predicted_ms),
             f"{c.ratio:.3f}", c.limit, c.reason] for c in cells]
    return rows, shared


def group_table(groups: Sequence[Group], title: str, notes: Sequence[str] = ()):
    from qbench.report import Column, FittedTable

    columns = [Column(h, justify="left", key=i < 3) if i < 3 else Column(h) for i, h in enumerate(GROUP_HEADERS)]
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

    rows, shared = worst_rows(cells)
    return [*markdown_table(GROUP_HEADERS, group_rows(groups)), "",
            *markdown_table(WORST_HEADERS, rows)] + ([f"\nevery case: {shared}"] if shared else [])
