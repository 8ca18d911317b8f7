"""`qbench model`: the analytical model (DeepFlow LSTM, roofline floors, calibration, --against).

The group runs --against itself; each subcommand is a module here (lstm, quirks, search, search_hw,
floors with gemm, calibrate), and all of them import the model and the benches inside the command.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from qbench.commands.model import calibrate, floors, lstm, quirks, search, search_hw
from qbench.commands.model.common import EPILOG, gpu_options, usage_errors


@click.group(invoke_without_command=True, epilog=EPILOG)
@click.option("--against", "run", type=click.Path(), help="A stored run: add floor, bound, fraction of roofline.")
@gpu_options
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.pass_context
def command(ctx, run, gpu, calibrated, as_json) -> None:
    """How fast could it be? DeepFlow's LSTM language-model model, roofline floors of qbench's
    workloads, and (with --against RUN) every stored time next to its floor."""
    if ctx.invoked_subcommand is not None:
        return
    if not run:
        click.echo(ctx.get_help())
        return
    from qbench import report
    from qbench.benches.model import against

    with usage_errors():
        hw, rows = against.against(run, gpu, calibrated)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=2, default=str))
        return
    report.stdout_console().print(against.table(rows, hw))
    high = [r for r in rows if r.fraction > 1]
    if high:
        report.notice(f"{len(high)} measurements beat their floor: a flop/byte count is wrong or data sat in cache")


for module in (lstm, quirks, search, search_hw, floors, calibrate):
    for sub in module.COMMANDS:
        command.add_command(sub)
