"""`qbench plot` (not implemented yet)."""

import click


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def command() -> None:
    """Not implemented yet."""
    exc = click.ClickException("'qbench plot' is not implemented yet")
    exc.exit_code = 2
    raise exc
