"""`qbench history RUN...`: each case's metric over commits, with its spread and change points."""

from __future__ import annotations

import sys

import click

from qbench.options import case_filter_option, digits_option, metrics_option, strict_option

EPILOG = """\b
Examples:
  qbench history results/switchback-h200-modes/run{1,2,3} results/switchback-h200-modes-c4c2232/run{1,2,3} \\
      --metric kernels_ms -k variant=switchback
  qbench history runs/* --metric step_ms -k exec=graph -k batch_size=32768 --only-changed
  qbench history runs/* --metric kernels_ms --fail-on kernels_ms:5 --plot history.svg   # exit 1 on a regression
"""


@click.command(epilog=EPILOG)
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@metrics_option("A metric to follow (repeatable; a shell-style pattern: every metric it matches). "
                "[default: every metric with stored samples]")
@case_filter_option()
@click.option("--threshold", default="5%", show_default=True,
              help="The smallest step called a change (the runs' own spread raises it where wider).")
@click.option("--fail-on", multiple=True, metavar="METRIC:PCT",
              help="Exit 1 when METRIC at the latest revision is worse ('+') than at the one before by more than PCT.")
@click.option("--only-changed", is_flag=True, help="Show only series with a change point.")
@click.option("--plot", "plot", type=click.Path(dir_okay=False), default=None,
              help="Draw the series into this figure (.png, .svg or .pdf).")
@digits_option
@click.option("--markdown", "fmt", flag_value="markdown", help="Print a Markdown table.")
@click.option("--json", "fmt", flag_value="json", help="Print JSON.")
@strict_option
def command(runs, metrics, pattern, threshold, fail_on, only_changed, plot, digits, fmt) -> None:
    """Follow each case's metric over the code revisions RUNS were made on: runs grouped by commit (a dirty
    tree by its source hash too), ordered
    as git orders the commits where the repository is at hand (else by the runs' recorded times); runs of
    different GPUs never share a series. A point is the median over a commit's runs with the lowest and
    highest run (one run: p20-p80 of its samples). Change rule, point against the point before: the step
    must exceed the noise floor, the larger of --threshold and either point's spread width, and the two must
    differ beyond chance: Mann-Whitney U p < 0.05 on their samples (pooled over each commit's runs), or,
    without samples, no overlap of the runs. Markers: + worse, - better (^ up, v down for a unit with no better
    side), ~ beyond the floor but not shown to differ, = within it."""
    from qbench import metric_names, report
    from qbench.analysis import compare, compare_gate, history, history_output

    threshold_pct = compare_gate.parse_threshold(threshold)
    gates = compare_gate.parse_fail_on(fail_on)
    if plot:
        from qbench.plots import check_figure_path

        plot = check_figure_path(plot)
    loaded = [compare.load_any(r) for r in runs]
    known = metric_names.of(rec for run in loaded for rec in run.records)
    wanted = metric_names.expand(metrics, known)
    compare_gate.require_metrics(loaded, wanted, gates)
    # a gated metric is always followed: with no --metric, the gated ones are the table
    result = history.build(loaded, list(dict.fromkeys([*wanted, *(name for name, _ in gates)])), tuple(pattern),
                           threshold_pct)
    history.require_gates_judgeable(result, gates)
    history_output.show(result, fmt, digits, only_changed)
    if plot:
        from qbench.plots import history as history_figure

        history_figure.save(result, plot)
        report.notice(f"wrote {plot}", style="dim")
    hits = history.regressions(result, gates)
    for series, point in hits:
        report.notice(f"regression beyond --fail-on at {point.revision}: {series.metric} "
                      f"{report.format_change(point.step_pct)} ({series.bench}, {series.params})", style="bold red")
    if hits:
        sys.exit(1)
