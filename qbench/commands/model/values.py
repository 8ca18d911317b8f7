"""Command-line values of `qbench model`: SECTION.KEY=VALUE overrides, sweeps and KEY=VALUE parameters,
as YAML 1.2 scalars (what a config file would say). Errors are one-line usage errors naming the option."""

from __future__ import annotations

import math

import click

from qbench.errors import QbenchUsageError


def parse_assignment(text: str, option: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise QbenchUsageError(f"{option} {text!r}: write SECTION.KEY=VALUE, e.g. model_param.batch_size=64")
    return key.strip(), value.strip()


def _scalar(text: str, option: str):
    """One value as YAML 1.2 reads it (qbench.safe_yaml's limits), or a usage error naming the option."""
    from qbench.model.deepflow.config import ConfigError, parse_scalar

    try:
        return parse_scalar(text, option)
    except ConfigError as exc:
        raise QbenchUsageError(str(exc)) from None


def _once(pairs: list[tuple[str, str]], option: str) -> list[tuple[str, str]]:
    """The pairs, refused when a key is given twice (which one would win is a guess)."""
    keys = [key for key, _ in pairs]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice is not None:
        raise QbenchUsageError(f"{option} {twice}: given twice; give each key once")
    return pairs


def parse_params(items: tuple[str, ...]) -> dict:
    """KEY=VALUE words -> {key: int, float, bool or string} (YAML 1.2 scalars, as in a config file)."""
    pairs = _once([parse_assignment(i, "parameter") for i in items], "parameter")
    return {k: _scalar(v, f"parameter {k}") for k, v in pairs}


def parse_sets(overrides: tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """--set SECTION.KEY=VALUE options -> ((section.key, value), ...)."""
    pairs = _once([parse_assignment(o, "--set") for o in overrides], "--set")
    return tuple((k, _scalar(v, f"--set {k}")) for k, v in pairs)


def parse_sweep(sweep: str | None) -> tuple[str | None, tuple]:
    """--sweep SECTION.KEY=V1,V2 -> (section.key, (v1, v2)); (None, ()) without a sweep."""
    if not sweep:
        return None, ()
    key, text = parse_assignment(sweep, "--sweep")
    values = tuple(_scalar(v.strip(), f"--sweep {key}") for v in text.split(",") if v.strip())
    if not values:
        raise QbenchUsageError(f"--sweep {sweep!r} gives no values")
    return key, values


def parse_count(text: str | int | None) -> int | None:
    """A count such as --devices: an integer, also written 1e3; bounds are checked where it is used."""
    if text is None or isinstance(text, int):
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value.is_integer():
        raise click.BadParameter(f"{text!r} is not a whole number; give a count like 8")
    return int(value)


def parse_bounds(text: str) -> tuple[float, float]:
    """--bounds LO:HI, the range of each searched fraction of TDP."""
    lo, sep, hi = text.partition(":")
    try:
        bounds = (float(lo), float(hi)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 0 < bounds[0] < bounds[1] <= 1:
        raise QbenchUsageError(f"--bounds {text!r}: write LO:HI with 0 < LO < HI <= 1, e.g. 0.01:0.9")
    return bounds
