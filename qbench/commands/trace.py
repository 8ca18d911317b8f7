"""`qbench trace FILE.csv [...]`: where the GPU time of traced steps goes, from the kernel tables that
`qbench moe`, `qbench fragmented` and `qbench switchback` write with `--trace DIR` (one CSV per rank and
configuration), or from the Chrome traces (.json.gz) beside them; with --host, where their host time goes (from
the Chrome traces, which hold the CPU side)."""

from __future__ import annotations

import sys

import click

EPILOG = """\b
Examples:
  qbench moe --world-size 1 --capacity-factor 1.0 --trace runs/moe-traces   # writes the kernel tables
  qbench trace results/moe-h200-ws1/trace-a1036c8/traces/a2a-L8-D1-hot0-randn-triton-rank0.csv
  qbench trace results/moe-h200-ws1/trace-a1036c8/traces/*-rank0.csv --by phase
  qbench trace results/fragmented-h200-trace-d2f98b5/traces/fragmented-8192-b16-n8-train-bf16-device-rank0.json.gz
  qbench trace FILE.csv --top 10 --markdown
  qbench trace results/moe-h200-ws1/hostcut-fa22f19/traces/a2a-L8-D1-hot0-randn-triton-rank0.json.gz --host
"""


@click.command(epilog=EPILOG)
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--by", type=click.Choice(("kernel", "phase")), default="kernel", show_default=True,
              help="Sum by kernel (and the phase it was launched in) or by phase.")
@click.option("--top", type=click.IntRange(min=1), default=25, show_default=True,
              help="Rows shown, largest first; the rest are summed in one row.")
@click.option("--host", is_flag=True,
              help="Host time instead: each thread's top-level ops (with their phase) and its time between them "
                   "(Chrome traces only).")
@click.option("--markdown", "fmt", flag_value="markdown", help="Print a Markdown table to paste.")
def command(files, by, top, host, fmt) -> None:
    """Per traced step: the GPU time (ms, durations summed over streams), calls and share of each kernel
    (with the phase the host launched it in) or of each phase, largest first, and the total. FILES are kernel
    tables (.csv) or the Chrome traces (.json.gz) they were made from. With --host, per traced step the host
    time of each thread's top-level ops, Python between them and waits on other threads, by op or by phase."""
    from pathlib import Path

    from qbench.traces import gpu_totals, read_gpu_table

    if host:
        _show_host(files, by, top, fmt)
        return

    tables = [(path, *gpu_totals(read_gpu_table(Path(path)), by)) for path in files]  # all read before printing
    for i, (path, totals, steps) in enumerate(tables):
        if not totals:  # a CPU run's profiler sees no GPU work
            sys.stdout.write(f"{path}: no GPU work in this table (a run on the CPU records none)\n")
            continue
        headers, rows = _rows(totals, by, top)
        caption = (f"{path}: {steps} traced steps; per step, GPU time summed over streams (work that overlaps "
                   "counts on each stream); phase: the innermost phase range open on the host when it was launched")
        _emit(i, headers, rows, caption, fmt)


def _rows(totals, by: str, top: int) -> tuple[list[str], list[list[str]]]:
    from qbench.traces import short_kernel_name

    def first(t):
        return [t.name] if by == "phase" else [short_kernel_name(t.name), t.phase]

    total = [["total"] + [""] * (by != "phase"), *_sums(totals)]
    headers = (["phase"] if by == "phase" else ["kernel", "phase"]) + NUMBERS
    return headers, _ranked(totals, top, first, total)


NUMBERS = ["calls", "ms", "share", "us/call"]


def _numbers(calls, ms, share, per_call) -> list[str]:
    # 4 significant digits (a profiler's durations carry no more; nothing here is judged against a target)
    return [f"{calls:.4g}", f"{ms:.4g}", f"{100 * share:.3g}%", per_call]


def _sums(totals) -> tuple[float, float, float, str]:
    return sum(t.calls for t in totals), sum(t.ms for t in totals), sum(t.share for t in totals), ""


def _ranked(totals, top: int, first, last: list) -> list[list[str]]:
    """The `top` largest totals (their first cells from first(total), then their numbers), the rest summed in one
    row, and `last` = [first cells, *numbers] below them."""
    rows = [first(t) + _numbers(t.calls, t.ms, t.share, f"{t.us_per_call:.4g}") for t in totals[:top]]
    rest = totals[top:]
    if rest:
        label = [""] * (len(last[0]) - 1)
        label.insert(len(label) // 2, f"({len(rest)} more)")  # in the name column
        rows.append(label + _numbers(*_sums(rest)))
    rows.append(last[0] + _numbers(*last[1:]))
    return rows


def _emit(i: int, headers, rows, caption: str, fmt) -> None:
    if fmt == "markdown":
        sys.stdout.write(("\n" if i else "") + _markdown(headers, rows, caption))
    else:
        _print(headers, rows, caption)


def _print(headers, rows, caption: str) -> None:
    from rich.table import Table
    from rich.text import Text

    from qbench.report import stdout_console

    table = Table(header_style="bold", caption=Text(caption), caption_justify="left")
    for j, header in enumerate(headers):
        table.add_column(header, justify="left" if j < len(headers) - 4 else "right",
                         overflow="fold" if j == 0 else "ellipsis")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # Text: kernel names hold [...] that is not markup
    stdout_console().print(table)


def _markdown(headers, rows, caption: str) -> str:
    from qbench.report import markdown_table

    return "\n".join(markdown_table(headers, rows)) + f"\n\n{caption}\n"


def _show_host(files, by: str, top: int, fmt) -> None:
    from pathlib import Path

    from qbench.host_trace import host_totals
    from qbench.traces import read_chrome_trace

    for path in files:
        if not path.endswith(".json.gz"):
            raise click.UsageError(f"--host reads the Chrome trace (.json.gz) beside {path}: a kernel table holds "
                                   "no host time")
    tables = [(path, *host_totals(read_chrome_trace(Path(path)), by)) for path in files]
    for i, (path, totals, steps, step_ms) in enumerate(tables):
        headers, rows = _host_rows(totals, by, top, step_ms)
        caption = (f"{path}: {steps} traced steps (the first left out: it pays the profiler's start); per step, "
                   "each thread's top-level host ops, its time between them and its waits on other threads' ops; "
                   "shares of the step; the profiler lengthens every op a little (host_ms is the measurement)")
        _emit(i, headers, rows, caption, fmt)


def _host_rows(totals, by: str, top: int, step_ms: float) -> tuple[list[str], list[list[str]]]:
    from qbench.host_trace import short_op_name

    def first(t):
        return [t.thread, t.phase] if by == "phase" else [t.thread, short_op_name(t.name), t.phase]

    step = [["step", ""] if by == "phase" else ["step", "the calling thread's range", ""], 1, step_ms, 1.0, ""]
    headers = (["thread", "phase"] if by == "phase" else ["thread", "host op", "phase"]) + NUMBERS
    return headers, _ranked(totals, top, first, step)
