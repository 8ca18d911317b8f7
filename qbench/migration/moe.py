"""Schema-1 records of this family (see qbench/migration/__init__.py); unchanged until the family is tidy."""

from __future__ import annotations

OLD_BENCH = "moe"


def migrate(record: dict) -> list[dict]:
    return [dict(record)]
