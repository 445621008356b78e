"""``replaysafe-pg reconcile``: one batch over the tenants (:class:`ReconcileBatch`,
:func:`reconcile_batch`), or with ``--loop`` a batch every ``--interval`` until SIGTERM
(:func:`reconcile_loop`, :class:`Stop`)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import click
import psycopg

from replaysafe_pg.cli import render
from replaysafe_pg.cli.db import first_line
from replaysafe_pg.cli.lookups import load_lookups
from replaysafe_pg.cli.plumbing import (
    EXIT_ATTENTION,
    EXIT_ERROR,
    TENANT_ALL,
    CliError,
    Command,
    Duration,
    emit,
    global_options,
    operator_duty,
    query_rows,
    state_of,
    with_conn,
)
from replaysafe_pg.errors import AccessDenied, ReplaysafeError
from replaysafe_pg.ledger import Ledger
from replaysafe_pg.reconcile import GONE_NOTE, Lookup, ReconcileOutcome, Reconciliation


def _lookups_option(_ctx: click.Context, _param: click.Parameter, value: str) -> dict[str, Lookup]:
    return load_lookups(value)


# A batch this long (actions due) gets a progress bar on stderr.
PROGRESS_MIN = 20
_SETTLED = {ReconcileOutcome.SUCCEEDED, ReconcileOutcome.FAILED, ReconcileOutcome.RETRYABLE,
            ReconcileOutcome.ALREADY_RESOLVED}


@dataclass
class ReconcileBatch:
    """What one pass of ``reconcile`` did, over every tenant it looked at. ``looked_up``: the
    operations it had a lookup for (one of those skipped, its row held by another
    transaction, stays unknown). ``errors``: the tenants whose pass stopped on an error, and
    what it was (the others went on)."""

    tenants: list[str]
    results: list[Reconciliation]
    dry_run: bool
    looked_up: frozenset[str] = frozenset()
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 every action with a lookup settled; 1 some stay unknown; 2 an error (a lookup
        failed, a row could not be read, a tenant's pass stopped)."""
        outcomes = {r.outcome for r in self.results}
        if ReconcileOutcome.ERROR in outcomes or self.errors:
            return EXIT_ERROR
        if ReconcileOutcome.LEFT_UNKNOWN in outcomes or any(
                r.outcome is ReconcileOutcome.SKIPPED and r.operation in self.looked_up
                for r in self.results):
            return EXIT_ATTENTION
        return 0

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
        return counts

    def data(self) -> dict[str, Any]:
        out = {"dry_run": self.dry_run, "tenants": self.tenants, "summary": self.summary(),
               "results": self.results}
        if self.errors:  # only when some tenant's pass stopped
            out["errors"] = [{"tenant_id": t, "error": e} for t, e in self.errors.items()]
        return out

    def human(self, at: datetime | None = None) -> str:
        """The table, the tenants in error, and a summary line (``at``: the batch's time, to
        start it with)."""
        stamp = "" if at is None else f"{at:%Y-%m-%d %H:%M:%S%z}: "
        if not self.results and not self.errors:
            return f"{stamp}no unknown actions to reconcile"
        lines = []
        if self.results:
            rows = [render.jsonable(r) | {"outcome": r.outcome.value, "note": _shown_note(r)}
                    for r in self.results]
            lines.append(render.table(rows, ["tenant_id", "action_key", "operation", "attempt",
                                             "outcome", "provider_reference", "note"],
                                      cut_at={"note": 200}))
        lines += [f"tenant {render.escape(t)}: stopped on an error, its actions not reached stay "
                  f"unknown: {render.escape(e)}" for t, e in self.errors.items()]
        counts = ", ".join(f"{k} {v}" for k, v in self.summary().items()) or "none read"
        head = "dry run, nothing written: " if self.dry_run else ""
        tail = f"; {len(self.errors)} tenant(s) stopped on an error" if self.errors else ""
        lines.append(f"{stamp}{head}{len(self.results)} unknown action(s) in "
                     f"{len(self.tenants)} tenant(s): {counts}{tail}")
        return "\n".join(lines)


