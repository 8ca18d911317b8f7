"""The seed-format writer of the layer bench (`qbench switchback --format seed`). The block-stack benches
run from commands/block.py and commands/train_check.py. Imports no torch."""

from __future__ import annotations


def write_seed(out: str) -> None:
    """<run>/info.jsonl: the run's ok records in the original benchmark's line format."""
    from pathlib import Path

    from qbench import report, store
    from qbench.importers.bnb import format_bnb_jsonl

    if not (Path(out) / store.RECORDS_FILE).exists():
        return
    lines, left_out = format_bnb_jsonl(store.read_records(out))
    path = store.write_export(out, "info.jsonl", lines)
    skipped = f"; {left_out} shapes left out (a record not ok, or --variants lacks seed keys)" if left_out else ""
    report.notice(f"seed format: {len(lines)} lines in {path}{skipped}", style="dim")
