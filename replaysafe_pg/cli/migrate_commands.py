"""``replaysafe-pg migrate`` (``--sql``, ``--revision``, ``--citus``) and ``migrate current``."""

from __future__ import annotations

import io
from typing import Any

import click
import psycopg

from replaysafe_pg import schema
from replaysafe_pg.cli.plumbing import (
    CliError,
    Group,
    emit,
    global_options,
    installed_revision,
    state_of,
    with_conn,
)


@click.group(cls=Group, invoke_without_command=True)
@global_options
@click.option("--sql", "print_sql", is_flag=True,
              help="Print the SQL of the upgrade instead of running it (needs no database).")
@click.option("--revision", default="head", show_default=True,
              help="Target revision. An older one than installed downgrades, with --yes only.")
@click.option("--yes", is_flag=True,
              help="Confirm a downgrade (it drops what the newer revisions added, data included).")
@click.option("--citus", is_flag=True,
              help="Then distribute the schema by tenant on a Citus coordinator (docs/scale-out.md); "
              "with --sql, print that script after the upgrade's.")
@click.option("--shard-count", type=click.IntRange(1, 64000), default=None, metavar="N",
              help="With --citus: shards of the tables distributed now (default: citus.shard_count).")
@click.pass_context
def migrate(ctx: click.Context, print_sql: bool, revision: str, yes: bool, citus: bool,
            shard_count: int | None) -> None:
    """Upgrade the replaysafe schema (``migrate current`` shows the installed revision)."""
    if ctx.invoked_subcommand is not None:
        return
    if shard_count is not None and not citus:
        raise CliError("--shard-count goes with --citus")
    if print_sql:
        click.echo(offline_sql(revision), nl=False)
        if citus:
            click.echo(citus_offline_sql(), nl=False)
        return
    state = state_of(ctx)
    with state.db.connection() as conn:  # a clear error for a bad DSN before alembic wraps it
        before = installed_revision(conn)
    dsn = state.db.dsn()
    undone = schema.undone_by(before, revision)
    if undone and citus:
        raise CliError("--citus distributes the schema at its newest revision: it does not go "
                       "with a downgrade")
    if undone and not yes:
        raise CliError(f"--revision {revision} would DOWNGRADE from {before}: {_undoing(undone)}; "
                       "run again with --yes to downgrade")
    if undone:
        schema.downgrade(dsn, revision)
    else:
        schema.migrate(dsn, revision, citus=citus, shard_count=shard_count)
    with state.db.connection() as conn:
        after = installed_revision(conn)
    if before == after:
        human = f"already at {after}"
    else:
        verb = "downgraded" if undone else "migrated"
        human = f"{verb} from {before or 'nothing'} to {after or 'base (nothing)'}"
    if citus:
        human += "; distributed by tenant on Citus (docs/scale-out.md)"
    emit(ctx, human, {"before": before, "after": after, "head": schema.head_revision(),
                      "citus": citus})


def _undoing(undone: list[schema.Revision]) -> str:
    """What a downgrade undoes and which tables (with their rows) it drops."""
    names = ", ".join(r.name for r in undone)
    dropped = [t for r in undone for t in r.drops]
    if not dropped:
        return f"undoing {names} (no table is dropped)"
    return f"undoing {names} and DROPPING {', '.join(dropped)} with every row in them"


def offline_sql(revision: str = "head") -> str:
    from alembic import command

    # Offline mode needs a dialect, not a server: the URL is never connected to.
    cfg = schema.alembic_config("postgresql://offline")
    buffer = io.StringIO()
    cfg.output_buffer = buffer
    command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


def citus_offline_sql() -> str:
    """citus.sql as its own transaction, for ``migrate --citus --sql``: run it after the
    upgrade, on the coordinator, as the schema owner."""
    return ("\n-- replaysafe on Citus (docs/scale-out.md): after the upgrade above, on the "
            "coordinator, as the schema owner\nBEGIN;\n\n" + schema.citus_sql().rstrip("\n")
            + "\n\nCOMMIT;\n")


@migrate.command("current")
@global_options
@click.pass_context
@with_conn
def migrate_current(ctx: click.Context, conn: psycopg.Connection[Any]) -> None:
    """Show the installed schema revision and the newest one."""
    current = installed_revision(conn)
    head = schema.head_revision()
    if current is None:
        human = f"not installed (head is {head}): run `replaysafe-pg migrate`"
    elif current == head:
        human = f"{current} (head)"
    else:
        human = f"{current} (head is {head}): run `replaysafe-pg migrate`"
    emit(ctx, human, {"current": current, "head": head, "up_to_date": current == head})
