"""The block-level paths of `qbench switchback`: --model (a training step of a transformer block
stack per linear-layer variant) and --train-check (does it still train?); their options and flag
checks are in switchback_options.py. Imports no torch until a path runs."""

from __future__ import annotations

import click

from qbench.commands.switchback_options import BLOCK_VARIANTS, TRAIN_SIZES, one_of, variants_of


def run_model(flags: dict) -> str:
    """The --model path: records of bench switchback_model; returns the run directory."""
    from qbench import report, store
    from qbench.benches.switchback import model as bench
    from qbench.benches.switchback import model_run
    from qbench.benches.switchback.model_table import model_table
    from qbench.commands.common import run_and_store

    models = one_of(flags["models"], tuple(bench.PRESETS), "--model")
    variants = variants_of(flags["variants"], BLOCK_VARIANTS)
    config = bench.resolve(bench.ModelConfig(models, flags["batch_sizes"], flags["layers"], flags["dtype"] or "bf16",
                                             variants, flags["execs"], flags["repeat"], flags["device"]))
    out = flags["out"] or str(store.default_run_dir(bench.BENCH))
    run_and_store(bench.BENCH, config, model_run.run(config), total=bench.count(config), out=out,
                  append=flags["append"], force=flags["force"], as_json=flags["as_json"], table=model_table,
                  notice=report.cpu_notice(config.device))
    return out


def run_train(flags: dict) -> str:
    """The --train-check path: records of bench switchback_train; returns the run directory."""
    from qbench import report, store
    from qbench.benches.switchback import train as bench
    from qbench.benches.switchback import train_loop
    from qbench.benches.switchback.model_table import train_table
    from qbench.commands.common import run_and_store

    models = one_of(flags["models"], TRAIN_SIZES, "--model")
    variants, batches = variants_of(flags["variants"], BLOCK_VARIANTS), flags["batch_sizes"]
    if len(models or ()) > 1 or len(batches or ()) > 1:
        raise click.UsageError("--train-check trains one size: give one --model and at most one --batch-sizes")
    config, preset = bench.resolve(bench.TrainConfig(
        models[0] if models else None, variants, flags["layers"], batches[0] if batches else None, flags["steps"],
        None, flags["dtype"] or "bf16", flags["device"]))
    report.notice(f"{config.model} on {config.device}: {preset}", style="dim")
    out = flags["out"] or str(store.default_run_dir(bench.BENCH))
    run_and_store(bench.BENCH, config, train_loop.run(config, preset), total=len(config.variants), out=out,
                  append=flags["append"], force=flags["force"], as_json=flags["as_json"], table=train_table,
                  notice=report.cpu_notice(config.device))
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
    skipped = f"; {left_out} records left out (not ok, or a --variants subset lacks seed keys)" if left_out else ""
    report.notice(f"seed format: {len(lines)} lines in {path}{skipped}", style="dim")

