"""`qbench model search` and `qbench model search-hw`: the workload a search evaluates, the ranking and
power-split searches over it, their records and tables.

The workload is DeepFlow's LSTM of the config (model_param and scheduling_param) or a dense transformer
whose shape comes from --shape (the config then only gives the hardware). Times are seconds per step,
memory GiB per device (data shard per model shard).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from qbench import store, units
from qbench.benches.model import lstm as lstm_bench
from qbench.errors import QbenchUsageError
from qbench.model import objective, search, search_hw, transformer
from qbench.model.deepflow import quirks

MEMORY_BASIS = "GiB per device (data shard per model shard)"
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


@dataclass(frozen=True)
class Ranking:
    """A ranking under one DeepFlow mode, and the best candidate under the other mode."""

    mode: str  # exact or corrected
    ranked: list  # Candidates, fastest first
    rejected: list  # (settings, reason)
    other_mode: str
    other_best: search.Candidate | None

    @property
    def top_changes(self) -> bool:
        """Whether the other mode puts another strategy (or topology) first."""
        return bool(self.ranked and self.other_best) and _key(self.ranked[0]) != _key(self.other_best)

    def position_of_other_best(self) -> int:
        return 1 + [_key(c) for c in self.ranked].index(_key(self.other_best))


def _key(c) -> tuple:
    return json.dumps(c.settings, sort_keys=True), c.topology


def rank(cfg: dict, shape, devices: int, topologies: tuple[str, ...], mode: str) -> Ranking:
    """Strategies x topologies ranked under `mode`, and the other mode's best (to warn when they differ)."""
    def ranking(m):
        fixes = quirks.fixes_for(m)
        if shape is None:
            return search.search(cfg, devices, tuple(topologies), fixes)
        return search.search_transformer(cfg, shape, devices, tuple(topologies), fixes)

    other = "exact" if mode == "corrected" else "corrected"
    ranked, rejected = ranking(mode)
    other_ranked, _ = ranking(other)
    return Ranking(mode, ranked, rejected, other, other_ranked[0] if other_ranked else None)


def mode_notice(r: Ranking) -> str:
    """What the ranking is made with, and a warning when the other mode would put another strategy first."""
    text = (f"DeepFlow {r.mode}: " + ("its quirks fixed (qbench model quirks lists them); --deepflow exact "
                                      "ranks with DeepFlow as published" if r.mode == "corrected" else
                                      "DeepFlow as published, quirks included; --deepflow corrected fixes them"))
    if r.top_changes:
        o = r.other_best
        text += (f"\nwarning: under DeepFlow {r.other_mode} the fastest would be {search.describe(o.settings)} "
                 f"({o.topology}, {o.time_s:.4f} s), ranked {r.position_of_other_best()} here")
    return text


def ranking_json(r: Ranking, budget) -> dict:
    rows = [{**asdict(c), "meets_budget": None if budget is None else c.time_s <= budget} for c in r.ranked]
    other = {"deepflow": r.other_mode, "best": asdict(r.other_best) if r.other_best else None,
             "same_top": not r.top_changes}
    return {"deepflow": r.mode, "memory_basis": MEMORY_BASIS, "ranked": rows, "budget_s": budget,
            "rejected": [{"settings": s, "reason": why} for s, why in r.rejected], "other_mode": other}


def _verdict(point, budget) -> tuple:
    from rich.text import Text

    fits = Text("yes", "green") if point.fits else Text(f"no ({point.memory_gb / point.capacity_gb:.1f}x)", "red")
    if budget is None:
        return fits, Text("-")
    meets = point.time_s <= budget
    return fits, Text("yes", "green") if meets else Text(f"no ({point.time_s / budget:.3g}x)", "red")


def strategy_table(r: Ranking, devices: int, workload: str, top: int, budget):
    """The `top` fastest strategies x topologies, with memory fit and the budget verdict, fitted to the console."""
    from qbench.report import Column, FittedTable

    where = f"{devices} devices" if devices > 1 else "1 device (no network: topology none)"
    columns = [Column("rank", key=True), Column("topology", justify="left", key=True),
               Column("strategy", justify="left", key=True),
               *(Column(c) for c in ("time s", "memory GiB/device", "fits", "meets budget"))]
    rows = [[str(i), c.topology, search.describe(c.settings), f"{c.time_s:.4f}", f"{c.memory_gb:.1f}",
             *_verdict(c, budget)] for i, c in enumerate(r.ranked[:top], 1)]
    caption = (f"{len(r.ranked)} strategies x topologies; {len(r.rejected)} not expressible "
               "(e.g. dims that do not divide)" + (f"; budget {budget:.6g} s per step" if budget else ""))
    return FittedTable(columns, rows, notes=[caption],
                       title=f"Parallelism strategies on {where} ({workload} model, DeepFlow {r.mode})")


