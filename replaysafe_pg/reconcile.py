"""Reconciliation: settle ``unknown`` actions by asking the provider, never by guessing.

A **lookup** is a callable per operation, ``lookup(action) -> Succeeded | Failed | NotFound``
(the async flavour awaits coroutine lookups), that asks the provider whether the effect of
``action`` happened: by ``action.idempotency_key`` (the key every attempt passed downstream)
or ``action.provider_reference``. Each answer settles the action through ``resolve_action``
with ``p_expected_attempt`` = the attempt the lookup saw, so a stale lookup never settles a
newer attempt, and a second reconciler finds the action settled (``already_resolved``).
Reconciling is an operator's duty (``replaysafe_operator``). See docs/reconcile.md.

Shared machinery, never held hostage by one tenant's rows: the work list names the due
actions without their payloads, and each page's payloads are read only when its lookups are
about to run (memory: one page's, whatever ``limit``); a row the driver cannot decode, or the
server cannot return (its JSON text over the server's 1 GB, a statement timeout), is that
action's ``error``; a settlement waits at most ``LOCK_WAIT_MS`` for a row another transaction
holds, and that action is then ``skipped`` (held) while the others go on.

This module is the policy (what an answer means, the note it leaves) and the two I/O loops
that the ``Ledger`` and ``AsyncLedger`` facades hand their connection to.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any, LiteralString, TypeAlias, TypeVar

import psycopg
from psycopg import errors as pg_errors

from replaysafe_pg import _args, queries
from replaysafe_pg.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    InvalidTransition,
    ReplaysafeError,
)
from replaysafe_pg.models import Action, ActionState
from replaysafe_pg.statements import Rows, Statement, Statements, acting_for

__all__ = [
    "Action",
    "Failed",
    "Lookup",
    "NotFound",
    "ReconcileOutcome",
    "Reconciliation",
    "Succeeded",
]

T = TypeVar("T")
# How many lookups may be in flight at once by default: providers rate-limit.
DEFAULT_CONCURRENCY = 8
NOT_FOUND_POLICIES = ("retry", "leave")
# A settlement waits at most this long for a lock that another transaction holds on the
# action (a report in a transaction left open, another reconciler's write): the action is
# then skipped (HELD_NOTE), the others go on. Set in resolve_action's own transaction only
# (inside a caller's open transaction: until that one ends).
LOCK_WAIT_MS = 500
# Once this many of its actions were found held in one call, the tenant's others are left
# for the next (NOT_TRIED_NOTE): a tenant that holds many rows delays a pass by at most
# HELD_LIMIT lock waits.
HELD_LIMIT = 3
# The payloads of at most this many actions (and at most ``concurrency``) are read at once,
# each action's at most ROW_BYTES, stored and as JSON text (its request, result and error at
# the schema's default limit of 1 MiB each). An action whose payloads are larger is read
# alone, after its page: a row larger than the payload limits (which can exist when the
# owner lowered them) or than ROW_BYTES under limits the owner raised, or a row within the
# limits whose JSON text is longer than ROW_BYTES (the limits measure the stored, compressed
# size: a value that compresses well, or holds many small numbers, prints to far more).
PAGE_MAX = 16
ROW_BYTES = 3 * 1024 * 1024

HELD_NOTE = (f"skipped: held by another transaction (no lock within {LOCK_WAIT_MS} ms): "
             "nothing written; try again later")
NOT_TRIED_NOTE = (f"skipped: {HELD_LIMIT} of the tenant's actions were held by other "
                  "transactions in this pass, the rest wait for the next: nothing written")
GONE_NOTE = ("settled or run again by someone else since it was listed: nothing looked up "
             "or written")


@dataclass(frozen=True, slots=True)
class Succeeded:
    """The provider holds the effect: the action becomes ``succeeded`` with this result."""

    result: Any = None
    provider_reference: str | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The provider refused the effect: the action becomes ``failed`` with this error."""

    error: Any


@dataclass(frozen=True, slots=True)
class NotFound:
    """The provider has no effect for this idempotency key or reference."""


