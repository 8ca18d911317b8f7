"""What each `qbench model` subcommand does after click has parsed it: build the config, make one call
into the model, store and print. Errors are ValueErrors (ConfigError, QbenchUsageError) naming the
problem; the command turns them into one line and exit 2.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from qbench import report
from qbench.errors import QbenchUsageError


def parse_assignment(text: str, option: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise QbenchUsageError(f"{option} {text!r}: write SECTION.KEY=VALUE, e.g. model_param.batch_size=64")
    return key.strip(), value.strip()


def parse_params(items: tuple[str, ...]) -> dict:
    from qbench.model.deepflow_config import parse_scalar

    return {k: parse_scalar(v) for k, v in (parse_assignment(i, "parameter") for i in items)}


def build_run(config_path, debug, overrides, sweep):
    from qbench.model.deepflow_config import parse_scalar
    from qbench.model.lstm_run import LstmRun

    sets = tuple((k, parse_scalar(v)) for k, v in (parse_assignment(o, "--set") for o in overrides))
    key, values = None, ()
    if sweep:
        key, text = parse_assignment(sweep, "--sweep")
        values = tuple(parse_scalar(v.strip()) for v in text.split(",") if v.strip())
        if not values:
            raise QbenchUsageError(f"--sweep {sweep!r} gives no values")
    return LstmRun(config_path, sets, key, values, debug)


def run_lstm(config_path, debug, overrides, sweep, out, append, force, as_json) -> None:
    from qbench.commands.common import run_and_store
    from qbench.model import deepflow, lstm_run

    run = build_run(config_path, debug, overrides, sweep)
    results = [lstm_run.evaluate(cfg, debug) for cfg in lstm_run.configs(run)]
    if len(results) == 1 and not as_json:
        click.echo("\n".join(deepflow.report_lines(results[0])))
    records = [lstm_run.record(r, config_path) for r in results]
    shares = {rec["case"]: r.components.shares for rec, r in zip(records, results)}
    run_and_store("model", run, iter(records), total=len(records), out=out, append=append, force=force,
                  as_json=as_json, table=lambda recs: lstm_run.summary(recs, shares))


def _hardware(gpu, calibrated):
    from qbench.model.against import choose_hardware

    return choose_hardware(gpu, calibrated)


def show_floors(workload: str, params: dict, gpu, calibrated, as_json: bool) -> None:
    from rich.table import Table

    from qbench.model import floors

    hw = _hardware(gpu, calibrated)
    try:
        if workload == "gemm":
            result = {"gemm": floors.gemm(params["m"], params["k"], params["n"], params["dtype"], hw)}
        else:
            result = floors.for_record({"bench": workload, "params": params, "metrics": {}}, hw)
    except KeyError as exc:
        raise QbenchUsageError(f"{workload}: missing parameter {exc.args[0]}=VALUE") from None
    if as_json:
        click.echo(json.dumps({k: f.to_dict() for k, f in result.items()}, indent=2))
        return
    table = Table(title=f"{workload} floors on {hw.name}", header_style="bold")
    widest = max(len(name) for name in result)
    for col in ("metric", "GFLOP", "MB moved", "flop/B", "ridge", "bound", "floor ms"):
        table.add_column(col, justify="left" if col in ("metric", "bound") else "right", no_wrap=True,
                         min_width=widest if col == "metric" else None)
    for name, f in result.items():
        table.add_row(name, f"{f.flops / 1e9:.3f}", f"{f.bytes_moved / 1e6:.3f}", report.format_value(f.intensity),
                      f"{f.ridge:.0f}", f.bound, f"{f.floor_ms:.4f}")
    report.stdout_console().print(table)


def show_against(run, gpu, calibrated, as_json: bool) -> None:
    from qbench.model import against

    hw, rows = against.against(run, gpu, calibrated)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], indent=2, default=str))
        return
    report.stdout_console().print(against.table(rows, hw))
    high = [r for r in rows if r.fraction > 1]
    if high:
        report.notice(f"{len(high)} measurements beat their floor: a flop/byte count is wrong or data sat in cache")


def run_calibrate(device, file, out, append, force, as_json) -> None:
    from qbench.commands.common import run_and_store
    from qbench.model import calibrate
    from qbench.timing import resolve_device

    device = resolve_device(None if device == "auto" else device)
    gpu_name = None
    if device == "cuda":
        import torch

        gpu_name = torch.cuda.get_device_name()
    else:
        report.notice(report.CPU_NOTICE)
    base = calibrate.device_hardware(device, gpu_name)
    cfg = calibrate.default_config(device)
    records = run_and_store("model", cfg, calibrate.measure(cfg), total=None, out=out, append=append,
                            force=force, as_json=as_json, table=_calibration_table)
    hw = calibrate.calibrated_hardware(records, base)
    slug = (gpu_name or "cpu").lower().replace("nvidia", "").strip().replace(" ", "-")
    path = calibrate.save(hw, records, file or f"results/model-calibration-{slug}.yaml")
    report.notice(f"calibrated device saved to {path} (use --calibrated {path})", style="green")


def _calibration_table(records):
    return report.records_table(records, ["op", "dtype", "n"], ["time_ms", "tflops", "tops", "gbps"],
                                  title="Calibration")
