"""`qbench block`: a training step of a transformer block stack per linear-layer variant (16-bit,
SwitchBack, fp8, torchao), in each execution mode (records of bench switchback_model)."""

from __future__ import annotations

import click

from qbench.commands.switchback_options import BLOCK_VARIANTS, MODEL_PRESETS, split_names
from qbench.options import (
    callback,
    device_option,
    dtypes_option,
    exec_option,
    out_options,
    parse_positive_ints,
    plot_option,
    steps_option,
)

EPILOG = """\b
Examples:
  qbench block --preset vit-h --batch-sizes 256 --exec compile   # 4-block CLIP ViT-H training step
  qbench block --preset vit-l,gpt2-xl --variants 16bit,switchback,fp8 --layers 2
  qbench block --preset vit-l --dtype bf16,fp16 --steps 20 --out runs/block --plot
"""


def block_options(fn):
    """The options of `qbench block`, in --help order."""
    for option in reversed((
        click.option("--preset", "--model", "presets", default="vit-h", show_default=True,
                     callback=callback(split_names),
                     help=f"Block stacks to time: {', '.join(MODEL_PRESETS)} (comma list)."),
        click.option("--layers", type=click.IntRange(min=1),
                     help="Blocks in the stack. [default: 4 on a GPU (fits, compiles in about a minute), 1 on the "
                          "CPU]"),
        click.option("--batch-sizes", callback=callback(parse_positive_ints),
                     help="Images or sequences per step. [default: 256 (vit), 32 (gpt2-xl); CPU 1]"),
        dtypes_option("bf16", ("fp16", "bf16")),
        click.option("--variants", help=f"Linear layers to compare: {','.join(BLOCK_VARIANTS)} [default: all; "
                                        "torchao only when importable]."),
        exec_option,
        steps_option("Timed steps per configuration. [default: as many as fit the time budget]", "--repeat"),
        device_option,
        plot_option,
        out_options,
    )):
        fn = option(fn)
    return fn


@click.command(epilog=EPILOG)
@block_options
def command(plot, **flags) -> None:
    """A training step (forward, loss, backward, AdamW) of a transformer block stack whose linear layers
    are each variant in turn, checked against the 16-bit stack, in each execution mode; step time,
    the share of it in the linear layers, peak memory."""
    from qbench.commands.common import check_plot, draw_figure
    from qbench.commands.switchback_block import run_block

    check_plot(plot)
    draw_figure(plot, run_block(flags))
