"""What each DeepFlow quirk changes: the model evaluated exact and with that one quirk fixed, on the
quirk's witness strategy (qbench.model.deepflow.quirks), and exact against corrected on the config's
own strategy. Every number comes from two evaluations of the model; nothing here is a constant.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from qbench.model.deepflow import config as deepflow_config
from qbench.model.deepflow import machine, quirks
from qbench.model.deepflow.model import Result, evaluate

GIB = 2**30
# A single device: the base every witness strategy is written against (scheduling_param values).
SINGLE = {"dp": 1, "lp": 1, "hlp": 1, **{f"kp_{n}_dim{i}": 1 for n in deepflow_config.KP_LAYERS for i in (1, 2)},
          **{f"kp_{n}_type": -1 for n in deepflow_config.KP_LAYERS}}
MEASURES = {  # quantity -> (label, unit, value of a Result)
    "time_s": ("Time", "s", lambda r: r.time),
    "projection_b_s": ("projection_b", "s", lambda r: r.components.projection_b),
    "memory_gib": ("memory per device", "GiB", lambda r: r.memory_model_shard.total / GIB),
    "weight_gib": ("weights per device", "GiB", lambda r: r.memory_model_shard.weight / GIB),
}


@dataclass(frozen=True)
class Effect:
    quirk: quirks.Quirk | None  # None: all quirks at once, on the config's own strategy
    settings: dict  # the strategy evaluated (scheduling_param values that differ from one device)
    measure: str
    exact: float | None
    corrected: float | None
    reason: str = ""  # why the strategy cannot be evaluated on this config (then both values are None)

    @property
    def change(self) -> float | None:
        """corrected / exact - 1 (0 when both are 0)."""
        if self.exact is None or self.corrected is None:
            return None
        return 0.0 if self.exact == self.corrected else self.corrected / self.exact - 1


def on_strategy(cfg: dict, settings: dict) -> dict:
    """`cfg` on a strategy: the config itself for {}, else one device plus `settings` on a mesh (the only
    topology with a network model)."""
    if not settings:
        return cfg
    trial = copy.deepcopy(cfg)
    trial["scheduling_param"].update({**SINGLE, **settings, "topology": "mesh"})
    return deepflow_config.normalize(trial)


def _evaluate(cfg: dict, fixes: frozenset[str]) -> Result:
    return evaluate(cfg, machine.derive(cfg), fixes=fixes)


def effect(cfg: dict, quirk: quirks.Quirk) -> Effect:
    """The quirk's measure on its witness strategy, exact and with only this quirk fixed."""
    try:
        trial = on_strategy(cfg, quirk.witness)
    except deepflow_config.ConfigError as exc:
        return Effect(quirk, quirk.witness, quirk.measure, None, None, str(exc))
    value = MEASURES[quirk.measure][2]
    exact, fixed = (_evaluate(trial, f) for f in (frozenset(), frozenset({quirk.key})))
    return Effect(quirk, quirk.witness, quirk.measure, value(exact), value(fixed))


def effects(cfg: dict) -> list[Effect]:
    """One Effect per quirk, then exact against corrected on the config's strategy (time and memory)."""
    out = [effect(cfg, q) for q in quirks.QUIRKS]
    exact, corrected = _evaluate(cfg, frozenset()), _evaluate(cfg, quirks.ALL)
    for measure in ("time_s", "memory_gib"):
        value = MEASURES[measure][2]
        out.append(Effect(None, {}, measure, value(exact), value(corrected)))
    return out
