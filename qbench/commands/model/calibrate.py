"""`qbench model calibrate`: this device's measured ceilings, saved for --calibrated."""

from __future__ import annotations

import click

from qbench.commands.model.common import EPILOG, usage_errors
from qbench.options import device_option, out_options


def _table(records):
    from qbench import report

    return report.records_table(records, ["op", "kernel", "dtype", "n"], ["time_ms", "tflops", "tops", "gbps"],
                                title="Calibration")


@click.command(epilog=EPILOG)
@device_option
@click.option("--file", "file", type=click.Path(dir_okay=False), help="Where to save the calibrated device.")
@out_options
def calibrate(device, file, out, append, force, as_json) -> None:
    """Measure this GPU's matmul rates per dtype, copy bandwidth and launch time; save them for --calibrated."""
    from qbench import report
    from qbench.benches.model import calibrate as bench
    from qbench.paths import check_writable_file
    from qbench.runner import run_and_store

    with usage_errors():
        cfg, base, default_file = bench.setup(device)
    file = check_writable_file(file or default_file, "calibration file")  # before minutes of measuring
    records = run_and_store("model", cfg, bench.measure(cfg), total=None, out=out, append=append, force=force,
                            as_json=as_json, table=_table, notice=report.cpu_notice(cfg.device))
    path = bench.save(bench.calibrated_hardware(records, base), records, file)
    report.notice(f"calibrated device saved to {path} (use --calibrated {path})", style="green")


COMMANDS = (calibrate,)