def _shown_note(r: Reconciliation) -> str | None:
    if r.outcome is ReconcileOutcome.ERROR:
        return r.error
    if r.outcome is ReconcileOutcome.ALREADY_RESOLVED and r.note != GONE_NOTE:
        return "settled by someone else since the lookup: nothing written"
    return r.note


def shares(due: Sequence[int], limit: int) -> list[int]:
    """How many of each tenant's ``due`` actions one pass of at most ``limit`` takes on:
    round-robin, one each in turn, so that one tenant's backlog never starves the others."""
    taken = [0] * len(due)
    left = limit
    while left > 0:
        open_ = [i for i, n in enumerate(due) if taken[i] < n]
        if not open_:
            break
        each = max(1, left // len(open_))
        for i in open_:
            more = min(each, due[i] - taken[i], left)
            taken[i] += more
            left -= more
            if left == 0:
                break
    return taken


def reconcile_batch(conn: psycopg.Connection[Any], lookups: Mapping[str, Lookup], *,
                    tenant_id: str | None, limit: int, older_than: timedelta, not_found: str,
                    dry_run: bool, concurrency: int, progress: bool) -> ReconcileBatch:
    """One pass: up to ``limit`` due ``unknown`` actions over the tenants (one, or every tenant
    the role sees with some), settled through ``Ledger.reconcile``, tenant by tenant: the
    tenant whose oldest has waited longest first, each its round-robin share of ``limit``
    (:func:`shares`). A role that may not settle gets one line naming replaysafe_operator
    (raised at the first write). Any other error of one tenant's pass is recorded for that
    tenant (:attr:`ReconcileBatch.errors`) and the pass goes on with the others, unless the
    connection is gone with it."""
    due = query_rows(conn, "unknown_due", {"tenant_id": tenant_id, "older_than": older_than})
    quotas = shares([int(r["due"]) for r in due], limit)
    total = sum(quotas)
    tenants = [str(r["tenant_id"]) for r in due]
    results: list[Reconciliation] = []
    errors: dict[str, str] = {}
    lock = threading.Lock()
    with click.progressbar(length=max(total, 1), label="reconciling", file=sys.stderr,
                           show_pos=True, hidden=not progress or total < PROGRESS_MIN) as bar:
        asked = [0]

        def tick() -> None:
            with lock:
                asked[0] += 1
                bar.update(1)

        def counted(lookup: Lookup) -> Lookup:
            def ask(action: Any) -> Any:
                try:
                    return lookup(action)
                finally:
                    tick()
            return ask

        watched = {op: counted(fn) for op, fn in lookups.items()} if progress else lookups
        for tenant, quota in zip(tenants, quotas, strict=True):
            if quota <= 0:
                continue
            before = asked[0]
            try:
                done = Ledger(conn, tenant_id=tenant).reconcile(
                    watched, limit=quota, older_than=older_than, not_found=not_found,
                    dry_run=dry_run, concurrency=concurrency)
            except AccessDenied as exc:
                raise operator_duty(conn, "reconciling", exc) from None
            except (ReplaysafeError, psycopg.Error) as exc:
                if conn.closed or conn.broken:  # nothing more can be sent on it
                    raise
                errors[tenant] = _tenant_error(exc)
                with lock:
                    bar.update(quota - (asked[0] - before))  # the ones it did not reach
                continue
            with lock:
                bar.update(len(done) - (asked[0] - before))  # the skipped ones
            results += done
    return ReconcileBatch([t for t in tenants
                           if t in errors or any(r.tenant_id == t for r in results)],
                          results, dry_run, frozenset(lookups), errors)


def _tenant_error(exc: BaseException) -> str:
    """What stopped a tenant's pass, in one line: the server's SQLSTATE when it has one."""
    cause = exc.__cause__ if isinstance(exc, ReplaysafeError) else exc
    state = getattr(cause, "sqlstate", None)
    return f"{type(exc).__name__}{f' (SQLSTATE {state})' if state else ''}: {first_line(exc)}"


class Stop:
    """A stop request for the reconcile loop: set by SIGTERM (or by a test), checked between
    batches; the wait between batches ends early when it is set."""

    def __init__(self) -> None:
        self.requested = False

    def request(self, *_args: Any) -> None:
        self.requested = True

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.1, left))


