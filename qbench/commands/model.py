"""`qbench model`: the analytical model (DeepFlow LSTM, roofline floors, calibration, --against)."""

from __future__ import annotations

import contextlib

import click

from qbench.errors import QbenchUsageError
from qbench.options import callback, out_options, parse_names

EPILOG = """\b
Examples:
  qbench model lstm --config deepflow.yaml --debug
  qbench model lstm --config deepflow.yaml --set model_param.batch_size=64
  qbench model lstm --config deepflow.yaml --sweep scheduling_param.dp=1,2,4,8 --set scheduling_param.topology=mesh
  qbench model search --config deepflow.yaml --devices 8 --topologies ring,mesh --time-budget 0.5
  qbench model search-hw --config deepflow.yaml --starts 4 --tokens 7.7e10 --hours 24
  qbench model search-hw --config deepflow.yaml --workload transformer --shape layers=24 --shape hidden=2048
  qbench model gemm --m 8192 --k 4096 --n 4096 --dtype bf16 --gpu h200
  qbench model floors switchback batch_size=32768 dim_in=1024 dim_out=4096 dtype=bf16
  qbench model --against results/switchback-20250101T000000Z --gpu h200
  qbench model calibrate --file results/model-calibration-h200.yaml
"""
GPUS = ("h100", "h200", "a100-40gb", "a100-80gb")


@contextlib.contextmanager
def _usage_errors():
    """Model errors (bad config keys, unknown GPUs) become one-line usage errors, exit 2."""
    try:
        yield
    except ValueError as exc:
        if isinstance(exc, QbenchUsageError):
            raise
        raise QbenchUsageError(str(exc)) from None


def _gpu_options(fn):
    fn = click.option("--calibrated", type=click.Path(dir_okay=False), help="A `qbench model calibrate` file.")(fn)
    return click.option("--gpu", type=click.Choice(GPUS, case_sensitive=False), help="Datasheet preset.")(fn)


@click.group(invoke_without_command=True, epilog=EPILOG)
@click.option("--against", "run", type=click.Path(), help="A stored run: add floor, bound, fraction of roofline.")
@_gpu_options
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.pass_context
def command(ctx, run, gpu, calibrated, as_json) -> None:
    """How fast could it be? DeepFlow's LSTM language-model model, roofline floors of qbench's
    workloads, and (with --against RUN) every stored time next to its floor."""
    if ctx.invoked_subcommand is not None:
        return
    if not run:
        click.echo(ctx.get_help())
        return
    from qbench.model.commands import show_against

    with _usage_errors():
        show_against(run, gpu, calibrated, as_json)


@command.command(epilog=EPILOG)
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False), help="DeepFlow YAML.")
@click.option("--debug", is_flag=True, help="Print DeepFlow's per-kernel lines too.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config value.")
@click.option("--sweep", metavar="SECTION.KEY=V1,V2,...", help="Evaluate once per value.")
@out_options
def lstm(config_path, debug, overrides, sweep, out, append, force, as_json) -> None:
    """DeepFlow's LSTM language-model step time, memory and parameters, with DeepFlow's report."""
    from qbench.model.commands import run_lstm

    with _usage_errors():
        run_lstm(config_path, debug, overrides, sweep, out, append, force, as_json)


def _workload_options(fn):
    """--workload, --shape and the time budget, shared by search and search-hw."""
    opts = [
        click.option("--hours", type=click.FloatRange(min=0, min_open=True), help="Wall-clock target (with --tokens)."),
        click.option("--tokens", type=click.FloatRange(min=1), help="Training tokens: budget = hours / steps."),
        click.option("--time-budget", type=click.FloatRange(min=0, min_open=True), help="Seconds allowed per step."),
        click.option("--shape", multiple=True, metavar="KEY=VALUE",
                     help="Transformer shape: batch, seq, layers, hidden, heads, vocab, ffn, recompute."),
        click.option("--workload", type=click.Choice(("lstm", "transformer")), default="lstm", show_default=True,
                     help="The config's LSTM, or a dense transformer on the config's hardware."),
        click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config value."),
        click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False), help="DeepFlow YAML."),
    ]
    for opt in opts:
        fn = opt(fn)
    return fn


