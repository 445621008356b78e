"""The commands that act on actions: ``actions list``, ``actions show``, ``audit``,
``resolve``, ``sweep``, ``purge`` and ``reopen``."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import click
import psycopg

from replaysafe_pg.cli import render
from replaysafe_pg.cli.plumbing import (
    EXIT_ATTENTION,
    TENANT_ALL,
    TENANT_ONE,
    CliError,
    Command,
    Duration,
    Group,
    JsonValue,
    NotFound,
    emit,
    global_options,
    operator_duty,
    query_rows,
    state_of,
    with_conn,
)
from replaysafe_pg.errors import AccessDenied
from replaysafe_pg.ledger import Ledger
from replaysafe_pg.models import ActionState
from replaysafe_pg.threads import Threads


@click.group(cls=Group)
@global_options
def actions() -> None:
    """List and inspect actions."""


_LIST_COLUMNS = ["tenant_id", "action_key", "operation", "state", "attempt", "thread_id",
                 "created_at", "updated_at"]


@actions.command("list")
@global_options
@TENANT_ALL
@click.option("--state", "states", multiple=True,
              type=click.Choice([s.value for s in ActionState]), help="Only these states (repeatable).")
@click.option("--operation", default=None, help="Only this operation.")
@click.option("--thread", "thread_id", default=None, help="Only actions of this thread.")
@click.option("--older-than", type=Duration(), default=None,
              help="Only actions created longer ago than this (7d, 2h, 30m).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.pass_context
@with_conn
def actions_list(ctx: click.Context, conn: psycopg.Connection[Any], tenant_id: str | None,
                 states: tuple[str, ...], operation: str | None, thread_id: str | None,
                 older_than: timedelta | None, limit: int) -> None:
    """List actions, newest first."""
    rows = query_rows(conn, "list_actions", {
        "tenant_id": tenant_id, "states": list(states), "operation": operation,
        "thread_id": thread_id, "older_than": older_than, "limit": limit})
    emit(ctx, lambda: render.table(rows, _LIST_COLUMNS) if rows else "no actions", rows)


@actions.command("show")
@global_options
@click.argument("key")
@TENANT_ONE
@click.pass_context
@with_conn
def actions_show(ctx: click.Context, conn: psycopg.Connection[Any], key: str,
                 tenant_id: str) -> None:
    """Show one action and all its attempts."""
    ledger = Ledger(conn, tenant_id=tenant_id)
    action = ledger.get(key)
    if action is None:
        raise NotFound(f"no action {key} for tenant {tenant_id}")
    attempts = ledger.attempts(key)

    def human() -> str:
        pairs = [(f.replace("_", " "), getattr(action, f)) for f in action.__slots__]
        text = render.fields(pairs)
        rows = [dataclasses.asdict(a) for a in attempts]
        cols = ["attempt", "worker_id", "claimed_at", "ended_at", "outcome", "superseded", "error"]
        return text + "\n\nattempts:\n" + render.table(rows, cols)

    emit(ctx, human, {"action": action, "attempts": attempts})


# --- audit ----------------------------------------------------------------------------------

@click.command(cls=Command)
@global_options
@TENANT_ALL
@click.pass_context
@with_conn
def audit(ctx: click.Context, conn: psycopg.Connection[Any], tenant_id: str | None) -> None:
    """Actions that need attention; exit status 1 when there are any (for cron)."""
    unresolved = query_rows(conn, "unresolved_actions", {"tenant_id": tenant_id})
    multi = query_rows(conn, "multi_effect_actions", {"tenant_id": tenant_id})

    def human() -> str:
        parts = []
        if unresolved:
            parts.append("unresolved actions (unknown, or running with an expired lease):\n"
                         + render.table(unresolved, ["tenant_id", "action_key", "operation",
                                                     "state", "age", "lease_expires_at"]))
        if multi:
            parts.append("actions whose effect happened more than once:\n"
                         + render.table(multi, ["tenant_id", "action_key", "operation",
                                                "successful_attempts"]))
        return "\n\n".join(parts) if parts else "nothing needs attention"

    emit(ctx, human, {"unresolved_actions": unresolved, "multi_effect_actions": multi})
    if unresolved or multi:
        ctx.exit(EXIT_ATTENTION)


# --- resolve, sweep, purge ------------------------------------------------------------------

@click.command(cls=Command)
@global_options
@click.argument("key")
@TENANT_ONE
@click.option("--state", required=True, type=click.Choice(["succeeded", "failed", "retryable"]),
              help="What the action turned out to be.")
@click.option("--result", type=JsonValue(), default=None, help="Result to record (JSON).")
@click.option("--error", type=JsonValue(), default=None, help="Error to record (JSON).")
@click.option("--provider-reference", default=None, help="The provider's id of the effect.")
@click.option("--note", default=None, help="Why: kept on the action for the audit trail.")
@click.pass_context
@with_conn
def resolve(ctx: click.Context, conn: psycopg.Connection[Any], key: str, tenant_id: str,
            state: str, result: Any, error: Any, provider_reference: str | None,
            note: str | None) -> None:
    """Reconcile an unknown action to succeeded, failed or retryable."""
    ledger = Ledger(conn, tenant_id=tenant_id)
    if ledger.get(key) is None:
        raise NotFound(f"no action {key} for tenant {tenant_id}")
    new = ledger.resolve(key, state, result=result, error=error,
                         provider_reference=provider_reference, note=note)
    emit(ctx, f"resolved {render.escape(key)} (tenant {render.escape(tenant_id)}): "
              f"unknown -> {new.value}",
         {"tenant_id": tenant_id, "action_key": key, "state": new})


@click.command(cls=Command)
@global_options
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True,
              help="At most this many expired leases.")
@click.pass_context
@with_conn
def sweep(ctx: click.Context, conn: psycopg.Connection[Any], limit: int) -> None:
    """Turn expired running leases into unknown (or retryable under on_expired='reclaim')."""
    count = Ledger(conn).sweep(limit=limit)
    emit(ctx, f"swept {count} expired lease(s)", {"swept": count})


@click.command(cls=Command)
@global_options
@click.option("--older-than", type=Duration(), required=True,
              help="Delete terminal actions finished longer ago than this (7d, 12h); with "
                   "--threads, threads not written for this long.")
@click.option("--threads", "threads", is_flag=True,
              help="Purge threads and LangGraph threads instead of actions (a purged thread "
                   "keeps its version counter).")
@click.option("--batch-size", type=click.IntRange(min=1), default=10000, show_default=True,
              help="Actions (or threads) deleted per transaction.")
@click.option("--yes", "-y", "yes", is_flag=True,
              help="Do not ask for confirmation (needed when stdin is not a terminal).")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@click.pass_context
@with_conn
def purge(ctx: click.Context, conn: psycopg.Connection[Any], older_than: timedelta,
          threads: bool, batch_size: int, yes: bool, dry_run: bool) -> None:
    """Delete old succeeded/failed actions (or, with --threads, old threads) in batches
    (safe while workers run).

    Shows how many would go and asks before deleting; --yes skips the question, which a run
    without a terminal (cron, CI) must pass."""
    # One cutoff for the whole run: rows finishing meanwhile do not keep the loop going.
    now: datetime = query_rows(conn, "database_now")[0]["now"]
    cutoff = now - older_than
    params = {"now": now, "older_than": older_than}
    if threads:
        expected = query_rows(conn, "purge_thread_candidates", params)[0]["count"]
        what = (f"{expected} thread(s) not written since {cutoff:%Y-%m-%d %H:%M:%S%z} "
                "(and the LangGraph threads not written since then, not counted here)")
        noun = "thread(s)"
    else:
        expected = query_rows(conn, "purge_candidates", params)[0]["count"]
        what = f"{expected} succeeded/failed action(s) finished before {cutoff:%Y-%m-%d %H:%M:%S%z}"
        noun = "action(s)"
    if dry_run:
        emit(ctx, f"would purge {what} (dry run, nothing deleted)",
             {"dry_run": True, "would_purge": expected, "cutoff": cutoff})
        return
    if (expected or threads) and not yes:
        if not sys.stdin.isatty():
            raise CliError(f"purge would delete {what}: pass --yes to confirm "
                           "(--dry-run only counts)")
        if not click.confirm(f"delete {what}?", err=True):
            raise CliError("nothing purged (not confirmed)")
    batch: Callable[[], int]
    if threads:
        store = Threads(conn)
        batch = lambda: store.purge(older_than, limit=batch_size, now=now)  # noqa: E731
    else:
        ledger = Ledger(conn)
        batch = lambda: ledger.purge(older_than, limit=batch_size, now=now)  # noqa: E731
    total = 0
    batches = 0
    with click.progressbar(length=max(expected, 1), label="purging", file=sys.stderr,
                           show_pos=True, hidden=state_of(ctx).json) as bar:
        while True:
            # Each batch is its own transaction (autocommit): locks are short, and rows a
            # worker holds are skipped, not waited for.
            deleted = batch()
            total += deleted
            batches += deleted > 0
            bar.update(deleted)
            # Across tenants a batch is shared out round-robin and may be short while more
            # is due: only an empty batch ends the run.
            if deleted == 0:
                break
    ended = "not written since" if threads else "finished before"
    emit(ctx, f"purged {total} {noun} {ended} {cutoff:%Y-%m-%d %H:%M:%S%z} in {batches} batch(es)",
         {"purged": total, "batches": batches, "cutoff": cutoff})


# --- reopen ---------------------------------------------------------------------------------

@click.command(cls=Command)
@global_options
@click.argument("key")
@TENANT_ONE
@click.option("--note", required=True,
              help="Why the action may run again: kept on the action (see `actions show`).")
@click.pass_context
@with_conn
def reopen(ctx: click.Context, conn: psycopg.Connection[Any], key: str, tenant_id: str,
           note: str) -> None:
    """Let a failed action run again: it becomes retryable (replaysafe_operator's duty)."""
    if not note.strip():
        raise CliError("--note must say why the action may run again (it is kept on the action)")
    ledger = Ledger(conn, tenant_id=tenant_id)
    if ledger.get(key) is None:
        raise NotFound(f"no action {key} for tenant {tenant_id}")
    try:
        new = ledger.reopen(key, note=note)
    except AccessDenied as exc:
        raise operator_duty(conn, "reopening", exc) from None
    emit(ctx, f"reopened {render.escape(key)} (tenant {render.escape(tenant_id)}): "
              f"failed -> {new.value}",
         {"tenant_id": tenant_id, "action_key": key, "state": new, "note": note})
