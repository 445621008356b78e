"""The ``replaysafe-pg`` command."""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """replaysafe_pg: replay-safe side effects for AI agents, enforced in Postgres."""


@main.command()
def demo() -> None:
    """The crash-and-resume demo (not yet: lands with the CLI issue)."""
    click.echo("replaysafe-pg demo: not yet available; the tests run with "
               "`pip install -e '.[test]' && python -m pytest`.")
