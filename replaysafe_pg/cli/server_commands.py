"""``replaysafe-pg server start | url | status | stop``: a long-lived embedded Postgres for
the user's own code (:mod:`replaysafe_pg.embedded`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import click

from replaysafe_pg import embedded
from replaysafe_pg.cli import render
from replaysafe_pg.cli.db import first_line
from replaysafe_pg.cli.plumbing import EXIT_ATTENTION, CliError, Group, emit, global_options, state_of


@click.group(cls=Group)
@global_options
def server() -> None:
    """Keep an embedded Postgres running for your own code.

    `export REPLAYSAFE_DSN=$(replaysafe-pg server start)` starts it (migrated) and gives its
    DSN to your code and to every later replaysafe-pg command. Data in --pgdata (default: the
    embedded server's per-user directory). --dsn and REPLAYSAFE_DSN are ignored here."""


def _server_pgdata(ctx: click.Context) -> Path:
    state = state_of(ctx)
    if state.ephemeral:
        raise CliError("--ephemeral makes no sense for a server that outlives the command: "
                       "use --pgdata DIR")
    return (state.pgdata or embedded.default_pgdata()).expanduser().resolve()


def _server_data(status: embedded.ServerStatus) -> dict[str, Any]:
    return {"running": status.running, "pid": status.pid, "pgdata": str(status.pgdata),
            "dsn": status.dsn, "started_at": status.started_at}


@server.command("start")
@global_options
@click.pass_context
def server_start(ctx: click.Context) -> None:
    """Start the server (detached, it keeps running) and migrate it; print its DSN.

    Only the DSN goes to stdout, so `export REPLAYSAFE_DSN=$(replaysafe-pg server start)`
    works. A server already running is left as it is: its DSN is printed again."""
    pgdata = _server_pgdata(ctx)
    try:
        status = embedded.serve(pgdata, notice=lambda text: click.echo(text, err=True))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        raise CliError(f"could not start the embedded Postgres in {pgdata}: "
                       f"{first_line(exc)} (its log: {pgdata / 'log'})") from None
    emit(ctx, status.dsn or "", _server_data(status))


@server.command("url")
@global_options
@click.pass_context
def server_url(ctx: click.Context) -> None:
    """Print the DSN of the running server (exit status 2 when it is not running)."""
    status = embedded.server_status(_server_pgdata(ctx))
    if not status.running:
        raise CliError(f"no server running on {status.pgdata}: start it with "
                       "`replaysafe-pg server start`")
    emit(ctx, status.dsn or "", _server_data(status))


@server.command("status")
@global_options
@click.pass_context
def server_status(ctx: click.Context) -> None:
    """Say whether the server runs, with its pid, data directory and DSN.

    Exit status 0 when it runs, 1 when it does not."""
    status = embedded.server_status(_server_pgdata(ctx))

    def human() -> str:
        if not status.running:
            stale = ("" if status.stale_pid is None else
                     f" (its state file named pid {status.stale_pid}, which is gone: removed)")
            return f"not running: {status.pgdata}{stale}"
        return render.fields([("status", "running"), ("pid", status.pid),
                              ("data dir", str(status.pgdata)), ("dsn", status.dsn),
                              ("started at", status.started_at)])

    emit(ctx, human, _server_data(status) | {"stale_pid": status.stale_pid})
    if not status.running:
        ctx.exit(EXIT_ATTENTION)


@server.command("stop")
@global_options
@click.pass_context
def server_stop(ctx: click.Context) -> None:
    """Stop the server (fast shutdown: open sessions end, committed data stays).

    Stopping a server that is not running is not an error."""
    status = embedded.unserve(_server_pgdata(ctx))
    human = (f"stopped the server of {status.pgdata} (pid {status.pid})" if status.running
             else f"not running: {status.pgdata}")
    emit(ctx, human, {"stopped": status.running, "pid": status.pid,
                      "pgdata": str(status.pgdata)})
