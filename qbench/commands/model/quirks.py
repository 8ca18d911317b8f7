"""`qbench model quirks`: DeepFlow's known quirks, each with its effect measured by the model."""

from __future__ import annotations

import json
from pathlib import Path

import click

from qbench.commands.model.common import EPILOG, usage_errors
from qbench.commands.model.values import parse_sets


@click.command(epilog=EPILOG)
@click.option("--config", "config_path", default="deepflow", show_default=True, type=click.Path(dir_okay=False),
              help="DeepFlow YAML: a path, or a shipped config by name.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config value.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def quirks(config_path, overrides, as_json) -> None:
    """List each quirk of DeepFlow's LSTM model that `--deepflow corrected` fixes, with its effect: the
    model evaluated exact and with that one quirk fixed, on a strategy where the quirk shows."""
    from qbench import report
    from qbench.benches.model import lstm
    from qbench.benches.model import quirks as bench
    from qbench.model.deepflow import effects

    with usage_errors():
        cfg = lstm.configs(lstm.LstmRun(config_path, parse_sets(overrides)))[0]
        found = effects.effects(cfg)
    if as_json:
        click.echo(json.dumps(bench.rows(found), indent=2))
        return
    report.stdout_console().print(bench.table(found, Path(config_path).name))


COMMANDS = (quirks,)
