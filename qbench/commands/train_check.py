"""`qbench train-check`: does a small decoder built from each linear-layer variant still train? (records
of bench switchback_train)."""

from __future__ import annotations

import click

from qbench.commands.switchback_options import BLOCK_VARIANTS, TRAIN_SIZES, split_names
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
    from qbench.commands.switchback_block import run_train

    check_plot(plot)
    draw_figure(plot, run_train(flags))
