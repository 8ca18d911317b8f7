"""The rich table of `qbench block`: step time, throughput, speed-ups, the linear layers' share, memory,
errors."""

from __future__ import annotations

from qbench import units

COLUMNS = (  # (metric, header, unit for formatting)
    ("step_ms", "step ms", units.MS), ("tokens_per_s", "tokens/s", None), ("step_speedup", "x 16bit", units.SPEEDUP),
    ("linear_share", "lin share", None), ("linears_speedup", "x lin", units.SPEEDUP), ("tflops", "TFLOP/s", None),
    ("host_ms", "host ms", units.MS), ("peak_memory_mb", "peak MB", None), ("relerr_grads", "err grads", None),
)
KEYS = {"preset": "preset", "batch_size": "B", "layers": "L", "exec": "exec", "variant": "variant"}


def table(records: list[dict]):
    """One row per preset x batch x execution mode x variant, fitted to the console (report.FittedTable); what
    every record shares listed once below it."""
    from qbench.report import STATUS, Column, FittedTable, Notes, fixed_line, split_fixed, status_cell, value_cell

    keys, fixed = split_fixed(records, list(KEYS), KEYS)
    columns = [*(Column(KEYS[k], key=True) for k in keys), *(Column(h) for _, h, _ in COLUMNS), STATUS]
    reasons, rows = Notes(), []
    for rec in records:
        cells = [str(rec["params"].get(k)) for k in keys]
        cells += [value_cell(rec["metrics"].get(k), u) for k, _, u in COLUMNS]
        rows.append([*cells, status_cell(rec, reasons)])
    return FittedTable(columns, rows, notes=[*fixed_line(fixed), *reasons.lines()],
                       title="Transformer block stack: one training step (forward, backward, AdamW) per linear-layer "
                             "variant")
