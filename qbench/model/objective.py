"""Workload objectives, networks and time budgets of `qbench model search-hw` / `search`.

A workload is DeepFlow's LSTM (the config's model_param and scheduling) or a dense transformer
(qbench.model.transformer, with the config giving only the hardware: tech_param, power_breakdown,
arch_param). Network per topology, for a device with IB power Pw_IB = f_IB x TDP:
  mesh: DeepFlow's rule (reference 2.4): grid_dim parallel dimensions, num_links = dp*h1, 2*dp*h1 or
        3*dp*h1*lp, each link Pw_IB / (num_links * e_IB);
  ring: a bidirectional ring: each device drives its two neighbour links, Pw_IB / (2 * e_IB) each.
A time budget per step is given (--time-budget S) or derived from a token count and a wall-clock
target: steps = ceil(tokens / (batch * seq_len)), budget = hours * 3600 / steps.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

from qbench.model import deepflow, search_hw, transformer
from qbench.model.deepflow import machine as deepflow_machine
from qbench.model.deepflow.machine import Machine

TOPOLOGIES = ("ring", "mesh")


def with_split(cfg: dict, split: dict) -> dict:
    out = copy.deepcopy(cfg)
    out["power_breakdown"].update(split)
    return out


def network_ib(cfg: dict, topology: str, dp: int, model: int, lp: int) -> float:
    """Bytes/s per link for `topology` with data-parallel dp, model (kernel/tensor) degree `model`, lp stages."""
    power, tech = cfg["power_breakdown"], cfg["tech_param"]
    pw_ib, e_ib = power["IB"] * power["TDP"], tech["internode_energy_per_bit"] * 8
    grid_dim = int(dp > 1) + int(lp > 1) + int(model > 1)
    if grid_dim == 0:
        return 0
    if topology == "ring":
        return pw_ib / (2 * e_ib)
    links = dp * model if grid_dim == 1 else 2 * dp * model if grid_dim == 2 else 3 * dp * model * lp
    return pw_ib / (links * e_ib)


def lstm_machine(cfg: dict, topology: str) -> Machine:
    """DeepFlow's machine; for a ring the links follow the ring rule instead of the mesh's."""
    m = deepflow_machine.derive(cfg)
    if topology != "ring":
        return m
    sp = cfg["scheduling_param"]
    model = max(sp["kp_hidden_dim1"] * sp["kp_hidden_dim2"], sp["kp_softmax_dim1"] * sp["kp_softmax_dim2"])
    return replace(m, IB=network_ib(cfg, "ring", sp["dp"], model, sp["lp"]))


def lstm_point(cfg: dict, topology: str | None = None, fixes: frozenset[str] = frozenset()) -> search_hw.Point:
    """Time, memory fit, memory and capacity (GiB per device: data shard per model shard)."""
    r = deepflow.evaluate(cfg, lstm_machine(cfg, topology or cfg["scheduling_param"]["topology"]), fixes=fixes)
    mem = r.memory_model_shard
    return search_hw.Point(r.time, mem.fits, mem.total / 2**30, mem.capacity / 2**30)


def transformer_point(cfg: dict, shape: transformer.Transformer, topology: str,
                      fixes: frozenset[str] = frozenset()) -> search_hw.Point:
    m = deepflow_machine.derive(cfg)
    m = replace(m, IB=network_ib(cfg, topology, shape.dp, shape.tp, shape.pp))
    r = transformer.evaluate(shape, m, fixes)
    return search_hw.Point(r.time, r.fits, r.memory / 2**30, r.capacity / 2**30)


def objective(cfg: dict, shape: transformer.Transformer | None, topology: str = "mesh",
              fixes: frozenset[str] = frozenset()):
    """split -> Point for the LSTM of `cfg` (shape None) or the transformer `shape` on cfg's hardware."""
    if shape is None:
        return lambda split: lstm_point(with_split(cfg, split), None, fixes)
    return lambda split: transformer_point(with_split(cfg, split), shape, topology, fixes)


def fit_floor(objective, split: dict, key: str = "DRAM") -> float:
    """The smallest fraction of `key` (DRAM) at which the workload fits in memory, the other fractions as
    in `split`. Capacity is proportional to the DRAM power (reference 2.3: stacks = bandwidth / per-stack
    bandwidth) and the memory needed does not depend on the split, so it is f x needed / capacity; the
    last few ulps are checked against the objective itself."""
    p = objective(split)
    floor = split[key] * (p.memory_gb / p.capacity_gb)
    for _ in range(8):  # rounding of the ratio: step up until the model agrees that it fits
        if objective({**split, key: floor}).fits:
            return floor
        floor = math.nextafter(floor, math.inf)
    raise ValueError(f"memory does not fit at any {key} fraction near {floor:.6g}")


def time_budget(seconds: float | None, tokens: float | None, hours: float | None, batch: int, seq: int):
    """Seconds per step allowed, or None when no budget was asked for."""
    if seconds is not None:
        return seconds
    if tokens is None and hours is None:
        return None
    if tokens is None or hours is None:
        raise ValueError("--tokens and --hours go together (a dataset size and a wall-clock target)")
    steps = math.ceil(tokens / (batch * seq))
    return hours * 3600 / steps
