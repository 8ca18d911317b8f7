"""`qbench compare` (being built)."""

import click


@click.command()
def command() -> None:
    """Compare result directories."""