Verdict: TypeAlias = Succeeded | Failed | NotFound
Lookup: TypeAlias = Callable[[Action], "Verdict | Awaitable[Verdict]"]


class ReconcileOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYABLE = "retryable"
    LEFT_UNKNOWN = "left_unknown"
    SKIPPED = "skipped"
    ERROR = "error"
    ALREADY_RESOLVED = "already_resolved"


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What reconciling one action did (or, with ``dry_run``, would do)."""

    tenant_id: str
    action_key: str
    operation: str
    outcome: ReconcileOutcome
    provider_reference: str | None
    note: str | None
    attempt: int
    error: str | None = None  # what went wrong, for ``error``
    dry_run: bool = False


# --- the policy -------------------------------------------------------------------------

def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decide(sql: Statements, action: Action, verdict: Any, not_found: str,
           dry_run: bool) -> tuple[Statement[ActionState] | None, Reconciliation]:
    """What an answer of the provider means: the statement that settles the action (None:
    nothing to write) and the record of it."""
    base = Reconciliation(tenant_id=action.tenant_id, action_key=action.action_key,
                          operation=action.operation, outcome=ReconcileOutcome.ERROR,
                          provider_reference=action.provider_reference, note=None,
                          attempt=action.attempt, dry_run=dry_run)
    if isinstance(verdict, Succeeded):
        reference = verdict.provider_reference or action.provider_reference
        note = ("reconciled: found at provider"
                + (f", reference {reference}" if reference else ", no reference"))
        done = replace(base, outcome=ReconcileOutcome.SUCCEEDED, provider_reference=reference,
                       note=note)
        return sql.resolve(action.action_key, ActionState.SUCCEEDED, verdict.result, None,
                             reference, note, None, expected_attempt=action.attempt), done
    if isinstance(verdict, Failed):
        note = "reconciled: refused at provider"
        done = replace(base, outcome=ReconcileOutcome.FAILED, note=note)
        return sql.resolve(action.action_key, ActionState.FAILED, None, verdict.error, None,
                             note, None, expected_attempt=action.attempt), done
    if isinstance(verdict, NotFound):
        if not_found == "leave":
            return None, replace(base, outcome=ReconcileOutcome.LEFT_UNKNOWN,
                                 note="not found at provider: left unknown")
        note = "reconciled: not found at provider, will run again with the same idempotency key"
        done = replace(base, outcome=ReconcileOutcome.RETRYABLE, note=note)
        return sql.resolve(action.action_key, ActionState.RETRYABLE, None,
                             {"reason": "not_found_at_provider"}, None, note, None,
                             expected_attempt=action.attempt), done
    return None, replace(base, error=f"the lookup returned {_short(verdict)}, not Succeeded, "
                                     "Failed or NotFound: nothing written")


@dataclass(frozen=True, slots=True)
class Due:
    """One action of the work list, without its payloads."""

    tenant_id: str
    action_key: str
    operation: str
    attempt: int
    provider_reference: str | None


Item: TypeAlias = Action | Due


def _record(item: Item, outcome: ReconcileOutcome, note: str | None, dry_run: bool,
            error: str | None = None) -> Reconciliation:
    return Reconciliation(tenant_id=item.tenant_id, action_key=item.action_key,
                          operation=item.operation, outcome=outcome,
                          provider_reference=item.provider_reference, note=note,
                          attempt=item.attempt, error=error, dry_run=dry_run)


def _skipped(item: Item, dry_run: bool) -> Reconciliation:
    return _record(item, ReconcileOutcome.SKIPPED, f"no lookup for operation {item.operation}",
                   dry_run)


def _failed_lookup(action: Action, exc: BaseException, dry_run: bool) -> Reconciliation:
    return _record(action, ReconcileOutcome.ERROR, None, dry_run,
                   error=f"the lookup raised {type(exc).__name__}: {_short(str(exc))}; "
                         "nothing written")


def _unreadable(item: Item, exc: BaseException, dry_run: bool) -> Reconciliation:
    refused = _server_error(exc)
    if refused is None:  # the driver's: a value it cannot decode
        what, then = f"{type(exc).__name__}: {_short(str(exc))}", ""
    else:
        message = refused.diag.message_primary or str(refused)
        what = f"the server cannot return it: SQLSTATE {refused.sqlstate}: {_cut(message)}"
        then = "a later pass may read it, or " if refused.sqlstate == _QUERY_CANCELED else ""
    reason = (f"its row cannot be read: {what}; nothing looked up or written ({then}settle it "
              "by hand: resolve)")
    return _record(item, ReconcileOutcome.ERROR, reason, dry_run, error=reason)


def _unstorable(action: Action, exc: BaseException, dry_run: bool) -> Reconciliation:
    return _record(action, ReconcileOutcome.ERROR, None, dry_run,
                   error=f"the lookup's answer cannot be stored: {exc}; nothing written")


@dataclass(frozen=True, slots=True)
class Request:
    """The arguments of one ``reconcile`` call, checked before anything is sent."""

    lookups: Mapping[str, Lookup]
    limit: int
    older_than: timedelta
    not_found: str
    dry_run: bool
    concurrency: int

    @classmethod
    def of(cls, lookups: Any, limit: Any, older_than: Any, not_found: Any, dry_run: Any,
           concurrency: Any) -> Request:
        if not isinstance(lookups, Mapping) or not all(
                isinstance(k, str) and callable(v) for k, v in lookups.items()):
            raise InvalidArgument("lookups must map operation names to callables")
        if not_found not in NOT_FOUND_POLICIES:
            raise InvalidArgument(f"not_found must be 'retry' or 'leave' (got {not_found!r})")
        limit = _args.integer(limit, "limit")
        concurrency = _args.integer(concurrency, "concurrency")
        if limit < 1 or concurrency < 1:
            raise InvalidArgument("limit and concurrency must be positive")
        return cls(lookups, limit, _args.age(older_than, "older_than"), not_found,
                   _args.flag(dry_run, "dry_run"), concurrency)


# --- the statements and what their answers mean ----------------------------------------

def _due_of(rows: Rows) -> list[Due]:
    return [Due(*row) for row in rows]


def _rows(rows: Rows) -> Rows:
    return rows


def _work_list(sql: Statements, request: Request) -> Statement[list[Due]]:
    return Statement("reconcile_due", {"tenant_id": sql.tenant_id, "limit": request.limit,
                                       "older_than": request.older_than}, _due_of, sql.grant)


def _page_of(sql: Statements, page: Sequence[Due], whole: bool) -> Statement[Rows]:
    """``reconcile_page``; ``whole``: whatever the size of the payloads (an action alone)."""
    return Statement("reconcile_page", {"tenant_id": sql.tenant_id,
                                        "action_keys": [d.action_key for d in page],
                                        "row_bytes": None if whole else ROW_BYTES},
                     _rows, sql.grant)


def lock_wait() -> tuple[LiteralString, dict[str, Any]]:
    """The statement to send before each settlement, in its transaction (``first`` of
    :meth:`SyncSource.execute <replaysafe_pg._conn.SyncSource.execute>`): it then waits at
    most LOCK_WAIT_MS for a lock another transaction holds."""
    return queries.get("reconcile_lock_wait"), {"lock_timeout": f"{LOCK_WAIT_MS}ms"}


def _page_size(request: Request) -> int:
    return max(1, min(request.concurrency, PAGE_MAX))


def _pages(due: Sequence[Due], size: int) -> Iterator[list[Due]]:
    """``due`` in order, in pages of at most ``size`` actions."""
    for start in range(0, len(due), size):
        yield list(due[start:start + size])


def _decoded(row: tuple[Any, ...]) -> Action:
    """One row of ``reconcile_page``: its payloads arrive as JSON text."""
    values = list(row[:19])
    for i in (8, 9, 10):  # request, result, error
        if values[i] is not None:
            values[i] = json.loads(values[i])
    return Action.from_row(tuple(values))


@dataclass(slots=True)
class _Page:
    """A page as read: each action decoded (or the record that replaces it), and the
    actions whose payloads are too large to be read with the others (read alone later)."""

    items: dict[str, Action | Reconciliation]
    large: list[Due]


def _read(rows: Rows, page: Sequence[Due], dry_run: bool) -> _Page:
    """The page's actions, each decoded alone (a row that cannot be, its ``error``); one
    no longer ``unknown`` (or gone) is someone else's since it was listed."""
    found: dict[str, Action | Exception | None] = {}
    for i, row in enumerate(rows):
        rows[i] = ()  # its JSON text goes once decoded: a page is held once, not twice
        if not row[19]:  # fits: its payloads were left out
            found[row[1]] = None
            continue
        try:
            found[row[1]] = _decoded(row)
        except Exception as exc:  # JSON that Python refuses (an int of 5000 digits), ...
            found[row[1]] = exc
        del row
    out = _Page({}, [])
    for d in page:
        if d.action_key in found and (got := found[d.action_key]) is None:
            out.large.append(d)
        elif isinstance(got := found.get(d.action_key), Exception):
            out.items[d.action_key] = _unreadable(d, got, dry_run)
        elif got is None or got.state is not ActionState.UNKNOWN:
            out.items[d.action_key] = _record(d, ReconcileOutcome.ALREADY_RESOLVED, GONE_NOTE,
                                              dry_run)
        else:
            out.items[d.action_key] = got
    return out


