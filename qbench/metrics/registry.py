"""Every qbench family's metric declarations (qbench/metrics/<family>.py), looked up by bench: the units
records carry, the check that a record holds only declared metrics, and the words no metric name may
spell (see qbench/metrics/__init__.py for the tidy form)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from qbench.metrics import TIMINGS, Metric, UndeclaredMetric
from qbench.modes import EXECS


def _modules():
    """The module of each family, in one list (add a family here and in qbench/migration/registry.py)."""
    from qbench.metrics import block, fragmented, grouped, model, moe, switchback, train

    return (switchback, fragmented, moe, block, train, model, grouped)


def _families() -> dict[str, dict[str, Metric]]:
    return {module.BENCH: {m.name: m for m in module.METRICS} for module in _modules()}


_DECLARED: dict[str, dict[str, Metric]] | None = None


def declared() -> dict[str, dict[str, Metric]]:
    """bench -> metric name -> its declaration, for every family qbench runs."""
    global _DECLARED
    if _DECLARED is None:
        _DECLARED = _families()
    return _DECLARED


def variants() -> dict[str, tuple[str, ...]]:
    """bench -> the variant names its records carry (what no metric name may contain)."""
    return {m.BENCH: tuple(m.VARIANTS) for m in _modules()}


def is_family(bench: str) -> bool:
    """A bench qbench runs whose metrics are declared (imported benches keep their files' units)."""
    return bool(declared().get(bench))


def metric(bench: str, name: str) -> Metric:
    """The declaration of `name` in `bench`'s family; UndeclaredMetric names both when there is none."""
    try:
        return declared()[bench][name]
    except KeyError:
        raise UndeclaredMetric(f"{bench} records no metric named {name!r}; declare it in qbench/metrics/"
                               f"{bench}.py with its unit") from None


def units_of(bench: str, names: Iterable[str]) -> dict[str, str]:
    """name -> declared unit for each name (UndeclaredMetric on the first undeclared one)."""
    return {name: metric(bench, name).unit for name in names}


def declared_units(bench: str, metrics: Iterable[str], stored: Mapping[str, str]) -> dict[str, str]:
    """The units a record's readers use: for a metric its qbench family declares, the declared unit (and so
    its direction); for any other (a record of an imported bench, a metric an old run kept that no
    declaration names) the unit the record stored, or none. Never a unit guessed from a name."""
    family = declared().get(bench, {})
    return {**stored, **{name: family[name].unit for name in metrics if name in family}}


def check(bench: str, metrics: Mapping[str, object]) -> None:
    """Every metric of a record of a qbench family is declared (imported benches are not checked)."""
    if is_family(bench):
        units_of(bench, metrics)


def forbidden_words(bench: str) -> tuple[str, ...]:
    """The execution modes, timings and the family's variants: no metric name of `bench` contains one."""
    return (*EXECS, *TIMINGS, *variants().get(bench, ()))


def hidden_dimension(bench: str, name: str) -> str | None:
    """The mode, timing or variant that the metric name `name` spells (as whole '_'-separated words), or
    None: `speedup_fp8_graph` spells fp8 and graph, `quantize_x_over_int8` spells none of them."""
    words = name.split("_")
    for word in forbidden_words(bench):
        parts = word.split("_")
        if any(words[i:i + len(parts)] == parts for i in range(len(words))):
            return word
    return None
