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


def _status(rec: dict) -> str:
    return rec["status"] if rec["status"] == "ok" else f"{rec['status']}: {(rec['error'] or '')[:60]}"


def _styled(value, unit) -> str:
    from qbench.report import format_value, speedup_style

    text = format_value(value, unit)
    style = speedup_style(value) if unit == units.SPEEDUP else None
    return f"[{style}]{text}[/{style}]" if style else text


def model_table(records: list[dict]):
    """One row per preset x batch x execution mode x variant."""
    from rich.table import Table

    t = Table(title="Transformer block stack: one training step (forward, backward, AdamW) per linear-layer variant",
              header_style="bold")
    for name in ("model", "B", "L", "exec", "variant", *(h for _, h, _ in MODEL_COLUMNS), "status"):
        t.add_column(name, justify="right")
    for rec in records:
        p, m = rec["params"], rec["metrics"]
        cells = [p["model"], str(p["batch_size"]), str(p["layers"]), p["exec"], p["variant"]]
        t.add_row(*cells, *(_styled(m.get(k), u) for k, _, u in MODEL_COLUMNS), _status(rec))
    return t


def train_table(records: list[dict]):
    """One row per variant: nats per token."""
    from rich.table import Table

    from qbench.report import format_value

    first = records[0]["params"] if records else {}
    title = (f"Train check ({first.get('model')}, {first.get('steps')} steps, {first.get('dtype')}): "
             "cross-entropy in nats per token on a Markov chain with a known floor")
    t = Table(title=title, header_style="bold")
    for name in ("variant", *(h for _, h in TRAIN_COLUMNS), "status"):
        t.add_column(name, justify="right")
    for rec in records:
        m = rec["metrics"]
        t.add_row(rec["params"]["variant"], *(format_value(m.get(k)) for k, _ in TRAIN_COLUMNS), _status(rec))
    return t
