"""Command-line values of `qbench model`: SECTION.KEY=VALUE overrides, sweeps and KEY=VALUE parameters,
as YAML 1.2 scalars (what a config file would say). Errors are one-line usage errors naming the option."""

from __future__ import annotations

from qbench.errors import QbenchUsageError


def parse_assignment(text: str, option: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise QbenchUsageError(f"{option} {text!r}: write SECTION.KEY=VALUE, e.g. model_param.batch_size=64")
    return key.strip(), value.strip()


def parse_params(items: tuple[str, ...]) -> dict:
    """KEY=VALUE words -> {key: int, float, bool or string} (YAML 1.2 scalars, as in a config file)."""
    from qbench.model.deepflow.config import parse_scalar

    return {k: parse_scalar(v) for k, v in (parse_assignment(i, "parameter") for i in items)}


def parse_sets(overrides: tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """--set SECTION.KEY=VALUE options -> ((section.key, value), ...)."""
    from qbench.model.deepflow.config import parse_scalar

    return tuple((k, parse_scalar(v)) for k, v in (parse_assignment(o, "--set") for o in overrides))


def parse_sweep(sweep: str | None) -> tuple[str | None, tuple]:
    """--sweep SECTION.KEY=V1,V2 -> (section.key, (v1, v2)); (None, ()) without a sweep."""
    from qbench.model.deepflow.config import parse_scalar

    if not sweep:
        return None, ()
    key, text = parse_assignment(sweep, "--sweep")
    values = tuple(parse_scalar(v.strip()) for v in text.split(",") if v.strip())
    if not values:
        raise QbenchUsageError(f"--sweep {sweep!r} gives no values")
    return key, values
