"""--metric names with shell-style wildcards (`host_call_switchback_*`), shared by `qbench summary` and
`qbench compare`: a pattern stands for every metric of the selected records that it matches, in record order;
a plain name stands for itself (its existence is checked where it is used)."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from qbench.errors import QbenchUsageError

WILDCARDS = frozenset("*?[")


def of(records) -> list[str]:
    """Every metric name the records keep, in record order."""
    return list(dict.fromkeys(name for rec in records for name in rec.get("metrics", {})))


def listed(known: Sequence[str]) -> str:
    """The first names of `known`, for a usage error's "(they have: ...)"."""
    return ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")


def is_pattern(name: str) -> bool:
    return any(c in WILDCARDS for c in name)


def expand(wanted: Sequence[str], known: Sequence[str], flag: str = "--metric") -> tuple[str, ...]:
    """wanted with each pattern replaced by the names of `known` (the records' metrics, in record order) it
    matches, duplicates dropped; a pattern that matches none is a usage error."""
    names: list[str] = []
    for name in wanted:
        if not is_pattern(name):
            names.append(name)
            continue
        hits = [m for m in known if fnmatchcase(m, name)]
        if not hits:
            raise QbenchUsageError(f"{flag} {name}: no metric of these records matches (they have: {listed(known)})")
        names.extend(hits)
    return tuple(dict.fromkeys(names))
