"""`qbench model quirks`: each DeepFlow quirk with its effect, measured by evaluating the model exact and
with that quirk fixed (qbench.model.deepflow.effects), as a table or JSON rows."""

from __future__ import annotations

from qbench.model import search
from qbench.model.deepflow.effects import MEASURES, Effect


def _strategy(e: Effect) -> str:
    return "config's own" if not e.settings else search.describe(e.settings)


def rows(effects: list[Effect]) -> list[dict]:
    """JSON rows: quirk key (None for all quirks together), reference section, strategy, measure, values."""
    return [{"quirk": e.quirk.key if e.quirk else None, "section": e.quirk.section if e.quirk else None,
             "exact_does": e.quirk.exact if e.quirk else None, "corrected_does": e.quirk.corrected if e.quirk else None,
             "settings": e.settings, "measure": e.measure, "unit": MEASURES[e.measure][1], "exact": e.exact,
             "corrected": e.corrected, "change": e.change, "not_evaluated": e.reason or None} for e in effects]


def _value(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def _change(e: Effect, reasons) -> str:
    if e.change is None:
        return f"not expressible {reasons.mark(e.reason)}"
    return "no change" if e.change == 0 else f"{100 * e.change:+.3g}%"


def table(effects: list[Effect], config_name: str):
    """One row per quirk (and one for all of them), fitted to the console (report.FittedTable); why an effect
    is not expressible is numbered below the table."""
    from rich.text import Text

    from qbench.report import Column, FittedTable, Notes

    columns = [Column("quirk", justify="left", key=True),
               *(Column(c, justify="left") for c in ("ref", "DeepFlow (exact)", "corrected", "strategy", "measure")),
               *(Column(c) for c in ("exact", "fixed", "change"))]
    reasons, rows = Notes(), []
    for e in effects:
        label, unit, _ = MEASURES[e.measure]
        q = e.quirk
        rows.append([q.key if q else Text("all quirks", style="bold"), q.section if q else "", q.exact if q else "",
                     q.corrected if q else "--deepflow corrected", _strategy(e), f"{label} ({unit})",
                     _value(e.exact), _value(e.corrected), _change(e, reasons)])
    caption = ("each row: the model evaluated exact and with only that quirk fixed, on the strategy shown (one device "
               "plus those settings, mesh topology); 'all quirks': exact against corrected")
    return FittedTable(columns, rows, title=f"DeepFlow quirks and their effect on {config_name}",
                       notes=[caption, *reasons.lines()], show_lines=True)
