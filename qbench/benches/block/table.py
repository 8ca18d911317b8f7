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


def table(records: list[dict], limits=None):
    """One row per preset x batch x execution mode x variant, fitted to the console (report.FittedTable), with
    `limits` (the run's qbench.explain.limits.RunLimits) the limit binding each step; what every record shares
    listed once below it."""
    from qbench import report

    keys, fixed = report.split_fixed(records, list(KEYS), KEYS)
    limit = [report.LIMIT] if limits is not None else []
    columns = [*(report.Column(KEYS[k], key=True) for k in keys), *(report.Column(h) for _, h, _ in COLUMNS), *limit,
               report.STATUS]
    reasons, rows = report.Notes(), []
    for rec in records:
        cells = [str(rec["params"].get(k)) for k in keys]
        cells += [report.value_cell(rec["metrics"].get(k), u) for k, _, u in COLUMNS]
        if limits is not None:
            cells.append(report.limit_cell(rec, limits))
        rows.append([*cells, report.status_cell(rec, reasons)])
    notes = [*report.fixed_line(fixed), *report.limit_note(limits, "the step"), *reasons.lines()]
    return report.FittedTable(columns, rows, notes=notes,
                              title="Transformer block stack: one training step (forward, backward, AdamW) per "
                                    "linear-layer variant")