def _undecodable(exc: BaseException) -> bool:
    """Did the driver fail to decode a row (rather than the database refuse the query)?"""
    if isinstance(exc, ReplaysafeError):  # psycopg's DataError loading a value, translated
        cause = exc.__cause__
        return isinstance(cause, psycopg.DataError) and cause.sqlstate is None
    return isinstance(exc, ValueError | RecursionError | OverflowError)


# What a server answers when it cannot return a page, which need not hold for each of its
# rows: data exceptions (22), insufficient resources (53: out of memory), program limits (54:
# a JSON text over 1 GB), system errors (58: a read of a damaged file), internal errors (XX: a
# damaged TOAST value), and a cancelled statement (57014: statement_timeout). Anything else
# (a connection lost, a refused role, a revoked grant, a schema missing) is no row's.
_ROW_REFUSALS = ("22", "53", "54", "58", "XX")
_QUERY_CANCELED = "57014"


def _server_error(exc: BaseException) -> psycopg.Error | None:
    """The server's error behind ``exc`` (one with a SQLSTATE), if any."""
    cause = exc.__cause__ if isinstance(exc, ReplaysafeError) else exc
    if isinstance(cause, psycopg.Error) and cause.sqlstate is not None:
        return cause
    return None


def _row_refused(exc: BaseException) -> bool:
    """Did the server refuse to return some row of the page (rather than the session)?"""
    refused = _server_error(exc)
    state = None if refused is None else refused.sqlstate
    return state is not None and (state[:2] in _ROW_REFUSALS or state == _QUERY_CANCELED)


