"""`qbench model search-hw`: the power split of the device, searched by projected gradient descent."""

from __future__ import annotations

from pathlib import Path

import click

from qbench.commands.model.common import EPILOG, deepflow_option, usage_errors, workload_options
from qbench.commands.model.values import parse_bounds, parse_params, parse_sets
from qbench.options import callback, out_options, parse_names


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
@click.option("--must-fit/--no-must-fit", default=True, show_default=True,
              help="Only splits whose memory holds the model (DRAM share at least the fitting one).")
@deepflow_option("corrected")
@out_options
def search_hw(**o) -> None:
    """Search how the power budget is split between core, DRAM, L2, shared memory (and IB) by projected
    gradient descent from several starts, among the splits whose memory holds the model unless
    --no-must-fit; report the best split, its time, memory fit and the path."""
    from qbench import report, store
    from qbench.benches.model import search as bench
    from qbench.commands.limits import check_search_steps
    from qbench.model import objective, search_hw
    from qbench.runner import run_and_store

    check_search_steps(o["starts"], o["iterations"])

    with usage_errors():
        cfg, shape, (batch, seq) = bench.load_workload(o["config_path"], parse_sets(o["overrides"]), o["workload"],
                                                       parse_params(o["shape"]))
        budget = objective.time_budget(o["time_budget"], o["tokens"], o["hours"], batch, seq)
        setup = search_hw.HwSearch(tuple(o["keys"]), o["starts"], o["seed"], o["iterations"],
                                   *parse_bounds(o["bounds"]))
        outcome, setup = bench.search_power(cfg, shape, setup, o["mode"], o["must_fit"])
    base = {"workload": o["workload"], "config": Path(o["config_path"]).name, "deepflow": o["mode"],
            "must_fit": o["must_fit"]}
    out = Path(o["out"] or store.default_run_dir("model"))
    run_and_store("model", setup, iter(bench.step_records(outcome, base, budget)), total=len(outcome.path),
                  out=str(out), append=o["append"], force=o["force"], as_json=o["as_json"],
                  table=lambda recs: bench.hw_table(outcome, budget, setup, o["mode"], o["must_fit"]))
    from qbench.plots.model_search import plot_path

    report.notice(f"search path drawn in {plot_path(outcome, out / 'search-path.png', budget)}", style="dim")


COMMANDS = (search_hw,)
