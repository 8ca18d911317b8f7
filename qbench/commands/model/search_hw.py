"""`qbench model search-hw`: the power split of the device, searched by projected gradient descent."""

from __future__ import annotations

from pathlib import Path

import click

from qbench.commands.model.common import EPILOG, usage_errors, workload_options
from qbench.commands.model.values import parse_params, parse_sets
from qbench.errors import QbenchUsageError
from qbench.options import callback, out_options, parse_names


def parse_bounds(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition(":")
    try:
        bounds = (float(lo), float(hi)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 0 < bounds[0] < bounds[1] <= 1:
        raise QbenchUsageError(f"--bounds {text!r}: write LO:HI with 0 < LO < HI <= 1, e.g. 0.01:0.9")
    return bounds


@click.command("search-hw", epilog=EPILOG)
@workload_options
@click.option("--budget-key", type=click.Choice(("power_breakdown",)), default="power_breakdown",
              show_default=True, help="The budget whose split is searched.")
@click.option("--keys", callback=callback(parse_names(("core", "DRAM", "L2", "shared_mem", "IB"))),
              default="core,DRAM,L2,shared_mem", show_default=True, help="Fractions to search.")
@click.option("--starts", type=click.IntRange(min=1), default=4, show_default=True, help="Start 0 = config's split.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random starts.")
@click.option("--iterations", type=click.IntRange(min=1), default=60, show_default=True, help="Per start.")
@click.option("--bounds", default="0.01:0.9", show_default=True, metavar="LO:HI", help="Each fraction's range.")
@out_options
def search_hw(**opts) -> None:
    """Search how the power budget is split between core, DRAM, L2, shared memory (and IB) by projected
    gradient descent from several starts; report the best split, its time, memory fit and the path."""
    from qbench import report, store
    from qbench.benches.model import search as bench
    from qbench.commands.common import run_and_store
    from qbench.model import objective, search_hw

    with usage_errors():
        cfg, shape, (batch, seq) = bench.load_workload(opts["config_path"], parse_sets(opts["overrides"]),
                                                       opts["workload"], parse_params(opts["shape"]))
        budget = objective.time_budget(opts["time_budget"], opts["tokens"], opts["hours"], batch, seq)
        setup = search_hw.HwSearch(tuple(opts["keys"]), opts["starts"], opts["seed"], opts["iterations"],
                                   *parse_bounds(opts["bounds"]))
        outcome = bench.search_power(cfg, shape, setup)
    records = bench.step_records(outcome, opts["workload"], opts["config_path"], budget)
    out = Path(opts["out"] or store.default_run_dir("model"))
    run_and_store("model", setup, iter(records), total=len(records), out=str(out), append=opts["append"],
                  force=opts["force"], as_json=opts["as_json"], table=lambda recs: bench.hw_table(outcome, budget))
    from qbench.plots.model_search import plot_path

    report.notice(f"search path drawn in {plot_path(outcome, out / 'search-path.png', budget)}", style="dim")


COMMANDS = (search_hw,)
