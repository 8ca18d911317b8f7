"""`qbench model search` and `qbench model search-hw`: the workload a search evaluates, the ranking and
power-split searches over it, their records and tables.

The workload is DeepFlow's LSTM of the config (model_param and scheduling_param) or a dense transformer
whose shape comes from --shape (the config then only gives the hardware). Times are seconds per step,
memory GiB per device (data shard per model shard).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from qbench import store, units
from qbench.benches.model import lstm as lstm_bench
from qbench.errors import QbenchUsageError
from qbench.model import objective, search, search_hw, transformer

STEP_UNITS = {"time_s": units.S, "best_s": units.S, "step": units.COUNT, "memory_gb": units.GB,
              "capacity_gb": units.GB, "fits": units.FLAG, "budget_s": units.S, "meets_budget": units.FLAG}


def load_workload(config_path: str, overrides: tuple, workload: str, shape_params: dict):
    """(normalized DeepFlow config, transformer shape or None, (batch, seq_len) for the time budget)."""
    cfg = lstm_bench.configs(lstm_bench.LstmRun(config_path, overrides))[0]
    if workload == "lstm":
        if shape_params:
            raise QbenchUsageError("--shape describes a transformer; add --workload transformer")
        return cfg, None, (cfg["model_param"]["batch_size"], cfg["model_param"]["seq_len"])
    shape = transformer.from_params(shape_params)
    return cfg, shape, (shape.batch, shape.seq)


def rank(cfg: dict, shape, devices: int, topologies: tuple[str, ...]):
    """(ranked candidates, rejected strategies); one device has no network, so one topology."""
    tops = tuple(topologies)[: 1 if devices == 1 else None]
    if shape is None:
        return search.search(cfg, devices, tops)
    return search.search_transformer(cfg, shape, devices, tops)


def ranking_json(ranked, rejected, budget) -> dict:
    rows = [{**asdict(c), "meets_budget": None if budget is None else c.time_s <= budget} for c in ranked]
    return {"ranked": rows, "budget_s": budget, "rejected": [{"settings": s, "reason": r} for s, r in rejected]}


def _verdict(point, budget) -> tuple[str, str]:
    fits = "[green]yes[/green]" if point.fits else f"[red]no ({point.memory_gb / point.capacity_gb:.1f}x)[/red]"
    if budget is None:
        return fits, "-"
    return fits, "[green]yes[/green]" if point.time_s <= budget else f"[red]no ({point.time_s / budget:.3g}x)[/red]"


def strategy_table(ranked, rejected, devices: int, workload: str, top: int, budget):
    """The `top` fastest strategies x topologies, with memory fit and the budget verdict."""
    from rich.table import Table

    title = f"Parallelism strategies on {devices} devices ({workload} model)"
    table = Table(title=title, header_style="bold")
    for col in ("rank", "topology", "strategy", "time s", "memory GiB", "fits", "meets budget"):
        table.add_column(col, justify="left" if col in ("strategy", "topology") else "right")
    for i, c in enumerate(ranked[:top], 1):
        table.add_row(str(i), c.topology, search.describe(c.settings), f"{c.time_s:.4f}", f"{c.memory_gb:.1f}",
                      *_verdict(c, budget))
    table.caption = (f"{len(ranked)} strategies x topologies; {len(rejected)} not expressible "
                     "(e.g. dims that do not divide)" + (f"; budget {budget:.6g} s per step" if budget else ""))
    return table


def search_power(cfg: dict, shape, setup: search_hw.HwSearch) -> search_hw.Outcome:
    """Power-split search of the workload, on the config's topology."""
    topology = cfg["scheduling_param"]["topology"]
    return search_hw.search(objective.objective(cfg, shape, topology), cfg["power_breakdown"], setup)


def step_record(step: search_hw.Step, base: dict, budget: float | None) -> dict:
    """One record per iteration of one start: the split, its time, the best so far and memory fit."""
    params = {**base, "start": step.start, "iteration": step.iteration, "move": step.move}
    p = step.point
    metrics = {"time_s": step.time_s, "best_s": step.best_s, "step": step.step, "memory_gb": p.memory_gb,
               "capacity_gb": p.capacity_gb, "fits": int(p.fits)}
    unit = dict(STEP_UNITS)
    for key, value in step.split.items():
        metrics[f"f_{key}"] = value
        unit[f"f_{key}"] = "of TDP"
    if budget is not None:
        metrics.update(budget_s=budget, meets_budget=int(step.time_s <= budget))
    return store.make_record("model", params, metrics, units=unit, device="model")


def step_records(outcome: search_hw.Outcome, workload: str, config_path: str, budget) -> list[dict]:
    base = {"workload": workload, "config": Path(config_path).name}
    return [step_record(s, base, budget) for s in outcome.path]


def hw_table(outcome: search_hw.Outcome, budget):
    """The config's split and each start's best split, with time, memory fit and the budget verdict."""
    from rich.table import Table

    keys = list(outcome.path[0].split)
    table = Table(title="Power-split search (fractions of TDP)", header_style="bold")
    for col in ["start", "iterations", *keys, "time s", "memory GiB", "capacity GiB", "fits", "meets budget"]:
        table.add_column(col, justify="right")
    rows = [("config", "-", outcome.initial, outcome.initial_point)]
    rows += [(str(s.start), str(s.iteration), s.split, s.point) for s in search_hw.best_per_start(outcome)]
    for name, its, split, p in rows:
        table.add_row(name, its, *(f"{split[k]:.4f}" for k in keys), f"{p.time_s:.6g}", f"{p.memory_gb:.1f}",
                      f"{p.capacity_gb:.1f}", *_verdict(p, budget))
    best = outcome.best_point
    table.caption = (f"best {best.time_s:.6g} s vs the config's {outcome.initial_point.time_s:.6g} s "
                     f"({outcome.initial_point.time_s / best.time_s:.3g}x); fractions sum to {outcome.total:.6g}"
                     + (f"; budget {budget:.6g} s per step" if budget is not None else ""))
    return table
