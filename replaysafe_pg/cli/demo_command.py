"""``replaysafe-pg demo``: the command; the demo itself is :mod:`replaysafe_pg.cli.demo`, loaded
when it runs."""

from __future__ import annotations

from datetime import timedelta

import click

from replaysafe_pg import schema
from replaysafe_pg.cli import render
from replaysafe_pg.cli.plumbing import Command, global_options, state_of
from replaysafe_pg.errors import SchemaNotInstalled


@click.command(cls=Command)
@global_options
@click.option("--lease", type=click.FloatRange(min=0.2), default=1.5, show_default=True,
              help="Lease of the crashing worker's claim, in seconds.")
@click.pass_context
def demo(ctx: click.Context, lease: float) -> None:
    """The double refund, with and without the ledger (about 10 seconds)."""
    from replaysafe_pg.cli.demo import run_demo

    state = state_of(ctx)
    if schema.current_revision(state.db.dsn()) != schema.head_revision():
        raise SchemaNotInstalled("the replaysafe schema is missing or outdated in this database: "
                                 "run `replaysafe-pg migrate` first")
    report = run_demo(state.db.dsn(), lease=timedelta(seconds=lease),
                      say=(lambda _text: None) if state.json else click.echo)
    if state.json:
        click.echo(render.dumps(report))
