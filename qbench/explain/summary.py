"""The model's error per family and kind of cell, against the targets of issue 52, and the worst cells.

Groups: kernel components (one kernel timed alone) and their sum; module and block steps by exec; MoE
phases by world size. Targets are on the median and p90 of |predicted / measured - 1|.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from qbench.explain import Cell
from qbench.samples import percentile

# (family, kind) -> (largest median error, largest p90 error or None): the targets the model is judged on
TARGETS = {("switchback", "component"): (0.10, 0.20), ("switchback", "kernels"): (0.10, 0.20),
           ("switchback", "step"): (0.15, None), ("block", "step"): (0.15, None), ("fragmented", "step"): (0.15, None),
           ("moe", "phase"): (0.20, None), ("moe", "step"): (0.20, None)}


@dataclass(frozen=True)
class Group:
    family: str
    kind: str
    exec: str  # the steps' execution mode (MoE: and world size); '' for kernels timed alone
    cells: int
    median: float
    p90: float
    ratio: float  # median predicted / measured: above 1 the model is slow, below 1 fast
    target: str
    met: bool | None  # None where no target applies (steps of eager exec, host-bound by design)
    metric: str = ""  # with groups(by_metric=True): the one metric of the group


def _target(family: str, kind: str, exec_: str) -> tuple[float, float | None] | None:
    if kind == "step" and exec_.startswith("eager"):
        return None  # eager steps are judged on naming the host where it binds (host_bound), not on time
    return TARGETS.get((family, kind))


def groups(cells: Iterable[Cell], by_metric: bool = False) -> list[Group]:
    """One group per family, kind and (for steps and phases) exec, and per metric where `by_metric`."""
    by: dict[tuple[str, str, str, str], list[Cell]] = {}
    for c in cells:
        key = (c.bench, c.kind, c.exec if c.kind in ("step", "phase") else "", c.metric if by_metric else "")
        by.setdefault(key, []).append(c)
    out = []
    for (family, kind, exec_, metric), members in sorted(by.items()):
        errors = [c.error for c in members]
        med, p90 = percentile(errors, 50), percentile(errors, 90)
        target = _target(family, kind, exec_)
        met = None if target is None else med <= target[0] and (target[1] is None or p90 <= target[1])
        text = "" if target is None else f"<= {target[0]:.0%}" + ("" if target[1] is None else f", {target[1]:.0%}")
        out.append(Group(family, kind, exec_, len(members), med, p90,
                         percentile([c.ratio for c in members], 50), text, met, metric))
    return out


def worst(cells: Iterable[Cell], n: int = 10) -> list[Cell]:
    return sorted(cells, key=lambda c: c.error, reverse=True)[:n]


def host_bound(records: Iterable[Mapping], cells: Iterable[Cell]) -> tuple[int, int]:
    """(of them named host-bound by the model, eager steps whose host time exceeds their GPU time). A step's
    GPU time is its kernels run back to back in one CUDA graph (chain_ms), measured in the same record."""
    limits = {c.case: c.limit for c in cells if c.metric == "step_ms"}
    due = [r["case"] for r in records if r.get("params", {}).get("exec") == "eager"
           and _more(r["metrics"].get("host_ms"), r["metrics"].get("chain_ms"))]
    return sum(limits.get(case) == "host" for case in due), len(due)


def _more(a, b) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > b > 0
