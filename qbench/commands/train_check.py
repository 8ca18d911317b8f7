"""`qbench train-check`: does a small decoder built from each linear-layer variant still train? (records
of bench train_check). `qbench switchback --train-check` forwards here too. Imports no torch until the bench
runs."""

from __future__ import annotations

import click

from qbench.commands.switchback_options import BLOCK_VARIANTS, TRAIN_SIZES, one_of, split_names, variants_of
from qbench.options import (
    callback,
    device_option,
    dtypes_option,
    out_options,
    parse_positive_ints,
    plot_option,
    steps_option,
)

EPILOG = """\b
Examples:
  qbench train-check                                   # lm-small on a GPU, lm-tiny on the CPU
  qbench train-check --variants switchback,fp8 --steps 300 --plot
  qbench train-check --preset lm-tiny --dtype bf16,fp16 --out runs/train-check
"""


def train_check_options(fn):
    """The options of `qbench train-check`, in --help order."""
    for option in reversed((
        click.option("--preset", "--model", "presets", callback=callback(split_names),
                     help=f"Decoder size: {', '.join(TRAIN_SIZES)}. [default: lm-small on a GPU, lm-tiny on the "
                          "CPU]"),
        click.option("--layers", type=click.IntRange(min=1), help="Blocks. [default: the size's own]"),
        click.option("--batch-size", "--batch-sizes", "batch_sizes", callback=callback(parse_positive_ints),
                     help="Sequences per step. [default: the size's own]"),
        steps_option("Training steps. [default: 600 (lm-small), 60 (lm-tiny)]"),
        dtypes_option("bf16", ("fp16", "bf16")),
        click.option("--variants", help=f"Linear layers to train with: {','.join(BLOCK_VARIANTS)} [default: all; "
                                        "torchao only when importable]."),
        device_option,
        plot_option,
        out_options,
    )):
        fn = option(fn)
    return fn


@click.command(epilog=EPILOG)
@train_check_options
def command(plot, **flags) -> None:
    """Train a tiny decoder on a synthetic Markov chain with each variant's linear layers; report loss
    curves and the final-loss gap to 16-bit and to the chain's entropy."""
    from qbench.commands.common import check_plot, draw_figure

    check_plot(plot)
    draw_figure(plot, run_train(flags))


def run_train(f: dict) -> str:
    """Records of bench train_check; returns the run directory. f: presets (at most one), variants, layers,
    batch_sizes (at most one), steps (training steps), dtypes, device, out, append, force, as_json."""
    from qbench import report
    from qbench.benches import train_check as bench
    from qbench.runner import Output, run_bench

    presets = one_of(f["presets"], TRAIN_SIZES, "--preset")
    variants, batches = variants_of(f["variants"], BLOCK_VARIANTS), f["batch_sizes"]
    if len(presets or ()) > 1 or len(batches or ()) > 1:
        raise click.UsageError("train-check trains one size: give one --preset and at most one --batch-size")
    configs = [bench.resolve(bench.TrainConfig(
        preset=presets[0] if presets else None, variants=variants, layers=f["layers"],
        batch=batches[0] if batches else None, steps=f["steps"], dtype=dtype, device=f["device"]))
        for dtype in f["dtypes"] or ("bf16",)]
    report.notice(f"{configs[0].preset} on {configs[0].device}: {configs[0].sizes}", style="dim")
    output = Output(out=f["out"], append=f["append"], force=f["force"], as_json=f["as_json"])
    out, _ = run_bench(bench, configs, output, notice=report.cpu_notice(configs[0].device))
    return out