@command.command(epilog=EPILOG)
@_workload_options
@click.option("--devices", type=click.IntRange(min=1), required=True, help="Number of devices.")
@click.option("--topologies", callback=callback(parse_names(("ring", "mesh"))), default="mesh",
              show_default=True, help="Comma list of ring, mesh.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True, help="Rows to show.")
@click.option("--json", "as_json", is_flag=True, help="Print the ranking as JSON.")
def search(**opts) -> None:
    """Rank parallelism strategies x topologies for N devices by predicted step time; mark those that do
    not fit in memory or miss the time budget."""
    from qbench.model.search_commands import run_search

    with _usage_errors():
        run_search(opts)


@command.command("search-hw", epilog=EPILOG)
@_workload_options
@click.option("--budget-key", type=click.Choice(("power_breakdown",)), default="power_breakdown",
              show_default=True, help="The budget whose split is searched.")
@click.option("--keys", callback=callback(parse_names(("core", "DRAM", "L2", "shared_mem", "IB"))),
              default="core,DRAM,L2,shared_mem", show_default=True, help="Fractions to search.")
@click.option("--starts", type=click.IntRange(min=1), default=4, show_default=True, help="Start 0 = config's split.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random starts.")
@click.option("--iterations", type=click.IntRange(min=1), default=60, show_default=True, help="Per start.")
@click.option("--bounds", default="0.01:0.9", show_default=True, metavar="LO:HI", help="Each fraction's range.")
@out_options
def search_hw(**opts) -> None:
    """Search how the power budget is split between core, DRAM, L2, shared memory (and IB) by projected
    gradient descent from several starts; report the best split, its time, memory fit and the path."""
    from qbench.model.search_commands import run_search_hw

    with _usage_errors():
        run_search_hw(opts)


@command.command(epilog=EPILOG)
@click.option("--m", type=click.IntRange(min=1), required=True, help="Rows of the output (tokens).")
@click.option("--k", type=click.IntRange(min=1), required=True, help="Inner dimension.")
@click.option("--n", type=click.IntRange(min=1), required=True, help="Columns of the output.")
@click.option("--dtype", type=click.Choice(("fp16", "bf16", "fp32", "tf32", "int8", "fp8")), default="bf16",
              show_default=True)
@_gpu_options
@click.option("--json", "as_json", is_flag=True, help="Print the floor as JSON.")
def gemm(m, k, n, dtype, gpu, calibrated, as_json) -> None:
    """Roofline floor of one GEMM: flops, bytes, intensity, ridge point, bound, floor time."""
    from qbench.model.commands import show_floors

    with _usage_errors():
        show_floors("gemm", {"m": m, "k": k, "n": n, "dtype": dtype}, gpu or "h200", calibrated, as_json)


@command.command(epilog=EPILOG)
@click.argument("workload", type=click.Choice(("switchback", "fragmented", "moe")))
@click.argument("params", nargs=-1, metavar="KEY=VALUE...")
@_gpu_options
@click.option("--json", "as_json", is_flag=True, help="Print the floors as JSON.")
def floors(workload, params, gpu, calibrated, as_json) -> None:
    """Floors of a qbench workload, with the parameter names of its records."""
    from qbench.model.commands import parse_params, show_floors

    with _usage_errors():
        show_floors(workload, parse_params(params), gpu or "h200", calibrated, as_json)


@command.command(epilog=EPILOG)
@click.option("--device", type=click.Choice(("auto", "cuda", "cpu")), default="auto", show_default=True)
@click.option("--file", "file", type=click.Path(dir_okay=False), help="Where to save the calibrated device.")
@out_options
def calibrate(device, file, out, append, force, as_json) -> None:
    """Measure this GPU's matmul rates per dtype, copy bandwidth and launch time; save them for --calibrated."""
    from qbench.model.commands import run_calibrate

    with _usage_errors():
        run_calibrate(device, file, out, append, force, as_json)
