"""What `qbench model search` and `qbench model search-hw` do after click has parsed them: build the
config and workload, run the search, store (search-hw) and print. Errors are ValueErrors naming the
problem; the command turns them into one line and exit 2.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from qbench import report
from qbench.errors import QbenchUsageError


def load_workload(config_path, overrides, workload, shape_items):
    """(normalized DeepFlow config, transformer shape or None, (batch, seq_len) for the time budget)."""
    from qbench.model import lstm_run, transformer
    from qbench.model.commands import build_run, parse_params

    cfg = lstm_run.configs(build_run(config_path, False, overrides, None))[0]
    if workload == "lstm":
        if shape_items:
            raise QbenchUsageError("--shape describes a transformer; add --workload transformer")
        return cfg, None, (cfg["model_param"]["batch_size"], cfg["model_param"]["seq_len"])
    shape = transformer.from_params(parse_params(shape_items))
    return cfg, shape, (shape.batch, shape.seq)


def parse_bounds(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition(":")
    try:
        bounds = (float(lo), float(hi)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 0 < bounds[0] < bounds[1] <= 1:
        raise QbenchUsageError(f"--bounds {text!r}: write LO:HI with 0 < LO < HI <= 1, e.g. 0.01:0.9")
    return bounds


def run_search_hw(opts: dict) -> None:
    """opts: the parsed options of `qbench model search-hw` (names as in the command)."""
    from qbench import store
    from qbench.commands.common import run_and_store
    from qbench.model import search_hw, search_plot, search_run

    cfg, shape, (batch, seq) = load_workload(opts["config_path"], opts["overrides"], opts["workload"], opts["shape"])
    budget = search_run.time_budget(opts["time_budget"], opts["tokens"], opts["hours"], batch, seq)
    lo, hi = parse_bounds(opts["bounds"])
    setup = search_hw.HwSearch(tuple(opts["keys"]), opts["starts"], opts["seed"], opts["iterations"], lo, hi)
    topology = cfg["scheduling_param"]["topology"]
    outcome = search_hw.search(search_run.objective(cfg, shape, topology), cfg["power_breakdown"], setup)
    base = {"workload": opts["workload"], "config": Path(opts["config_path"]).name}
    records = [search_run.step_record(s, base, budget) for s in outcome.path]
    out = Path(opts["out"] or store.default_run_dir("model"))
    run_and_store("model", setup, iter(records), total=len(records), out=str(out), append=opts["append"],
                  force=opts["force"], as_json=opts["as_json"], table=lambda recs: hw_table(outcome, budget))
    figure = search_plot.plot_path(outcome, out / "search-path.png", budget)
    report.notice(f"search path drawn in {figure}", style="dim")


def _verdict(point, budget) -> tuple[str, str]:
    fits = "[green]yes[/green]" if point.fits else f"[red]no ({point.memory_gb / point.capacity_gb:.1f}x)[/red]"
    if budget is None:
        return fits, "-"
    return fits, "[green]yes[/green]" if point.time_s <= budget else f"[red]no ({point.time_s / budget:.3g}x)[/red]"


def hw_table(outcome, budget):
    """The config's split and each start's best split, with time, memory fit and the budget verdict."""
    from rich.table import Table

    from qbench.model.search_hw import best_per_start

    keys = list(outcome.path[0].split)
    table = Table(title="Power-split search (fractions of TDP)", header_style="bold")
    for col in ["start", "iterations", *keys, "time s", "memory GiB", "capacity GiB", "fits", "meets budget"]:
        table.add_column(col, justify="right")
    rows = [("config", "-", outcome.initial, outcome.initial_point)]
    rows += [(str(s.start), str(s.iteration), s.split, s.point) for s in best_per_start(outcome)]
    for name, its, split, p in rows:
        table.add_row(name, its, *(f"{split[k]:.4f}" for k in keys), f"{p.time_s:.6g}", f"{p.memory_gb:.1f}",
                      f"{p.capacity_gb:.1f}", *_verdict(p, budget))
    best = outcome.best_point
    table.caption = (f"best {best.time_s:.6g} s vs the config's {outcome.initial_point.time_s:.6g} s "
                     f"({outcome.initial_point.time_s / best.time_s:.3g}x); fractions sum to {outcome.total:.6g}"
                     + (f"; budget {budget:.6g} s per step" if budget is not None else ""))
    return table


def run_search(opts: dict) -> None:
    """Rank parallelism strategies x topologies; mark those that do not fit or miss the budget."""
    from qbench.model import search, search_run

    cfg, shape, (batch, seq) = load_workload(opts["config_path"], opts["overrides"], opts["workload"], opts["shape"])
    budget = search_run.time_budget(opts["time_budget"], opts["tokens"], opts["hours"], batch, seq)
    tops = tuple(opts["topologies"])[: 1 if opts["devices"] == 1 else None]  # one device has no network
    if shape is None:
        ranked, rejected = search.search(cfg, opts["devices"], tops)
    else:
        ranked, rejected = search.search_transformer(cfg, shape, opts["devices"], tops)
    if opts["as_json"]:
        rows = [{**asdict(c), "meets_budget": None if budget is None else c.time_s <= budget} for c in ranked]
        click.echo(json.dumps({"ranked": rows, "budget_s": budget,
                               "rejected": [{"settings": s, "reason": r} for s, r in rejected]}, indent=2))
        return
    report.stdout_console().print(strategy_table(ranked, rejected, opts, budget))


def strategy_table(ranked, rejected, opts, budget):
    from rich.table import Table

    from qbench.model import search

    title = f"Parallelism strategies on {opts['devices']} devices ({opts['workload']} model)"
    table = Table(title=title, header_style="bold")
    for col in ("rank", "topology", "strategy", "time s", "memory GiB", "fits", "meets budget"):
        table.add_column(col, justify="left" if col in ("strategy", "topology") else "right")
    for i, c in enumerate(ranked[: opts["top"]], 1):
        table.add_row(str(i), c.topology, search.describe(c.settings), f"{c.time_s:.4f}", f"{c.memory_gb:.1f}",
                      *_verdict(c, budget))
    table.caption = (f"{len(ranked)} strategies x topologies; {len(rejected)} not expressible "
                     "(e.g. dims that do not divide)" + (f"; budget {budget:.6g} s per step" if budget else ""))
    return table
