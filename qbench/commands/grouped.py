"""`qbench grouped`: the grouped GEMM kernels of the MoE expert FFN on one device, the persistent TMA
kernel against the pointer kernel, with a dense matmul of the same FLOPs as a yardstick (records of bench
grouped_gemm; qbench/benches/moe/grouped.py). `qbench moe --kernels grouped` forwards here."""

from __future__ import annotations

import click

from qbench.options import MAX_SIZE, device_option, dtypes_option, out_options

EPILOG = """\b
Examples:
  qbench grouped --dtype bf16                      # a GPU: the seed config's shapes, TMA vs pointer kernel
  qbench grouped --dtype fp16,bf16 --num-local-experts 16 --out runs/grouped
"""
_SIZE = click.IntRange(min=1, max=MAX_SIZE)


def grouped_options(fn):
    """The options of `qbench grouped`, in --help order (the expert FFN's sizes, as `qbench moe` names them)."""
    for option in reversed((
        click.option("--model-dim", type=_SIZE, help="d. [default: 1024; CPU: 64]"),
        click.option("--hidden-size", type=_SIZE, help="h of the expert FFN. [default: 4096; CPU: 128]"),
        click.option("--num-local-experts", type=_SIZE, default=8, show_default=True, help="Groups G."),
        click.option("--samples", type=_SIZE, help="Tokens routed per step. [default: 8192; CPU: 256]"),
        click.option("--top-k", type=_SIZE, default=2, show_default=True, help="Rows per token."),
        dtypes_option("fp16", ("fp16", "bf16")),
        device_option,
        out_options,
    )):
        fn = option(fn)
    return fn


@click.command(epilog=EPILOG)
@grouped_options
def command(dtypes, out, append, force, as_json, **sizes) -> None:
    """The grouped GEMM kernels of the MoE expert FFN: the persistent TMA kernel against the pointer kernel,
    and a dense matmul of the same FLOPs. Every case is first checked (both kernels against the plain-torch
    reference and each other); any mismatch makes every record an error and nothing is timed. Then all
    three are timed, L2 flushed between repeats."""
    run_grouped(sizes, dtypes, out=out, append=append, force=force, as_json=as_json)


def run_grouped(sizes: dict, dtypes: tuple[str, ...], *, out, append: bool, force: bool, as_json: bool) -> str:
    """Records of bench grouped_gemm over each dtype; returns the run directory. sizes: MoEBenchConfig
    fields (model_dim, hidden_size, num_local_experts, samples, top_k, device)."""
    from qbench import report
    from qbench.benches.moe import grouped as bench
    from qbench.benches.moe.config import MoEBenchConfig
    from qbench.runner import Output, run_bench

    experts = sizes.pop("num_local_experts")
    experts = experts if isinstance(experts, tuple) else (experts,)
    configs = [bench.resolve(MoEBenchConfig(kernels="grouped", world_size=1, backend="auto", dtype=dtype,
                                            num_local_experts=experts, **sizes)) for dtype in dtypes]
    output = Output(out=out, append=append, force=force, as_json=as_json)
    out, _ = run_bench(bench, configs, output, notice=report.cpu_notice(configs[0].device))
    return out


def forward_from_moe(fields: dict, plot, *, out, append: bool, force: bool, as_json: bool) -> None:
    """`qbench moe --kernels grouped`, the spelling before this command: the same run from moe's fields."""
    from qbench.commands.common import check_plot, draw_figure

    check_plot(plot)
    sizes = {k: fields[k] for k in ("model_dim", "hidden_size", "num_local_experts", "samples", "top_k", "device")}
    run = run_grouped(sizes, fields["dtypes"] or ("fp16",), out=out, append=append, force=force, as_json=as_json)
    draw_figure(plot, run)
