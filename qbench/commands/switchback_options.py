"""The options of `qbench switchback` (the layer bench, --model and --train-check share them)."""

from __future__ import annotations

import click

from qbench.commands.switchback_block import KERNEL_VARIANTS, block_options
from qbench.options import (
    FiniteFloat,
    callback,
    device_option,
    dtype_option,
    exec_option,
    out_options,
    parse_pairs,
    parse_positive_ints,
    repeat_option,
)


def switchback_options(fn):
    """Every option of `qbench switchback`, in --help order."""
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


_OPTIONS = [
    click.option("--dims", callback=callback(parse_positive_ints),
                  help="Layer widths: each runs dim -> wm*dim and wm*dim -> dim. [default: the seed's pairs]"),
    click.option("--pairs", callback=callback(parse_pairs), help="Explicit IN x OUT pairs, e.g. 1408x6144,6144x1408."),
    click.option("--wm", type=FiniteFloat(min=0, min_open=True), default=4.0, show_default=True,
                  help="MLP ratio used with --dims."),
    click.option("--batch-sizes", callback=callback(parse_positive_ints),
                  help="Tokens M. [default: 1024 ... 131072 on a GPU, 64,256 on the CPU] With --model: images or "
                       "sequences [default: 256 (vit), 32 (gpt2-xl); CPU 1]; with --train-check: sequences per step."),
    dtype_option(None, ("fp16", "bf16"), help="Data type of activations [default: fp16; bf16 with --model or "
                                              "--train-check]."),
    click.option("--variants", help=f"What to time besides the 16-bit baseline [default: all of "
                                     f"{','.join(KERNEL_VARIANTS)}]; with --model/--train-check: "
                                     "16bit,switchback,fp8,fp8_all,torchao (torchao only when importable)."),
    click.option("--plot", is_flag=True, help="Draw the run's figure (<run>/<bench>.png) afterwards."),
    block_options,
    exec_option,
    repeat_option,
    device_option,
    out_options,
]