def search_power(cfg: dict, shape, setup: search_hw.HwSearch, mode: str, must_fit: bool):
    """(outcome, the setup searched) of a power-split search on the config's topology under `mode`; with
    must_fit the DRAM share never drops below the one at which the model fits in memory."""
    topology = cfg["scheduling_param"]["topology"]
    goal = objective.objective(cfg, shape, topology, quirks.fixes_for(mode))
    if must_fit:
        setup = replace(setup, floors={"DRAM": _fit_floor(goal, cfg["power_breakdown"], setup)})
    return search_hw.search(goal, cfg["power_breakdown"], setup), setup


def _fit_floor(goal, split: dict, setup: search_hw.HwSearch) -> float:
    """The DRAM fraction at which the model fits (capacity follows the DRAM power), or a usage error
    naming the memory needed when no split within the bounds reaches it."""
    p = goal(split)
    need = f"the model needs {p.memory_gb:.1f} GiB per device, the config's split gives {p.capacity_gb:.1f} GiB"
    if "DRAM" not in setup.keys:
        if p.fits:
            return 0.0
        raise QbenchUsageError(f"{need} and DRAM is not searched: add DRAM to --keys, or pass --no-must-fit")
    floor = objective.fit_floor(goal, split)
    others = sum(split[k] for k in setup.keys if k != "DRAM")
    most = min(setup.hi, split["DRAM"] + others - setup.lo * (len(setup.keys) - 1))  # every other part at LO
    if floor > most:
        raise QbenchUsageError(f"no split fits: {need}; that takes DRAM >= {floor:.4g} of TDP and the bounds "
                               f"allow at most {most:.4g} (raise HI in --bounds, shrink the workload with --set or "
                               "--shape, or pass --no-must-fit)")
    return floor


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


def step_records(outcome: search_hw.Outcome, base: dict, budget) -> list[dict]:
    """base: the params every record shares (workload, config, deepflow mode, must_fit)."""
    return [step_record(s, base, budget) for s in outcome.path]


def hw_table(outcome: search_hw.Outcome, budget, setup: search_hw.HwSearch, mode: str, must_fit: bool):
    """The config's split and each start's best split, with time, memory fit and the budget verdict, fitted to
    the console."""
    from qbench.report import Column, FittedTable

    keys = list(outcome.path[0].split)
    columns = [Column("start", key=True), Column("iterations"), *(Column(k) for k in keys),
               *(Column(c) for c in ("time s", "memory GiB/device", "capacity GiB", "fits", "meets budget"))]
    rows = [("config", "-", outcome.initial, outcome.initial_point)]
    rows += [(str(s.start), str(s.iteration), s.split, s.point) for s in search_hw.best_per_start(outcome)]
    cells = [[name, its, *(f"{split[k]:.4f}" for k in keys), f"{p.time_s:.6g}", f"{p.memory_gb:.1f}",
              f"{p.capacity_gb:.1f}", *_verdict(p, budget)] for name, its, split, p in rows]
    return FittedTable(columns, cells, title=f"Power-split search (fractions of TDP; DeepFlow {mode})",
                       notes=[_hw_caption(outcome, budget, setup, must_fit)])


def _hw_caption(outcome: search_hw.Outcome, budget, setup: search_hw.HwSearch, must_fit: bool) -> str:
    best = outcome.best_point
    if not must_fit:
        fit = "memory fit not required (--no-must-fit)"
    elif "DRAM" in setup.keys:
        fit = f"memory must fit: DRAM >= {max(setup.lo, setup.floors['DRAM']):.4f}"
    else:
        fit = "memory must fit (DRAM not searched: the config's share fits)"
    return (f"best {best.time_s:.6g} s vs the config's {outcome.initial_point.time_s:.6g} s "
            f"({outcome.initial_point.time_s / best.time_s:.3g}x); fractions sum to {outcome.total:.6g}; "
            f"{fit}" + (f"; budget {budget:.6g} s per step" if budget is not None else ""))
