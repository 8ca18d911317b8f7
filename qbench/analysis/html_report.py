"""`qbench report RUN... --html FILE`: one self-contained HTML page to attach to a pull request.

The page holds, in order: the runs' environment (GPU, driver, versions, commit, command), the tables
`qbench summary` prints (built by qbench.analysis.summary, one per bench), the standard figure of each
bench (qbench.plots), the comparison against the first run when several runs are given (qbench.analysis.compare,
as `qbench compare` prints it) and, when the runs span several commits, the history table and figure
(qbench.analysis.history). Nothing is fetched when it is opened: the CSS is inline, the figures are inline
SVG (matplotlib writes text as paths, so no font is needed), and the page has no script.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from typing import Any

from qbench.analysis.compare import Run
from qbench.errors import QbenchUsageError

ENV_KEYS = ("gpu_name", "driver", "cuda", "torch", "triton", "git_commit", "git_dirty", "time_utc", "host", "command")
STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto; max-width: 1400px;
       padding: 0 1em; color: #1b1f24; background: #ffffff; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .85em; }
th, td { border: 1px solid #d0d7de; padding: .25em .5em; text-align: right; vertical-align: top; }
th { background: #f3f5f7; } td.key, th.key { text-align: left; }
p.legend { font-size: .8em; color: #57606a; margin: .1em 0; }
figure { margin: 1em 0; overflow-x: auto; } svg { max-width: 100%; height: auto; }
"""


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], keys: int = 1) -> str:
    """An HTML table of text cells (escaped); the first `keys` columns left-aligned."""
    def cells(tag: str, values: Sequence[str]) -> str:
        key = ' class="key"'
        return "".join(f"<{tag}{key if i < keys else ''}>{html.escape(str(v))}</{tag}>" for i, v in enumerate(values))

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return f"<table><thead><tr>{cells('th', headers)}</tr></thead><tbody>{body}</tbody></table>"


def legend(lines: Sequence[str]) -> str:
    return "".join(f'<p class="legend">{html.escape(line)}</p>' for line in lines)


def svg(fig) -> str:
    """The figure as inline SVG markup (without the XML prolog), the figure closed."""
    from matplotlib import pyplot as plt

    buffer = io.StringIO()
    try:
        fig.savefig(buffer, format="svg", bbox_inches="tight")
    finally:
        plt.close(fig)
    text = buffer.getvalue()
    return "<figure>" + text[text.index("<svg"):] + "</figure>"


def environment(runs: Sequence[Run]) -> str:
    rows = [[key, *(_text(run.env.get(key)) for run in runs)] for key in ENV_KEYS
            if any(run.env.get(key) is not None for run in runs)]
    return "<h2>Environment</h2>" + table(["", *(run.label for run in runs)], rows, keys=len(runs) + 1)


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def summaries(runs: Sequence[Run], metrics: Sequence[str], pattern: str | None, digits: int) -> str:
    from qbench.analysis import summary, summary_output

    parts = ["<h2>Summary</h2>"]
    for bench, group in summary.bench_groups(runs).items():
        parts.append(f"<h3>{html.escape(bench)}: {html.escape(', '.join(r.label for r in group))}</h3>")
        try:
            built = summary.summarize_runs(group, summary.SummaryOptions(tuple(metrics), pattern))
        except QbenchUsageError as exc:  # --metric or -k leaves this bench nothing: say so, show the others
            parts.append(legend([f"nothing to show: {exc}"]))
            continue
        headers, rows = summary_output.text_rows(built, digits)
        parts += [table(headers, rows, keys=len(built.row_params)), legend(summary_output.legend(built))]
    return "".join(parts)


def figures(plt, runs: Sequence[Run]) -> str:
    from qbench import plots

    columns = plots.load_columns([run.label for run in runs])
    drawn = [c for c in columns if c[1] in plots.BENCHES]
    left = sorted({c[1] for c in columns} - {c[1] for c in drawn})
    note = legend([f"no standard figure for {', '.join(left)}"]) if left else ""
    return "<h2>Figures</h2>" + (svg(plots.figure(plt, drawn)) if drawn else "") + note


def comparison(runs: Sequence[Run], metrics: Sequence[str], pattern: str | None) -> str:
    from qbench import report
    from qbench.analysis import compare

    result = compare.compare_runs(runs, compare.CompareOptions(tuple(metrics), pattern=pattern, cross_env=True))
    headers, rows, shared = report.comparison_rows(result)
    notes = [f"reference: {runs[0].label}", *(f"environment differs: {w}" for w in result.env_warnings)]
    notes += [f"{cand}: {report.counts_line(counts)}" for cand, counts in result.counts.items()]
    notes += [f"every case: {shared}"] if shared else []
    return "<h2>Comparison</h2>" + table(headers, rows) + legend(notes)


def history_section(plt, runs: Sequence[Run], metrics: Sequence[str], pattern: str | None, digits: int) -> str:
    from qbench.analysis import history, history_output
    from qbench.plots import history as history_figure

    built = history.build(runs, metrics, pattern)
    if not any(len(s.points) > 1 for s in built.series):
        return ""  # no configuration measured at two revisions: nothing to follow
    headers, rows = history_output.rows(built, digits)
    keys = len(headers) - len(built.revisions) - 1
    return ("<h2>History</h2>" + table(headers, rows, keys=keys) + legend(history_output.legend(built))
            + svg(history_figure.figure(plt, built)))


def _or_reason(title: str, section) -> str:
    """The section, or its title and why the runs have none (no case in common, say): a page, not an error."""
    try:
        return section()
    except QbenchUsageError as exc:
        return f"<h2>{title}</h2>" + legend([f"none: {exc}"])


def page(runs: Sequence[Run], metrics: Sequence[str] = (), pattern: str | None = None, digits: int = 4) -> str:
    """The whole HTML page of these runs (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    title = "qbench report: " + ", ".join(run.label for run in runs)
    body = [f"<h1>{html.escape(title)}</h1>", environment(runs), summaries(runs, metrics, pattern, digits),
            figures(plt, runs)]
    if len(runs) > 1:
        body += [_or_reason("Comparison", lambda: comparison(runs, metrics, pattern)),
                 _or_reason("History", lambda: history_section(plt, runs, metrics, pattern, digits))]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")
