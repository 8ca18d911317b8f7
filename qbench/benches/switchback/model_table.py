"""Rich tables of `qbench switchback --model` (step time, throughput, speed-ups, the linear layers'
share, memory, errors) and `--train-check` (final loss, gaps to 16-bit and to the entropy floor)."""

from __future__ import annotations

from qbench import units

MODEL_COLUMNS = (  # (metric, header, unit for formatting)
    ("step_ms", "step ms", units.MS), ("tokens_per_s", "tokens/s", None), ("speedup_step", "x 16bit", units.SPEEDUP),
    ("linear_share", "lin share", None), ("speedup_linears", "x lin", units.SPEEDUP), ("model_tflops", "TFLOP/s", None),
    ("host_ms", "host ms", units.MS), ("peak_memory_mb", "peak MB", None), ("relerr_grads", "err grads", None),
)
TRAIN_COLUMNS = (
    ("final_loss", "final loss"), ("gap_to_16bit", "- 16bit"), ("gap_to_floor", "- floor"),
    ("entropy_floor", "floor"), ("initial_loss", "first 10"), ("uniform_loss", "ln V"),
)


MODEL_KEYS = {"model": "model", "batch_size": "B", "layers": "L", "exec": "exec", "variant": "variant"}


def model_table(records: list[dict]):
    """One row per preset x batch x execution mode x variant, fitted to the console (report.FittedTable); what
    every record shares listed once below it."""
    from qbench.report import STATUS, Column, FittedTable, Notes, fixed_line, split_fixed, status_cell, value_cell

    keys, fixed = split_fixed(records, list(MODEL_KEYS), MODEL_KEYS)
    columns = [*(Column(MODEL_KEYS[k], key=True) for k in keys), *(Column(h) for _, h, _ in MODEL_COLUMNS), STATUS]
    reasons, rows = Notes(), []
    for rec in records:
        cells = [str(rec["params"].get(k)) for k in keys]
        cells += [value_cell(rec["metrics"].get(k), u) for k, _, u in MODEL_COLUMNS]
        rows.append([*cells, status_cell(rec, reasons)])
    return FittedTable(columns, rows, notes=[*fixed_line(fixed), *reasons.lines()],
                       title="Transformer block stack: one training step (forward, backward, AdamW) per linear-layer "
                             "variant")


def train_table(records: list[dict]):
    """One row per variant: nats per token."""
    from qbench.report import STATUS, Column, FittedTable, Notes, format_value, status_cell

    first = records[0]["params"] if records else {}
    title = (f"Train check ({first.get('model')}, {first.get('steps')} steps, {first.get('dtype')}): "
             "cross-entropy in nats per token on a Markov chain with a known floor")
    columns = [Column("variant", key=True), *(Column(h) for _, h in TRAIN_COLUMNS), STATUS]
    reasons = Notes()
    rows = [[rec["params"]["variant"], *(format_value(rec["metrics"].get(k)) for k, _ in TRAIN_COLUMNS),
             status_cell(rec, reasons)] for rec in records]
    return FittedTable(columns, rows, title=title, notes=reasons.lines())
