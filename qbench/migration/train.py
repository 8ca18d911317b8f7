"""Schema-1 `switchback_train` records (written by `qbench switchback --train-check` and `qbench train-check`
before the tidy form) as bench `train_check` (see qbench/migration/__init__.py): param `model` -> `preset`,
`gap_to_16bit` -> `gap_to_reference` (16bit is a variant: no metric name spells one), and `exec` eager,
the only way the check ever trained."""

from __future__ import annotations

OLD_BENCH = "switchback_train"
BENCH = "train_check"
RENAMED = {"gap_to_16bit": "gap_to_reference"}


def migrate(record: dict) -> list[dict]:
    from qbench.migration.rename import renamed

    return renamed(record, BENCH, params={"model": "preset"}, metrics=RENAMED, add={"exec": "eager"})
