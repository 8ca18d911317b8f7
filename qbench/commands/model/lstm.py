"""`qbench model lstm`: DeepFlow's report of one config, or a table of a sweep; one record per point."""

from __future__ import annotations

import click

from qbench.commands.model.common import EPILOG, budget_options, config_options, deepflow_option, usage_errors
from qbench.commands.model.values import parse_sets, parse_sweep
from qbench.options import out_options


@click.command(epilog=EPILOG)
@config_options
@click.option("--debug", is_flag=True, help="Print DeepFlow's per-kernel lines too.")
@click.option("--sweep", metavar="SECTION.KEY=V1,V2,...", help="Evaluate once per value.")
@deepflow_option("exact")
@budget_options
@out_options
def lstm(config_path, overrides, debug, sweep, mode, time_budget, tokens, hours, out, append, force,
         as_json) -> None:
    """DeepFlow's LSTM language-model step time, memory and parameters, with DeepFlow's report (exact:
    to the printed digit). With a time budget the report ends with its time_per_step line."""
    from qbench.benches.model import lstm as bench
    from qbench.model import deepflow
    from qbench.runner import run_and_store

    with usage_errors():
        sets = parse_sets(overrides)
        run = bench.LstmRun(config_path, sets, *parse_sweep(sweep), debug, mode, (time_budget, tokens, hours))
        evaluations = bench.evaluate_all(run)
    if len(evaluations) == 1 and not as_json:
        click.echo("\n".join(deepflow.report_lines(evaluations[0].result, time_per_step=evaluations[0].budget_s)))
    records = [bench.record(e, run) for e in evaluations]
    shares = {rec["case"]: e.result.components.shares for rec, e in zip(records, evaluations)}
    run_and_store("model", run, iter(records), total=len(records), out=out, append=append, force=force,
                  as_json=as_json, table=lambda recs: bench.summary(recs, shares))


COMMANDS = (lstm,)
