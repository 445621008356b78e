"""``replaysafe-pg threads show`` and ``threads history``: versioned thread state."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import psycopg

from replaysafe_pg.cli import render
from replaysafe_pg.cli.plumbing import TENANT_ONE, CliError, Group, NotFound, emit, global_options, with_conn
from replaysafe_pg.errors import AccessDenied
from replaysafe_pg.threads import Threads


@click.group(cls=Group)
@global_options
def threads() -> None:
    """Inspect versioned thread state."""


_USER = click.option("--user", "user_id", default=None,
                     help="The owning user (required for threads created with a user).")


def _thread_owner_hint(thread_id: str, user_id: str | None, exc: AccessDenied) -> Exception:
    """The thread functions refuse a thread that belongs to another user (or to a user, when
    none is given) with the same error as a tenant the role may not act for."""
    if "user may not use that thread" not in str(exc):
        return exc
    if user_id is None:
        return CliError(f"AccessDenied: thread {thread_id} belongs to a user: pass --user USER "
                        "(the user it was created with)")
    return CliError(f"AccessDenied: thread {thread_id} belongs to another user than {user_id}")


@threads.command("show")
@global_options
@click.argument("thread_id")
@TENANT_ONE
@_USER
@click.pass_context
@with_conn
def threads_show(ctx: click.Context, conn: psycopg.Connection[Any], thread_id: str,
                 tenant_id: str, user_id: str | None) -> None:
    """Show the latest state of a thread."""
    with Threads(conn, tenant_id=tenant_id, user_id=user_id) as th:
        try:
            row = dataclasses.asdict(th.read(thread_id))
        except AccessDenied as exc:
            raise _thread_owner_hint(thread_id, user_id, exc) from None
    if row["version"] == 0:
        raise NotFound(f"no thread {thread_id} for tenant {tenant_id}")
    data = {"tenant_id": tenant_id, "thread_id": thread_id, **row,
            "deleted": row["state"] is None}

    def human() -> str:
        head = render.fields([("thread", thread_id), ("tenant", tenant_id),
                              ("version", row["version"]), ("updated at", row["updated_at"])])
        if row["state"] is None:
            return head + f"\n\ndeleted (tombstone at version {row['version']})"
        return head + "\n\n" + render.dumps(row["state"])

    emit(ctx, human, data)


@threads.command("history")
@global_options
@click.argument("thread_id")
@TENANT_ONE
@_USER
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_context
@with_conn
def threads_history(ctx: click.Context, conn: psycopg.Connection[Any], thread_id: str,
                    tenant_id: str, user_id: str | None, limit: int) -> None:
    """List the kept versions of a thread, newest first."""
    with Threads(conn, tenant_id=tenant_id, user_id=user_id) as th:
        try:
            rows = [dataclasses.asdict(v) for v in th.history(thread_id, limit=limit)]
        except AccessDenied as exc:
            raise _thread_owner_hint(thread_id, user_id, exc) from None
    if not rows:
        raise NotFound(f"no thread {thread_id} for tenant {tenant_id}")
    emit(ctx, lambda: render.table(rows, ["version", "created_at", "state"]), rows)
