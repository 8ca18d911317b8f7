"""`qbench report RUN... --html FILE`: one self-contained HTML page of runs, to attach to a pull request."""

from __future__ import annotations

import click

from qbench.options import case_filter_option, digits_option, metrics_option, strict_option

EPILOG = """\b
Examples:
  qbench report results/switchback-h200-modes-c4c2232/run1 --html runs/switchback.html
  qbench report results/switchback-h200-modes/run1 results/switchback-h200-modes-c4c2232/run1 \\
      --metric kernels_ms --html runs/compare.html
  qbench report results/switchback-h200-modes/run{1,2,3} results/switchback-h200-modes-c4c2232/run{1,2,3} \\
      --metric kernels_ms --html runs/history.html        # several commits: the history too
"""


@click.command(epilog=EPILOG)
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--html", "out", type=click.Path(dir_okay=False), required=True, help="The HTML file to write.")
@metrics_option("A metric to show (repeatable; a shell-style pattern: every metric it matches). "
                "[default: every metric with stored samples]")
@case_filter_option()
@digits_option
@strict_option
def command(runs, out, metrics, pattern, digits) -> None:
    """Write one HTML page of RUNS that opens anywhere without a network: the environment, the tables
    `qbench summary` prints, the standard figures (inline SVG), the comparison against the first run when
    several are given, and the history over commits when the runs span several. No script, no external
    file, no font."""
    from qbench import metric_names, report
    from qbench.analysis import compare, html_report
    from qbench.paths import check_writable_file

    target = check_writable_file(out, "report")
    loaded = [compare.load_any(r) for r in runs]
    wanted = metric_names.expand(metrics, metric_names.of(rec for run in loaded for rec in run.records))
    target.write_text(html_report.page(loaded, wanted, tuple(pattern), digits), encoding="utf-8")
    report.notice(f"wrote {target}", style="dim")
