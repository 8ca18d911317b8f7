"""`qbench switchback`: int8 SwitchBack layers against the 16-bit linear layer (seed-compatible)."""

from __future__ import annotations

import click

from qbench.options import (
    FiniteFloat,
    callback,
    device_option,
    dtype_option,
    exec_option,
    out_options,
    parse_names,
    parse_pairs,
    parse_positive_ints,
    repeat_option,
)

VARIANTS = ("global", "rowwise", "fp8", "int8_cublas", "module")
EPILOG = """\b
Examples:
  qbench switchback                                # the original's 18 pairs, M = 1024 ... 131072
  qbench switchback --dims 1024,4096               # dim -> 4*dim and back, for dim 1024 and 4096
  qbench switchback --pairs 1408x6144,6144x1408 --batch-sizes 8192,32768 --dtype bf16
  qbench switchback --dims 2048 --variants global,fp8 --repeat 20 --out results/sb --plot
  qbench switchback --pairs 1024x4096 --batch-sizes 8192 --exec eager,graph   # a GPU: module eager vs CUDA graph
"""


@click.command(epilog=EPILOG)
@click.option("--dims", callback=callback(parse_positive_ints),
              help="Layer widths: each runs dim -> wm*dim and wm*dim -> dim. [default: the seed's pairs]")
@click.option("--pairs", callback=callback(parse_pairs), help="Explicit IN x OUT pairs, e.g. 1408x6144,6144x1408.")
@click.option("--wm", type=FiniteFloat(min=0, min_open=True), default=4.0, show_default=True,
              help="MLP ratio used with --dims.")
@click.option("--batch-sizes", callback=callback(parse_positive_ints),
              help="Tokens M. [default: 1024 ... 131072 on a GPU, 64,256 on the CPU]")
@dtype_option("fp16", ("fp16", "bf16"))
@click.option("--variants", default=",".join(VARIANTS), show_default=True,
              callback=callback(parse_names(VARIANTS)), help="What to time besides the 16-bit baseline.")
@click.option("--plot", is_flag=True, help="Draw the run's figure (<run>/switchback.png) afterwards.")
@exec_option
@repeat_option
@device_option
@out_options
def command(dims, pairs, wm, batch_sizes, dtype, variants, plot, execs, repeat, device, out, append, force,
            as_json) -> None:
    """Time every component of a SwitchBack training step (int8 forward and grad-input, 16-bit
    grad-weight, quantizers) against the 16-bit layer, with the original benchmark's keys and totals,
    speed-ups, throughput, int8 errors, module-level times, and fp8 / cuBLAS int8 peers."""
    from qbench import report, store
    from qbench.benches import switchback as bench
    from qbench.commands.common import run_and_store

    if dims and pairs:
        raise click.BadParameter("give --dims or --pairs, not both", param_hint="--dims/--pairs")
    config = bench.resolve(bench.SwitchbackConfig(dims, pairs, wm, batch_sizes, dtype, variants, repeat, device, execs))
    out = out or str(store.default_run_dir(bench.BENCH))
    run_and_store(bench.BENCH, config, bench.run(config), total=len(bench.plan(config)), out=out, append=append,
                  force=force, as_json=as_json, table=bench.table, notice=report.cpu_notice(config.device))
    if plot:
        from qbench.plots import plot_run

        report.notice(f"figure: {plot_run([out])}", style="dim")
