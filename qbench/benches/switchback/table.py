"""The rich table of `qbench switchback`: per shape the totals, the speed-ups (kernel sums and the
module in each execution mode), the module's host time per eager step, and the slowest component."""

from __future__ import annotations

from qbench import units
from qbench.benches.switchback.components import TOTALS

TABLE_TOTALS = {"time_standard": "16-bit", "time_global": "global", "time_rowwise": "rowwise"}
TABLE_SPEEDUPS = {"speedup_global": "x glob", "speedup_chain_graph": "x chain", "speedup_rowwise": "x row",
                  "speedup_fp8": "x fp8", "speedup_fp8_all": "x fp8all", "speedup_fp8_cublas": "x f8mm",
                  "speedup_int8_cublas": "x i8mm",
                  "speedup_module": "x mod", "speedup_module_compile": "x mod/c", "speedup_module_graph": "x mod/g",
                  "speedup_module_torchao_compile": "x tao/c"}


KEYS = {"batch_size": "M", "dim_in": "in", "dim_out": "out", "backward_thread": "bwd thread"}  # param -> header


def table(records: list[dict]):
    """Per shape: the three totals (ms), the speed-ups, the host time and the slowest component of time_global,
    as a table that fits the console (report.FittedTable); the shape parameters every record shares listed
    once below it, status reasons numbered below it."""
    from qbench import report

    keys, fixed = report.split_fixed(records, list(KEYS), KEYS)
    # a speed-up's column only where some record has it (a CPU run, or --variants, times fewer peers)
    speedups = {k: label for k, label in TABLE_SPEEDUPS.items() if any(k in r["metrics"] for r in records)}
    names = (*TABLE_TOTALS.values(), *speedups.values(), "host ms", "slowest")
    columns = [*(report.Column(KEYS[k], key=True) for k in keys), *map(report.Column, names), report.STATUS]
    reasons, rows = report.Notes(), []
    for rec in records:
        m = rec["metrics"]
        cells = [str(rec["params"].get(k)) for k in keys] + [report.format_value(m.get(k)) for k in TABLE_TOTALS]
        cells += [report.value_cell(m.get(k), units.SPEEDUP) for k in speedups]
        cells += [report.format_value(m.get("host_switchback_eager_ms")), slowest(m), report.status_cell(rec, reasons)]
        rows.append(cells)
    return report.FittedTable(columns, rows, title="SwitchBack int8 vs 16-bit: ms per layer training step, speed-ups",
                              notes=[*report.fixed_line(fixed), *reasons.lines()])


def slowest(metrics: dict) -> str:
    """The largest component of time_global and its share; '-' without time_global (a --variants run without
    global times only the components it shares, e.g. standard_gw)."""
    total = metrics.get("time_global")
    if not total:
        return "-"
    value, name = max((metrics[k], k) for k in TOTALS["time_global"])
    return f"{name.replace('_quantize', '_q')} {100 * value / total:.0f}%"
