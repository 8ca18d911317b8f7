"""The block-stack benches behind `qbench block` (a training step of a transformer block stack per
linear-layer variant, bench switchback_model) and `qbench train-check` (does the stack still train?,
bench switchback_train), and the seed-format writer of the layer bench. `qbench switchback --model` and
`--train-check` forward here too. Imports no torch until a bench runs."""

from __future__ import annotations

import click

from qbench.commands.switchback_options import BLOCK_VARIANTS, TRAIN_SIZES, one_of, variants_of


def run_block(f: dict) -> str:
    """Records of bench switchback_model; returns the run directory. f: presets, batch_sizes, layers,
    dtypes, variants, execs, steps (timed repeats), device, out, append, force, as_json."""
    from qbench import report, store
    from qbench.benches.switchback import model as bench
    from qbench.benches.switchback import model_run
    from qbench.benches.switchback.model_table import model_table
    from qbench.commands.common import over_dtypes, run_and_store

    models = one_of(f["presets"], tuple(bench.PRESETS), "--preset")
    variants = variants_of(f["variants"], BLOCK_VARIANTS)
    configs = [bench.resolve(bench.ModelConfig(models=models, batch_sizes=f["batch_sizes"], layers=f["layers"],
                                               dtype=dtype, variants=variants, execs=f["execs"], repeat=f["steps"],
                                               device=f["device"])) for dtype in f["dtypes"] or ("bf16",)]
    config, records = over_dtypes(configs, [model_run.run(c) for c in configs])
    total = sum(bench.count(c) for c in configs)
    out = f["out"] or str(store.default_run_dir(bench.BENCH))
    run_and_store(bench.BENCH, config, records, total=total, out=out, append=f["append"], force=f["force"],
                  as_json=f["as_json"], table=model_table, notice=report.cpu_notice(config.device))
    return out


def run_train(f: dict) -> str:
    """Records of bench switchback_train; returns the run directory. f: presets (at most one), variants,
    layers, batch_sizes (at most one), steps (training steps), dtypes, device, out, append, force, as_json."""
    from qbench import report, store
    from qbench.benches.switchback import train as bench
    from qbench.benches.switchback import train_loop
    from qbench.benches.switchback.model_table import train_table
    from qbench.commands.common import over_dtypes, run_and_store

    presets = one_of(f["presets"], TRAIN_SIZES, "--preset")
    variants, batches = variants_of(f["variants"], BLOCK_VARIANTS), f["batch_sizes"]
    if len(presets or ()) > 1 or len(batches or ()) > 1:
        raise click.UsageError("train-check trains one size: give one --preset and at most one --batch-size")
    resolved = [bench.resolve(bench.TrainConfig(
        model=presets[0] if presets else None, variants=variants, layers=f["layers"],
        batch=batches[0] if batches else None, steps=f["steps"], dtype=dtype, device=f["device"]))
        for dtype in f["dtypes"] or ("bf16",)]
    preset = resolved[0][1]
    report.notice(f"{resolved[0][0].model} on {resolved[0][0].device}: {preset}", style="dim")
    configs = [c for c, _ in resolved]
    config, records = over_dtypes(configs, [train_loop.run(c, preset) for c in configs])
    total = sum(len(c.variants) for c in configs)
    out = f["out"] or str(store.default_run_dir(bench.BENCH))
    run_and_store(bench.BENCH, config, records, total=total, out=out, append=f["append"], force=f["force"],
                  as_json=f["as_json"], table=train_table, notice=report.cpu_notice(config.device))
    return out


def write_seed(out: str) -> None:
    """<run>/info.jsonl: the run's ok records in the original benchmark's line format."""
    from pathlib import Path

    from qbench import report, store
    from qbench.importers.bnb import format_bnb_jsonl

    if not (Path(out) / store.RECORDS_FILE).exists():
        return
    lines, left_out = format_bnb_jsonl(store.read_records(out))
    path = store.write_export(out, "info.jsonl", lines)
    skipped = f"; {left_out} shapes left out (a record not ok, or --variants lacks seed keys)" if left_out else ""
    report.notice(f"seed format: {len(lines)} lines in {path}{skipped}", style="dim")
