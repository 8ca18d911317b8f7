"""`qbench explain RUN...`: the model's predicted time of every timed metric beside the measured one, the
limit that binds, and the model's error per family."""

from __future__ import annotations

import click

from qbench.options import case_filter_option

EPILOG = """\b
Examples:
  qbench explain results/switchback-h200-modes-c4c2232/run1
  qbench explain results/switchback-h100-modes -k variant=16bit --worst 20 --by-metric
  qbench explain results/switchback-h200-modes-c4c2232/run1 --calibrated results/model-calibration-h200.yaml --json
"""


@click.command(epilog=EPILOG)
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@case_filter_option()
@click.option("--calibrated", type=click.Path(dir_okay=False), default=None,
              help="Calibration file to predict from [default: results/model-calibration-<the run's GPU>.yaml].")
@click.option("--worst", type=click.IntRange(0, 1000), default=10, show_default=True,
              help="How many of the worst-predicted cells to list.")
@click.option("--by-metric", is_flag=True, help="A group per metric too (which component the error is in).")
@click.option("--markdown", "fmt", flag_value="markdown", help="Print Markdown tables to paste.")
@click.option("--json", "fmt", flag_value="json", help="Print every cell and group as JSON.")
def command(runs, pattern, calibrated, worst, by_metric, fmt) -> None:
    """Per family and kind of cell (kernel components, their sum, steps by exec, MoE phases) the median and
    p90 of |predicted / measured - 1| against the model's targets, then the worst cells with the limit that
    binds them (compute, memory, launch, host, link) and the model's reason. Predictions use the calibrated
    rates of the run's GPU only; a measurement faster than the hardware bound is flagged."""
    from qbench.analysis.patterns import matcher
    from qbench.explain import output
    from qbench.explain import runs as explained

    result = explained.explain(runs, calibrated, matcher(pattern))
    output.show(result, worst, fmt, by_metric)