def reconcile_loop(batch: Callable[[], ReconcileBatch], *, interval: float, stop: Stop,
                   report: Callable[[ReconcileBatch], None]) -> ReconcileBatch:
    """Run ``batch`` every ``interval`` seconds until ``stop`` is requested; a batch under
    way is finished first. Returns the last batch (its exit code is the command's)."""
    while True:
        last = batch()
        report(last)
        if stop.requested:
            return last
        stop.wait(interval)
        if stop.requested:
            return last


@click.command(cls=Command)
@global_options
@click.option("--lookups", "lookups", required=True, metavar="MODULE:ATTR",
              callback=_lookups_option,
              help="A mapping of operation name to lookup(action) -> Succeeded | Failed | "
                   "NotFound, e.g. myapp.reconcile:LOOKUPS.")
@TENANT_ALL
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="At most this many unknown actions per batch, oldest first.")
@click.option("--older-than", type=Duration(), default="0s", show_default=True,
              help="Only actions unknown for longer than this (30s, 5m, 2h).")
@click.option("--not-found", type=click.Choice(["retry", "leave"]), default="retry",
              show_default=True,
              help="What NotFound means: retry (the action becomes retryable) or leave it "
                   "unknown (for providers that forget idempotency keys).")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True,
              help="Lookups in flight at once.")
@click.option("--dry-run", is_flag=True, help="Ask the provider, write nothing, show what "
                                              "would be done.")
@click.option("--loop", "loop", is_flag=True,
              help="Keep reconciling, a batch every --interval, until SIGTERM.")
@click.option("--interval", type=Duration(), default="60s", show_default=True,
              help="With --loop: the pause between batches.")
@click.pass_context
@with_conn
def reconcile(ctx: click.Context, conn: psycopg.Connection[Any], lookups: dict[str, Lookup],
              tenant_id: str | None, limit: int, older_than: timedelta, not_found: str,
              concurrency: int, dry_run: bool, loop: bool, interval: timedelta) -> None:
    """Settle unknown actions by asking the provider (replaysafe_operator's duty).

    Exit status 0 when every action with a lookup was settled, 1 when some stay unknown
    (left unknown, or skipped: held by another transaction), 2 on errors (a lookup that
    raised, a row that cannot be read)."""
    json_out = state_of(ctx).json

    def batch() -> ReconcileBatch:
        return reconcile_batch(conn, lookups, tenant_id=tenant_id, limit=limit,
                               older_than=older_than, not_found=not_found, dry_run=dry_run,
                               concurrency=concurrency, progress=not json_out)

    if not loop:
        last = batch()
        emit(ctx, last.human, last.data())
    else:
        def report(b: ReconcileBatch) -> None:
            at = datetime.now().astimezone()
            if json_out:
                click.echo(render.dumps({"at": at} | b.data(), line=True))
            else:
                click.echo(render.escape(b.human(at), keep_newlines=True))

        stop = Stop()
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, stop.request) if in_main else None
        try:
            last = reconcile_loop(batch, interval=interval.total_seconds(), stop=stop,
                                  report=report)
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    failed = [r for r in last.results if r.outcome is ReconcileOutcome.ERROR]
    problems = []
    if last.errors:
        tenant, error = next(iter(last.errors.items()))
        problems.append(f"{len(last.errors)} tenant(s) stopped on an error (first: {tenant}: "
                        f"{error})")
    if failed:
        lookups_failed = all((r.error or "").startswith("the lookup") for r in failed)
        what = "lookup(s) failed" if lookups_failed else "action(s) could not be reconciled"
        problems.append(f"{len(failed)} {what}, their actions stay unknown "
                        f"(first: {failed[0].action_key}: {failed[0].error})")
    if problems:
        raise CliError("; ".join(problems))
    ctx.exit(last.exit_code)
