"""`qbench export RUN --format pytest-benchmark|bmf|nvbench`: a run in the format another tool reads."""

from __future__ import annotations

import click

from qbench.exporters import FORMATS
from qbench.options import strict_option

EPILOG = """\b
Examples:
  qbench export results/switchback-h200-modes-c4c2232/run1 --format pytest-benchmark --out bench.json
  qbench export results/switchback-h200-modes-c4c2232/run1 --format bmf | bencher run --adapter json ...
  qbench export results/fragmented-h200-clocks-797e89f/run1 --format nvbench --out fragmented.nvbench.json
"""


@click.command(epilog=EPILOG)
@click.argument("run", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="pytest-benchmark: --benchmark-json layout (github-action-benchmark, tool 'pytest'); bmf: Bencher "
                   "Metric Format; nvbench: nvbench's JSON.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="File to write (default: stdout).")
@strict_option
def command(run, fmt, out) -> None:
    """Write the ok records of RUN (a run directory or an importable result file) as FORMAT: pytest-benchmark
    and nvbench take every time metric (seconds, as those tools count), bmf every metric in its own unit; the
    stored value, and the stored samples' statistics beside it. One run per file: the tools read a file as
    one run of their own."""
    import json
    import sys

    from qbench import report, tidy
    from qbench.errors import QbenchUsageError
    from qbench.exporters import WRITERS
    from qbench.importers import load_any

    target = None
    if out:
        from qbench.paths import check_writable_file

        target = check_writable_file(out, "export")
    paths = tidy.run_paths(run)
    if len(paths) != 1:
        raise QbenchUsageError(f"{run} holds {len(paths)} runs; export one run per file (e.g. {paths[0]})")
    text = json.dumps(WRITERS[fmt](tidy.load(paths), {str(paths[0]): load_any(paths[0])[0]}), indent=2,
                      default=str) + "\n"
    if target is None:
        sys.stdout.write(text)
        return
    target.write_text(text, encoding="utf-8")
    report.notice(f"wrote {target}", style="dim")
