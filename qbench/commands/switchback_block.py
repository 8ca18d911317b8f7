"""The block-level paths of `qbench switchback`: --model (a training step of a transformer block
stack per linear-layer variant) and --train-check (does it still train?), their options, and the
checks that keep the layer bench's flags and theirs apart. Imports no torch until a path runs."""

from __future__ import annotations

import click

from qbench.options import callback, parse_names

KERNEL_VARIANTS = ("global", "rowwise", "fp8", "fp8_all", "int8_cublas", "module")  # = sweep.VARIANTS
BLOCK_VARIANTS = ("16bit", "switchback", "fp8", "fp8_all", "torchao")  # = benches.switchback.model.VARIANTS
MODEL_PRESETS = ("vit-h", "vit-l", "gpt2-xl")  # shown in help; a hidden test size "tiny" exists too
TRAIN_SIZES = ("lm-small", "lm-tiny")


def block_options(fn):
    """--model, --layers, --train-check, --steps, --format."""
    for option in reversed((
        click.option("--model", "models", callback=callback(_split_names),
                     help=f"Time a training step of a block stack instead of one layer: {', '.join(MODEL_PRESETS)} "
                          f"(comma list). With --train-check: {', '.join(TRAIN_SIZES)}."),
        click.option("--layers", type=click.IntRange(min=1),
                     help="Blocks in the stack. [default: 4 on a GPU (fits, compiles in about a minute), 1 on "
                          "the CPU; --train-check: the size's own]"),
        click.option("--train-check", is_flag=True,
                     help="Train a tiny decoder on a synthetic Markov chain with each variant; report loss curves "
                          "and the final-loss gap to 16-bit and to the chain's entropy."),
        click.option("--steps", type=click.IntRange(min=1),
                     help="--train-check training steps. [default: 600 (lm-small), 60 (lm-tiny)]"),
        click.option("--format", "fmt", type=click.Choice(("table", "seed")), default="table", show_default=True,
                     help="'seed' also writes <run>/info.jsonl in the original benchmark's format (layer bench)."),
    )):
        fn = option(fn)
    return fn


def _split_names(value):
    """'vit-h,vit-l' -> ('vit-h', 'vit-l'); the names are checked by the path that uses them."""
    if value is None or isinstance(value, tuple):
        return value
    items = tuple(v.strip() for v in value.split(","))
    if not all(items):
        raise click.BadParameter(f"{value!r} has an empty item; give names like vit-h,vit-l")
    return items


def check_flags(flags: dict) -> None:
    """One-line usage errors for flags that belong to another path."""
    block = flags["models"] or flags["train_check"]
    if block and (flags["dims"] or flags["pairs"]):
        raise click.UsageError("--dims/--pairs size the layer bench; --model/--train-check use presets")
    if not block and (flags["layers"] or flags["steps"]):
        raise click.UsageError("--layers and --steps apply to --model or --train-check")
    if flags["steps"] and not flags["train_check"]:
        raise click.UsageError("--steps applies to --train-check (--model times steps: use --repeat)")
    if block and flags["fmt"] == "seed":
        raise click.UsageError("--format seed writes the layer bench's info.jsonl; drop --model/--train-check")
    if flags["train_check"] and (flags["execs"] or flags["repeat"]):
        raise click.UsageError("--train-check trains eagerly and times nothing: drop --exec/--repeat")


def variants_of(value: str | None, choices: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return choices
    try:
        return parse_names(choices)(value)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint="--variants") from None


def _one_of(names, choices, flag: str) -> tuple[str, ...]:
    unknown = [n for n in names or () if n not in choices]
    if unknown:
        raise click.BadParameter(f"unknown {unknown[0]}; choose from {', '.join(choices)}", param_hint=flag)
    return names


def run_model(flags: dict) -> str:
    """The --model path: records of bench switchback_model; returns the run directory."""
    from qbench import report, store
    from qbench.benches.switchback import model as bench
    from qbench.benches.switchback import model_run
    from qbench.benches.switchback.model_table import model_table
    from qbench.commands.common import run_and_store

    models = _one_of(flags["models"], tuple(bench.PRESETS), "--model")
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

    models = _one_of(flags["models"], TRAIN_SIZES, "--model")
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