def _rows_fault(exc: BaseException) -> bool:
    """Is ``exc`` one row's (read alone, that action's error), not the whole pass's?"""
    return _undecodable(exc) or _row_refused(exc)


def _held(exc: BaseException) -> bool:
    """Is ``exc`` the lock wait of a settlement running out (SQLSTATE 55P03)?"""
    return isinstance(exc, DatabaseUnavailable) and isinstance(exc.__cause__,
                                                               pg_errors.LockNotAvailable)


def _after_refusal(exc: Exception, action: Action, done: Reconciliation) -> Reconciliation:
    """The record of a settlement that the database refused (``exc`` raised again when it
    is not this action's alone)."""
    if isinstance(exc, InvalidTransition):
        # Settled (or re-run) since the lookup: another reconciler, an operator, a worker's
        # late report. The action's own state says what it is now.
        return replace(done, outcome=ReconcileOutcome.ALREADY_RESOLVED)
    if _held(exc):
        return _record(action, ReconcileOutcome.SKIPPED, HELD_NOTE, done.dry_run)
    if isinstance(exc, InvalidArgument):  # the answer over a limit the database checks
        return _unstorable(action, exc, done.dry_run)
    raise exc


class _Pass:
    """What one call has done so far: the records, and how many actions it found held."""

    def __init__(self, sql: Statements, request: Request) -> None:
        self.sql = sql
        self.request = request
        self.records: dict[str, Reconciliation] = {}
        self.held = 0

    def todo(self, due: Sequence[Due]) -> list[Due]:
        """The actions to look up (those with a lookup); the others are skipped."""
        out = []
        for d in due:
            if d.operation in self.request.lookups:
                out.append(d)
            else:
                self.records[d.action_key] = _skipped(d, self.request.dry_run)
        return out

    def out_of_patience(self, items: Sequence[Item]) -> bool:
        """Once HELD_LIMIT actions were held, the rest of ``items`` wait for the next pass."""
        if self.held < HELD_LIMIT:
            return False
        for item in items:
            self.records.setdefault(item.action_key, _record(
                item, ReconcileOutcome.SKIPPED, NOT_TRIED_NOTE, self.request.dry_run))
        return True

    def plan(self, action: Action, answer: tuple[Any, Reconciliation | None]
             ) -> tuple[Statement[ActionState] | None, Reconciliation]:
        verdict, failed = answer
        if failed is not None:
            return None, failed
        try:
            statement, done = decide(self.sql, action, verdict, self.request.not_found,
                                     self.request.dry_run)
        except InvalidArgument as exc:  # e.g. a result that is not JSON: this action only
            return None, _unstorable(action, exc, self.request.dry_run)
        if statement is None or done.dry_run:
            return None, done
        return statement, done

    def record(self, done: Reconciliation) -> None:
        if done.outcome is ReconcileOutcome.SKIPPED and done.note == HELD_NOTE:
            self.held += 1
        self.records[done.action_key] = done

    def results(self, due: Sequence[Due]) -> list[Reconciliation]:
        return [self.records[d.action_key] for d in due]


