"""`qbench model search`: every parallelism strategy DeepFlow's LSTM model can express on N devices,
ranked by predicted step time, with whether each fits in device memory.

A strategy splits N = dp x (model devices): data parallel dp, and for the model part one of: a
pipeline of hlp stages over the layers (layer parallel, with inter-layer transfers), or a kernel split
of the LSTM GEMM (type 1 column-row over h1, type 2 row-column over h1 x h2), combined with a kernel
split of the softmax GEMM over the same devices (DeepFlow counts devices per layer as the max over
layers). Embedding and projection stay unsplit (the projection is left out of the time; the
embedding has no time model). Topologies: mesh is DeepFlow's link rule, ring a bidirectional ring
(qbench.model.objective.network_ib). A dense transformer (qbench.model.transformer) is searched over
dp x tp x pp instead.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, replace

from qbench.model import transformer
from qbench.model.deepflow import config as deepflow_config
from qbench.model.deepflow.config import ConfigError
from qbench.model.objective import lstm_point, transformer_point


@dataclass(frozen=True)
class Candidate:
    settings: dict  # scheduling_param values that differ from a single device
    time_s: float
    memory_gb: float  # per device (data shard per model shard), GiB
    capacity_gb: float
    fits: bool
    topology: str = "mesh"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(model_devices: int, layers: int) -> Iterator[dict]:
    """Settings of the model part (hidden + softmax) on `model_devices` devices."""
    m = model_devices
    hidden = []
    if m == 1:
        hidden.append({})
    if 1 < m <= layers and layers % m == 0:
        hidden.append({"hlp": m, "lp": m})
    if m > 1:
        hidden.append({"kp_hidden_type": 1, "kp_hidden_dim1": m})
        hidden += [{"kp_hidden_type": 2, "kp_hidden_dim1": d, "kp_hidden_dim2": m // d} for d in divisors(m)]
    softmax = [{}] if m == 1 else [{"kp_softmax_type": 1, "kp_softmax_dim1": m}] + [
        {"kp_softmax_type": 2, "kp_softmax_dim1": d, "kp_softmax_dim2": m // d} for d in divisors(m)]
    for h in hidden:
        for s in softmax:
            yield {**h, **s}


def strategies(devices: int, layers: int) -> Iterator[dict]:
    for dp in divisors(devices):
        for split in _splits(devices // dp, layers):
            yield {"dp": dp, **split}


_SINGLE = {"dp": 1, "lp": 1, "hlp": 1, **{f"kp_{n}_dim{i}": 1 for n in deepflow_config.KP_LAYERS for i in (1, 2)},
           **{f"kp_{n}_type": -1 for n in deepflow_config.KP_LAYERS}}


MAX_DEVICES = 4096  # every split of N is enumerated: ~d(N)^3 strategies, one model evaluation each
NO_NETWORK = "none"  # the topology of one device: nothing to connect


def check_devices(devices: int) -> None:
    if not 1 <= devices <= MAX_DEVICES:
        raise ConfigError(f"--devices {devices}: give 1 to {MAX_DEVICES} (the search evaluates every split "
                          "of the devices)")


def search(cfg: dict, devices: int, topologies=("mesh",), fixes: frozenset[str] = frozenset()):
    """(candidates of every topology sorted by time, strategies the model rejects with the reason);
    one device is evaluated once, with no network, whatever the topologies."""
    check_devices(devices)
    ranked, rejected = [], []
    for settings in strategies(devices, cfg["model_param"]["num_layers"]):
        trial = copy.deepcopy(cfg)
        trial["scheduling_param"].update(_SINGLE)
        trial["scheduling_param"].update(settings)
        trial["scheduling_param"]["topology"] = "mesh" if devices > 1 else trial["scheduling_param"]["topology"]
        try:
            deepflow_config.normalize(trial)
        except ConfigError as exc:
            rejected.append((settings, str(exc)))
            continue
        for topology in topologies if devices > 1 else (NO_NETWORK,):
            p = lstm_point(trial, topology if devices > 1 else None, fixes)
            ranked.append(Candidate(settings, p.time_s, p.memory_gb, p.capacity_gb, p.fits, topology))
    ranked.sort(key=lambda c: c.time_s)
    return ranked, rejected


def search_transformer(cfg: dict, shape, devices: int, topologies=("mesh",), fixes: frozenset[str] = frozenset()):
    """Every dp x tp x pp = devices split of a transformer, per topology, sorted by time."""
    check_devices(devices)
    ranked, rejected = [], []
    for dp in divisors(devices):
        for tp in divisors(devices // dp):
            settings = {"dp": dp, "tp": tp, "pp": devices // (dp * tp)}
            try:
                x = transformer.validate(replace(shape, **settings))
            except ValueError as exc:
                rejected.append((settings, str(exc)))
                continue
            for topology in topologies if devices > 1 else (NO_NETWORK,):
                p = transformer_point(cfg, x, topology, fixes)
                ranked.append(Candidate(settings, p.time_s, p.memory_gb, p.capacity_gb, p.fits, topology))
    ranked.sort(key=lambda c: c.time_s)
    return ranked, rejected


def describe(settings: dict) -> str:
    """'dp=2 hidden:RC 2x2 softmax:CR 4' from scheduling settings."""
    parts = [f"dp={settings.get('dp', 1)}"]
    if "tp" in settings:  # a transformer split
        return f"dp={settings['dp']} tp={settings['tp']} pp={settings['pp']}"
    if settings.get("hlp", 1) > 1:
        parts.append(f"pipeline hlp={settings['hlp']}")
    for layer in ("hidden", "softmax", "projection"):
        kind = settings.get(f"kp_{layer}_type", -1)
        if kind == 1:
            parts.append(f"{layer}:CR {settings[f'kp_{layer}_dim1']}")
        elif kind == 2:
            parts.append(f"{layer}:RC {settings[f'kp_{layer}_dim1']}x{settings[f'kp_{layer}_dim2']}")
    return " ".join(parts)
