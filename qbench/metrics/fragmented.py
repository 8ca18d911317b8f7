"""Metric declarations of this family (see qbench/metrics/__init__.py); filled when the family is tidy."""

from __future__ import annotations

BENCH = "fragmented"
VARIANTS: tuple[str, ...] = ()
METRICS: tuple = ()
