"""The rich table of `qbench train-check`: final loss, gaps to the 16-bit reference and to the entropy floor."""

from __future__ import annotations

COLUMNS = (
    ("final_loss", "final loss"), ("gap_to_reference", "- 16bit"), ("gap_to_floor", "- floor"),
    ("entropy_floor", "floor"), ("initial_loss", "first 10"), ("uniform_loss", "ln V"),
)


def table(records: list[dict]):
    """One row per variant: nats per token."""
    from qbench.report import STATUS, Column, FittedTable, Notes, format_value, status_cell

    first = records[0]["params"] if records else {}
    title = (f"Train check ({first.get('preset')}, {first.get('steps')} steps, {first.get('dtype')}): "
             "cross-entropy in nats per token on a Markov chain with a known floor")
    columns = [Column("variant", key=True), *(Column(h) for _, h in COLUMNS), STATUS]
    reasons = Notes()
    rows = [[rec["params"]["variant"], *(format_value(rec["metrics"].get(k)) for k, _ in COLUMNS),
             status_cell(rec, reasons)] for rec in records]
    return FittedTable(columns, rows, title=title, notes=reasons.lines())
