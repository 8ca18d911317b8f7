"""`qbench model gemm` and `qbench model floors`: roofline floors of one GEMM or of a qbench workload."""

from __future__ import annotations

import json

import click

from qbench.commands.model.common import EPILOG, gpu_options, usage_errors
from qbench.commands.model.values import parse_params
from qbench.dtypes import DTYPE_BYTES
from qbench.options import dtype_option

MODEL_DTYPES = tuple(DTYPE_BYTES)  # the activation dtypes plus tf32, int8 and fp8


def show_floors(workload: str, params: dict, gpu: str | None, calibrated: str | None, as_json: bool) -> None:
    from qbench import report
    from qbench.benches.model import against

    with usage_errors():
        hw = against.choose_hardware(gpu or "h200", calibrated)
        result = against.floors_of(workload, params, hw)
    if as_json:
        click.echo(json.dumps({k: f.to_dict() for k, f in result.items()}, indent=2))
        return
    report.stdout_console().print(against.floors_table(workload, result, hw))


@click.command(epilog=EPILOG)
@click.option("--m", type=click.IntRange(min=1), required=True, help="Rows of the output (tokens).")
@click.option("--k", type=click.IntRange(min=1), required=True, help="Inner dimension.")
@click.option("--n", type=click.IntRange(min=1), required=True, help="Columns of the output.")
@dtype_option("bf16", MODEL_DTYPES, help="Data type of the operands.")
@gpu_options
@click.option("--json", "as_json", is_flag=True, help="Print the floor as JSON.")
def gemm(m, k, n, dtype, gpu, calibrated, as_json) -> None:
    """Roofline floor of one GEMM: flops, bytes, intensity, ridge point, bound, floor time."""
    show_floors("gemm", {"m": m, "k": k, "n": n, "dtype": dtype}, gpu, calibrated, as_json)


@click.command(epilog=EPILOG)
@click.argument("workload", type=click.Choice(("switchback", "fragmented", "moe")))
@click.argument("params", nargs=-1, metavar="KEY=VALUE...")
@gpu_options
@click.option("--json", "as_json", is_flag=True, help="Print the floors as JSON.")
def floors(workload, params, gpu, calibrated, as_json) -> None:
    """Floors of a qbench workload, with the parameter names of its records."""
    with usage_errors():
        parsed = parse_params(params)
    show_floors(workload, parsed, gpu, calibrated, as_json)


COMMANDS = (gemm, floors)
