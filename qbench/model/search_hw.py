"""`qbench model search-hw`: DeepFlow-style search over how a device's power budget is split.

The device of a DeepFlow config is derived from technology parameters and the fractions of TDP given
to compute (core), DRAM, L2, shared memory and the interconnect (IB) (reference section 2). For a fixed
workload and parallelism the search moves power between the chosen parts and keeps the best split:

- the searched fractions keep the total they start with (the search moves power, it never adds any),
  so their shares of that total sum to one; each fraction stays within [lo, hi] (fractions of TDP);
- each iteration takes a projected-gradient step (central differences of log time, projected onto
  {sum = total, lo <= f <= hi}) and, since the model is piecewise (roofline max, power-of-two tiles),
  also every pairwise transfer of `step` between two parts; the best candidate is taken only when it
  is faster, else the step halves, so the best-so-far time never rises;
- start 0 is the config's own split; starts 1.. are random splits (a seeded Dirichlet draw), so a
  fixed seed gives the same path;
- a fraction may have its own floor above lo (`floors`, e.g. the DRAM share at which the model fits in
  memory: qbench.model.objective.fit_floor); every split, start 0 included, is projected above it.

The objective is any function split -> (time s, fits in memory, memory GiB, capacity GiB).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

KEYS = ("core", "DRAM", "L2", "shared_mem", "IB")
PROJECTION_TOL = 1e-12  # fractions of TDP: far below any printed digit
Objective = Callable[[dict], "Point"]


@dataclass(frozen=True)
class Point:
    time_s: float
    fits: bool
    memory_gb: float
    capacity_gb: float


@dataclass(frozen=True)
class HwSearch:
    keys: tuple[str, ...] = ("core", "DRAM", "L2", "shared_mem")
    starts: int = 4
    seed: int = 0
    iterations: int = 60
    lo: float = 0.01  # no part below 1% of TDP: core and DRAM must stay > 0 for a device to exist
    hi: float = 0.9
    step: float = 0.05  # first step, fraction of TDP
    min_step: float = 1e-5  # stop when the step is smaller than this
    floors: dict = field(default_factory=dict)  # key -> lowest fraction allowed, when above lo

    def lows(self) -> list[float]:
        """The lower bound of each searched fraction."""
        return [max(self.lo, self.floors.get(k, self.lo)) for k in self.keys]


@dataclass(frozen=True)
class Step:
    start: int
    iteration: int
    split: dict  # key -> fraction of TDP after this iteration
    time_s: float  # time of the current split
    best_s: float  # best time of this start so far (monotone non-increasing)
    step: float
    move: str  # "start", "gradient", "core->DRAM" (a transfer), or "none"
    point: Point


@dataclass
class Outcome:
    initial: dict
    initial_point: Point
    total: float
    best: dict = field(default_factory=dict)
    best_point: Point | None = None
    path: list[Step] = field(default_factory=list)


def project(x: list[float], total: float, lo, hi: float) -> list[float]:
    """Euclidean projection onto {sum = total, lo_i <= x_i <= hi}: clip(x - tau) with tau by bisection.
    `lo` is one bound for all fractions or one per fraction."""
    n = len(x)
    los = list(lo) if isinstance(lo, (list, tuple)) else [lo] * n
    if sum(los) - PROJECTION_TOL > total or n * hi + PROJECTION_TOL < total:
        raise ValueError(f"fractions in [{min(los)}, {hi}] cannot sum to {total:.6g} over {n} parts; "
                         "widen the bounds")
    a, b = min(x) - hi, max(v - low for v, low in zip(x, los))  # sum(clip(x - a)) = n*hi, sum(clip(x - b)) = sum(lo)
    for _ in range(200):
        tau = (a + b) / 2
        s = sum(min(hi, max(low, v - tau)) for v, low in zip(x, los))
        a, b = (tau, b) if s > total else (a, tau)
    out = [min(hi, max(low, v - (a + b) / 2)) for v, low in zip(x, los)]
    err = total - sum(out)  # bisection residue: put it on a coordinate with room to take it
    for i in sorted(range(n), key=lambda i: -out[i]):
        if los[i] <= out[i] + err <= hi:
            out[i] += err
            break
    return out


def random_split(rng: random.Random, n: int, total: float, lo, hi: float) -> list[float]:
    """A uniform draw on the simplex (Dirichlet(1,...,1)) scaled to total, projected into the bounds."""
    g = [rng.gammavariate(1.0, 1.0) for _ in range(n)]
    s = sum(g)
    return project([total * v / s for v in g], total, lo, hi)


def _log_time(objective: Objective, keys, x) -> float:
    return math.log(objective(dict(zip(keys, x))).time_s)


def gradient(objective: Objective, keys, x: list[float], h: float, lows: list[float]) -> list[float]:
    """Central differences of log(time) per fraction (one-sided where x_i - h would leave the bounds)."""
    g = []
    for i in range(len(x)):
        up, down = list(x), list(x)
        up[i] += h
        down[i] = max(lows[i], x[i] - h)
        g.append((_log_time(objective, keys, up) - _log_time(objective, keys, down)) / (up[i] - down[i]))
    return g


def _candidates(objective, keys, x, step, cfg: HwSearch, total) -> list[tuple[str, list[float]]]:
    """The gradient step and every pairwise transfer of `step` (all projected into the feasible set)."""
    out = []
    lows = cfg.lows()
    g = gradient(objective, keys, x, max(1e-6, step / 10), lows)
    mean = sum(g) / len(g)
    d = [-(v - mean) for v in g]  # steepest descent inside the hyperplane sum = total
    scale = max(abs(v) for v in d)
    if scale > 0:
        out.append(("gradient", project([xi + step * di / scale for xi, di in zip(x, d)], total, lows, cfg.hi)))
    for i, ki in enumerate(keys):
        for j, kj in enumerate(keys):
            if i != j:
                y = list(x)
                y[i], y[j] = y[i] + step, y[j] - step
                out.append((f"{kj}->{ki}", project(y, total, lows, cfg.hi)))
    return out


def descend(objective: Objective, keys, x0: list[float], cfg: HwSearch, total: float, start: int) -> list[Step]:
    """One start: iterate until the step is below min_step or the iterations run out."""
    x, point = list(x0), objective(dict(zip(keys, x0)))
    step = cfg.step
    path = [Step(start, 0, dict(zip(keys, x)), point.time_s, point.time_s, step, "start", point)]
    for it in range(1, cfg.iterations + 1):
        if step < cfg.min_step:
            break
        scored = [(objective(dict(zip(keys, y))), name, y) for name, y in _candidates(objective, keys, x, step,
                                                                                     cfg, total)]
        cand, name, y = min(scored, key=lambda c: c[0].time_s, default=(None, "none", x))
        if cand is not None and cand.time_s < point.time_s:
            x, point, step = y, cand, min(cfg.step, step * 1.5)  # grow back after a success
        else:
            name, step = "none", step / 2
        path.append(Step(start, it, dict(zip(keys, x)), point.time_s, point.time_s, step, name, point))
    return path


def search(objective: Objective, split: dict, cfg: HwSearch) -> Outcome:
    """Descend from the given split (start 0) and from cfg.starts - 1 random splits; keep the best."""
    keys = cfg.keys
    unknown = [k for k in keys if k not in KEYS]
    if unknown or len(set(keys)) != len(keys) or len(keys) < 2:
        raise ValueError(f"--keys: give two or more distinct parts of {', '.join(KEYS)}")
    x0 = [float(split[k]) for k in keys]
    total = sum(x0)
    bad = [k for k, v in zip(keys, x0) if not cfg.lo - PROJECTION_TOL <= v <= cfg.hi + PROJECTION_TOL]
    if bad:
        raise ValueError(f"power_breakdown.{bad[0]} = {split[bad[0]]} is outside the bounds [{cfg.lo}, {cfg.hi}]; "
                         "widen them with --bounds LO:HI")
    project(x0, total, cfg.lo, cfg.hi)  # raises when the bounds cannot hold the total
    lows = cfg.lows()
    if sum(lows) > total + PROJECTION_TOL or max(lows) > cfg.hi:
        k, low = max(zip(keys, lows), key=lambda kv: kv[1] - cfg.lo)
        raise ValueError(f"{k} must be at least {low:.6g} of TDP, which the bounds [{cfg.lo}, {cfg.hi}] and the "
                         f"total {total:.6g} of {', '.join(keys)} do not allow")
    if any(v < low for v, low in zip(x0, lows)):  # start 0: the config's split, moved above the floors
        x0 = project(x0, total, lows, cfg.hi)
    rng = random.Random(cfg.seed)
    starts = [x0] + [random_split(rng, len(keys), total, lows, cfg.hi) for _ in range(cfg.starts - 1)]
    out = Outcome(dict(split), objective(dict(split)), total)
    for i, xs in enumerate(starts):
        path = descend(objective, keys, xs, cfg, total, i)
        out.path.extend(path)
        last = path[-1]
        if out.best_point is None or last.time_s < out.best_point.time_s:
            out.best, out.best_point = {**split, **last.split}, last.point
    return out


def best_per_start(outcome: Outcome) -> list[Step]:
    """The last step of each start (its best split)."""
    last: dict[int, Step] = {}
    for s in outcome.path:
        last[s.start] = s
    return [last[k] for k in sorted(last)]
