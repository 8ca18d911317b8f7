"""`qbench export RUN --format pytest-benchmark|bmf|nvbench`: a run in the format another tool reads."""

from __future__ import annotations

import click

from qbench.exporters import FORMATS

EPILOG = """\b
Examples:
  qbench export results/switchback-h200-modes-c4c2232/run1 --format pytest-benchmark --out bench.json
  qbench export results/switchback-h200-modes-c4c2232/run1 --format bmf | bencher run --adapter json ...
  qbench export results/fragmented-h200-modes/run1 --format nvbench --out fragmented.nvbench.json
"""


@click.command(epilog=EPILOG)
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="pytest-benchmark: --benchmark-json layout (github-action-benchmark, tool 'pytest'); bmf: Bencher "
                   "Metric Format; nvbench: nvbench's JSON.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="File to write (default: stdout).")
def command(runs, fmt, out) -> None:
    """Write the ok records of RUNS (run directories, folders of runs or importable result files) as FORMAT:
    pytest-benchmark and nvbench take every time metric (seconds, as those tools count), bmf every metric in
    its own unit; the stored value, and the stored samples' statistics beside it."""
    import json
    import sys

    from qbench import report, tidy
    from qbench.exporters import WRITERS
    from qbench.importers import load_any

    target = None
    if out:
        from qbench.paths import check_writable_file

        target = check_writable_file(out, "export")
    envs = {str(path): load_any(path)[0] for path in tidy.run_paths(runs)}
    text = json.dumps(WRITERS[fmt](tidy.load(runs), envs), indent=2, default=str) + "\n"
    if target is None:
        sys.stdout.write(text)
        return
    target.write_text(text, encoding="utf-8")
    report.notice(f"wrote {target}", style="dim")