# --- the I/O loops ----------------------------------------------------------------------
# Per page: read it (_load), look its actions up, settle them one by one; then each of its
# large actions, alone, the same way. Only one page's payloads (or one large action's) are
# held at a time.

def _verdict_or_record(lookup: Lookup, action: Action,
                       dry_run: bool) -> tuple[Any, Reconciliation | None]:
    try:
        return lookup(action), None
    except Exception as exc:  # a lookup's failure is reported, never raised: nothing written
        return None, _failed_lookup(action, exc, dry_run)


def _load(send: Callable[[Statement[Any]], Any], sql: Statements, page: Sequence[Due],
          dry_run: bool, whole: bool = False) -> _Page:
    """The page's actions; a page with a row the driver cannot decode, or the server cannot
    return, is read again action by action, so that only that one is in error."""
    try:
        rows: Rows = send(_page_of(sql, page, whole))
    except Exception as exc:
        if not _rows_fault(exc):
            raise
        if len(page) == 1:
            return _Page({page[0].action_key: _unreadable(page[0], exc, dry_run)}, [])
        out = _Page({}, [])
        for d in page:
            one = _load(send, sql, [d], dry_run, whole)
            out.items |= one.items
            out.large += one.large
        return out
    return _read(rows, page, dry_run)


def reconcile(send: Callable[[Statement[Any]], Any], sql: Statements, request: Request,
              settle: Callable[[Statement[ActionState]], ActionState]
              ) -> list[Reconciliation]:
    """Page by page, oldest first: read the page's actions, look them up (lookups overlap,
    up to ``concurrency``), settle them one by one through ``settle`` (``send`` after
    :func:`lock_wait`, in one transaction)."""
    due: list[Due] = send(_work_list(sql, request))
    if not due:
        send(acting_for(sql.grant))  # nothing due: is there a tenant at all?
    work = _Pass(sql, request)
    size = _page_size(request)

    def run(pool: ThreadPoolExecutor, read: _Page) -> None:
        actions = [a for a in read.items.values() if isinstance(a, Action)]
        answers = dict(zip((a.action_key for a in actions), pool.map(
            lambda a: _verdict_or_record(request.lookups[a.operation], a, request.dry_run),
            actions), strict=True))
        for item in read.items.values():
            if isinstance(item, Reconciliation):
                work.record(item)
            elif not work.out_of_patience([item]):
                work.record(_settle(settle, item, *work.plan(item, answers[item.action_key])))

    with ThreadPoolExecutor(max_workers=size) as pool:
        for page in _pages(work.todo(due), size):
            if work.out_of_patience(page):
                continue
            read = _load(send, sql, page, request.dry_run)
            large, read.large = read.large, []
            run(pool, read)
            del read  # the page's payloads, before the large ones' and the next page's
            for d in large:
                if not work.out_of_patience([d]):
                    run(pool, _load(send, sql, [d], request.dry_run, whole=True))
    return work.results(due)


