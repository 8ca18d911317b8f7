"""`qbench model search`: parallelism strategies x topologies for N devices, ranked by predicted time."""

from __future__ import annotations

import json

import click

from qbench.commands.model.common import EPILOG, deepflow_option, usage_errors, workload_options
from qbench.commands.model.values import parse_count, parse_params, parse_sets
from qbench.options import callback, parse_names


@click.command(epilog=EPILOG)
@workload_options
@click.option("--devices", callback=callback(parse_count), required=True, help="Number of devices (1 to 4096).")
@click.option("--topologies", callback=callback(parse_names(("ring", "mesh"))), default="mesh",
              show_default=True, help="Comma list of ring, mesh (one device has none).")
@deepflow_option("corrected")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True, help="Rows to show.")
@click.option("--json", "as_json", is_flag=True, help="Print the ranking as JSON.")
def search(config_path, overrides, workload, shape, time_budget, tokens, hours, devices, topologies, mode, top,
           as_json) -> None:
    """Rank parallelism strategies x topologies for N devices by predicted step time (corrected DeepFlow
    unless --deepflow exact; a warning when exact mode would rank another strategy first); mark those
    that do not fit in memory or miss the time budget."""
    from qbench import report
    from qbench.benches.model import search as bench
    from qbench.model.objective import time_budget as budget_of

    with usage_errors():
        cfg, model, (batch, seq) = bench.load_workload(config_path, parse_sets(overrides), workload,
                                                       parse_params(shape))
        budget = budget_of(time_budget, tokens, hours, batch, seq)
        ranking = bench.rank(cfg, model, devices, topologies, mode)
    if as_json:
        click.echo(json.dumps(bench.ranking_json(ranking, budget), indent=2))
    else:
        report.stdout_console().print(bench.strategy_table(ranking, devices, workload, top, budget))
    report.notice(bench.mode_notice(ranking), style="yellow" if ranking.top_changes else "dim")


COMMANDS = (search,)
