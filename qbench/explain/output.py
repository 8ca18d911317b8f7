"""What `qbench explain` prints: rich tables, Markdown or JSON of one explained set of runs."""

from __future__ import annotations

import json
from dataclasses import asdict

from qbench.explain import summary, table
from qbench.explain.runs import Explained


def as_json(result: Explained, worst: int, by_metric: bool = False) -> str:
    named, due = summary.host_bound(result.records, result.cells)
    data = {"calibrations": result.calibrations,
            "groups": [asdict(g) for g in summary.groups(result.cells, by_metric)],
            "host_bound": {"named": named, "host_over_gpu": due},
            "below_bound": [asdict(c) for c in result.cells if c.below_bound],
            "worst": [asdict(c) for c in summary.worst(result.cells, worst)],
            "cells": [{**asdict(c), "ratio": c.ratio, "error": c.error} for c in result.cells]}
    return json.dumps(data, indent=2)


def notes(result: Explained) -> list[str]:
    named, due = summary.host_bound(result.records, result.cells)
    below = [c for c in result.cells if c.below_bound]
    lines = [f"eager steps whose host time exceeds their chained kernels: {due}, named host-bound: {named}"]
    if below:
        lines.append(f"{len(below)} cells measure faster than the hardware bound (a count or the timer is wrong), "
                     f"first: {below[0].case} {below[0].metric}")
    return lines


def show(result: Explained, worst: int, fmt: str | None, by_metric: bool = False) -> None:
    import click

    from qbench import report

    groups, cells = summary.groups(result.cells, by_metric), summary.worst(result.cells, worst)
    if fmt == "json":
        click.echo(as_json(result, worst, by_metric))
        return
    if fmt == "markdown":
        click.echo("\n".join([*table.markdown(groups, cells), "", *notes(result)]))
        return
    console = report.stdout_console()
    where = ", ".join(result.calibrations)
    console.print(table.group_table(groups, f"Predicted / measured on {where}", notes(result)))
    if cells:
        console.print(table.worst_table(cells, f"The {len(cells)} worst-predicted cells"))