def _settle(settle: Callable[[Statement[ActionState]], ActionState], action: Action,
            statement: Statement[ActionState] | None, done: Reconciliation) -> Reconciliation:
    if statement is None:
        return done
    try:
        settle(statement)
    except Exception as exc:
        return _after_refusal(exc, action, done)
    return done


async def _aload(send: Callable[[Statement[Any]], Awaitable[Any]], sql: Statements,
                 page: Sequence[Due], dry_run: bool, whole: bool = False) -> _Page:
    """See :func:`_load`."""
    try:
        rows: Rows = await send(_page_of(sql, page, whole))
    except Exception as exc:
        if not _rows_fault(exc):
            raise
        if len(page) == 1:
            return _Page({page[0].action_key: _unreadable(page[0], exc, dry_run)}, [])
        out = _Page({}, [])
        for d in page:
            one = await _aload(send, sql, [d], dry_run, whole)
            out.items |= one.items
            out.large += one.large
        return out
    return _read(rows, page, dry_run)


async def areconcile(send: Callable[[Statement[Any]], Awaitable[Any]], sql: Statements,
                     request: Request,
                     settle: Callable[[Statement[ActionState]], Awaitable[ActionState]]
                     ) -> list[Reconciliation]:
    """The async flavour: coroutine lookups are awaited, up to ``concurrency`` at once."""
    due: list[Due] = await send(_work_list(sql, request))
    if not due:
        await send(acting_for(sql.grant))  # as above
    work = _Pass(sql, request)
    gate = asyncio.Semaphore(request.concurrency)

    async def ask(action: Action) -> tuple[Any, Reconciliation | None]:
        async with gate:
            try:
                answer = request.lookups[action.operation](action)
                if inspect.isawaitable(answer):
                    answer = await answer
                return answer, None
            except Exception as exc:
                return None, _failed_lookup(action, exc, request.dry_run)

    async def run(read: _Page) -> None:
        actions = [a for a in read.items.values() if isinstance(a, Action)]
        answers = dict(zip((a.action_key for a in actions),
                           await asyncio.gather(*(ask(a) for a in actions)), strict=True))
        for item in read.items.values():
            if isinstance(item, Reconciliation):
                work.record(item)
            elif not work.out_of_patience([item]):
                statement, done = work.plan(item, answers[item.action_key])
                if statement is not None:
                    try:
                        await settle(statement)
                    except Exception as exc:
                        done = _after_refusal(exc, item, done)
                work.record(done)

    for page in _pages(work.todo(due), _page_size(request)):
        if work.out_of_patience(page):
            continue
        read = await _aload(send, sql, page, request.dry_run)
        large, read.large = read.large, []
        await run(read)
        del read
        for d in large:
            if not work.out_of_patience([d]):
                await run(await _aload(send, sql, [d], request.dry_run, whole=True))
    return work.results(due)


def summary(results: Sequence[Reconciliation]) -> dict[str, int]:
    """How many of each outcome (for logs and the command line)."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome.value] = counts.get(r.outcome.value, 0) + 1
    return counts
