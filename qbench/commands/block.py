"""`qbench block`: a training step of a transformer block stack per linear-layer variant (16-bit,
SwitchBack, fp8, torchao), in each execution mode (records of bench block). `qbench switchback --model`
forwards here too. Imports no torch until the bench runs."""

from __future__ import annotations

import click

from qbench.commands.switchback_options import BLOCK_VARIANTS, MODEL_PRESETS, one_of, split_names, variants_of
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

    check_plot(plot)
    draw_figure(plot, run_block(flags))


def run_block(f: dict) -> str:
    """Records of bench block; returns the run directory. f: presets, batch_sizes, layers, dtypes, variants,
    execs, steps (timed repeats), device, out, append, force, as_json."""
    from qbench import report
    from qbench.benches import block as bench
    from qbench.runner import Output, run_bench

    presets = one_of(f["presets"], tuple(bench.PRESETS), "--preset")
    variants = variants_of(f["variants"], BLOCK_VARIANTS)
    configs = [bench.resolve(bench.BlockConfig(presets=presets, batch_sizes=f["batch_sizes"], layers=f["layers"],
                                               dtype=dtype, variants=variants, execs=f["execs"], repeat=f["steps"],
                                               device=f["device"])) for dtype in f["dtypes"] or ("bf16",)]
    output = Output(out=f["out"], append=f["append"], force=f["force"], as_json=f["as_json"])
    out, _ = run_bench(bench, configs, output, notice=report.cpu_notice(configs[0].device))
    return out
