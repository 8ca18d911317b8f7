"""`qbench plot RUN [RUN ...]`: the standard figure of each bench, from stored records."""

from __future__ import annotations

import click

from qbench.options import strict_option

EPILOG = """\b
Examples:
  qbench plot results/switchback-h200-modes-c4c2232/run1 --out switchback.png
  qbench plot results/moe-h200x4-static-8518c40/run{1,2,3} --out moe.svg   # side by side
  qbench plot tests/fixtures/seed_bnb_info.jsonl --out a100.png   # a seed file, imported on the fly
  qbench plot results/fragmented-h200-clocks-797e89f/run1 --out fragmented.pdf
"""


@click.command(epilog=EPILOG)
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Figure file; .png, .svg or .pdf (default: runs/plots/<first run>-<bench>.png).",
)
@strict_option
def command(runs: tuple[str, ...], out: str | None) -> None:
    """Draw the standard figure of each bench for RUNS (run directories or seed result files):
    switchback: times per component, % saved per M, int8/fp8 speed-ups; moe: step time by phase,
    experts per rank, load per rank; fragmented: forward, backward and memory against the dense
    baseline; model: component shares and memory against capacity. Several runs: side by side."""
    from qbench import plots, report

    path = plots.plot_run(list(runs), out)
    report.notice(f"wrote {path}", style="dim")
