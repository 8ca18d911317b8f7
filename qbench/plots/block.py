"""`qbench block` figure: speed-up of the training step over 16-bit per variant, and the
share of the step the linear layers take, per preset / batch size / execution mode."""

from __future__ import annotations

from qbench.plots.base import no_data, value

# one colour per linear-layer variant in every panel of the block and train-check figures
COLORS = {"16bit": "tab:gray", "switchback": "tab:blue", "fp8": "tab:orange", "fp8_all": "tab:red",
          "torchao": "tab:green"}


def _group(record) -> str:
    p = record["params"]
    return f"{p['preset']} B{p['batch_size']}\n{p['exec']}"


def table_of(records, metric: str) -> tuple[list[str], list[str], dict]:
    """(x groups 'preset B<batch> / exec', variants, {(group, variant): value}), in record order."""
    groups, variants, values = [], [], {}
    for rec in records:
        group, variant = _group(rec), rec["params"]["variant"]
        groups += [group] if group not in groups else []
        variants += [variant] if variant not in variants else []
        if value(rec, metric) is not None:
            values[(group, variant)] = value(rec, metric)
    return groups, variants, values


def _bars(ax, records, metric: str) -> bool:
    """Grouped bars: one group per preset / batch / mode, one bar per variant; False when none."""
    groups, variants, values = table_of(records, metric)
    width = 0.8 / max(1, len(variants))
    for j, variant in enumerate(variants):
        shown = [(i, values[(g, variant)]) for i, g in enumerate(groups) if (g, variant) in values]
        offset = (j - (len(variants) - 1) / 2) * width
        ax.bar([i + offset for i, _ in shown], [v for _, v in shown], width=width, label=variant,
               color=COLORS.get(variant))
    ax.set_xticks(range(len(groups)), groups, fontsize=7)
    return bool(values)


def speedup_panel(ax, records, env) -> None:
    if not _bars(ax, records, "step_speedup"):
        return no_data(ax, "no speed-ups in these records")
    ax.axhline(1, color="0.5", linewidth=0.8)
    ax.set(ylabel="training step speed-up over 16-bit (x)", title="block stack: step speed-up")
    ax.legend(fontsize=7)


def share_panel(ax, records, env) -> None:
    if not _bars(ax, records, "linear_share"):
        return no_data(ax, "no linear-layer shares in these records")
    ax.set(ylabel="linear layers alone / step time", title="share of the step in the linear layers")
    ax.legend(fontsize=7)


PANELS = (speedup_panel, share_panel)
