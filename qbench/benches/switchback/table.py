"""The rich table of `qbench switchback`, a pivot of its tidy records that fits 120 columns: a row per shape;
the 16-bit layer's training step as the sum of its kernels (ms), each variant's kernels_speedup over it, then
SwitchBack's module step_speedup over nn.Linear's in each exec whose module steps ran (timing per_step). The
rest of a run (components, loop timings, host times, the fp8 and torchao modules' steps) is one
`qbench summary RUN --metric NAME -k variant=... -k exec=...` away. With the limits of a GPU run
(qbench.explain.limits) the 16-bit column names what binds its kernels after their time: a limit column of its own
would take the table past 120 columns."""

from __future__ import annotations

from qbench import units
from qbench.metrics.switchback import VARIANTS
from qbench.migration import switchback
from qbench.modes import EXECS

KEYS = {"batch_size": "M", "dim_in": "in", "dim_out": "out", "dtype": "dtype",
        "backward_thread": "bwd thread"}  # shape param -> header
# variant -> its header, five characters at most: columns as narrow as their values ("1.23"; the title names the
# unit) keep the table to 120 columns with six kernel variants and three execs
LABELS = {"switchback": "sb", "switchback_rowwise": "row", "fp8": "fp8", "fp8_all": "fp8a", "fp8_cublas": "f8mm",
          "int8_cublas": "i8mm"}
KERNELS = ("eager", "per_kernel")  # (exec, timing) of the kernel sums
STEPS = "switchback"  # the module variant whose step the table shows: the layer this bench is about


def table(records: list[dict], limits=None):
    """The pivot as a report.FittedTable; the shape params every record shares listed once below it, the
    reasons of error and skipped shapes numbered below it. A column only where some record has its value; with
    `limits` (the run's qbench.explain.limits.RunLimits) the 16-bit kernels' limit after their time."""
    from qbench import report

    shapes = switchback.shapes(records)
    firsts = [group[0] for group in shapes]
    keys, fixed = report.split_fixed(firsts, list(KEYS), KEYS)
    cells = _value_columns(records, limits)
    columns = [*(report.Column(KEYS[k], key=True) for k in keys), *(c for c, _ in cells), report.STATUS]
    reasons, rows = report.Notes(), []
    for group in shapes:
        at = {switchback.where(r): r for r in group}
        row = [report.param_text(group[0]["params"].get(k)) for k in keys]
        row += [cell(at) for _, cell in cells]
        rows.append([*row, report.status_cell(_worst(group), reasons)])
    return report.FittedTable(columns, rows, title="SwitchBack vs 16-bit: a layer's training step, speed-ups (x)",
                              notes=[*report.fixed_line(fixed), *legend([c for c, _ in cells]),
                                     *report.limit_note(limits, "the 16-bit layer's kernels"), *reasons.lines()])


def _value_columns(records: list[dict], limits=None) -> list[tuple]:
    """(Column, cell(at) -> text) of each value column some record fills, in table order; `at`: (variant, exec,
    timing) -> the shape's record."""
    from qbench import report

    has = {(*switchback.where(r), name) for r in records for name in r["metrics"]}
    out = []
    if ("16bit", *KERNELS, "kernels_ms") in has:
        limited = limits is not None and not limits.missing
        out.append((report.Column("16bit", "ms, limit" if limited else "ms"),
                    _cell(("16bit", *KERNELS), "kernels_ms", units.MS, limits if limited else None)))
    for variant in VARIANTS:
        if (variant, *KERNELS, "kernels_speedup") in has:
            out.append((report.Column(LABELS[variant], "kern"), _cell((variant, *KERNELS), "kernels_speedup")))
    for mode in EXECS:
        if (STEPS, mode, "per_step", "step_speedup") in has:
            out.append((report.Column(LABELS[STEPS], mode), _cell((STEPS, mode, "per_step"), "step_speedup")))
    return out


def _cell(where: tuple[str, str, str], name: str, unit: str = units.SPEEDUP, limits=None):
    """cell(at) -> the text of metric `name` of the record at `where`; a speed-up without its 'x' (the title
    says the unit), green or red as report.value_cell colours it; with `limits` the limit binding the record
    after its value ('4.446 compute')."""
    from rich.text import Text

    from qbench import report

    def cell(at: dict) -> Text:
        record = at.get(where, {})
        value = record.get("metrics", {}).get(name)
        if unit != units.SPEEDUP or value is None:
            limit = limits.of(record) if limits is not None and record else ""
            return Text(" ".join(t for t in (report.format_value(value, unit), limit) if t))
        return Text(f"{value:.2f}", style=report.speedup_style(value))

    return cell


def _worst(group: list[dict]) -> dict:
    """The record whose status the shape's row shows: its first error or skip, else its first record."""
    return next((r for r in group if r.get("status", "ok") != "ok"), group[0])


def legend(columns: list) -> list[str]:
    """What the value columns shown hold, a line each, under the table."""
    units_shown, headers = {c.unit for c in columns}, {c.header for c in columns}
    lines = []
    if "kern" in units_shown:
        lines.append("kern: the step as the sum of its kernels, each timed alone (16bit: ms; the others: speed-up "
                     "over it)")
    if modes := [mode for mode in EXECS if mode in units_shown]:
        lines.append(f"{', '.join(modes)}: SwitchBackLinear's forward + backward timed alone in that exec, its "
                     "speed-up over nn.Linear's")
    names = ", ".join(f"{label} {name}" for name, label in LABELS.items() if label in headers and label != name)
    return [*lines, f"variants: {names}"] if names else lines
