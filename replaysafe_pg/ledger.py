"""``Ledger`` and ``AsyncLedger``: one method per ``replaysafe`` ledger function.

Facades: each method is one round trip built by :class:`~replaysafe_pg.statements.Statements`
(parameters in, values out); ``run`` and ``run_many`` hand a plan to the runner's shell.
Nothing in the package below them imports this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from replaysafe_pg import queries, reconcile, run_async, run_policy, run_sync
from replaysafe_pg._conn import AsyncConninfo, AsyncSource, Conninfo, SyncSource
from replaysafe_pg._grant import GrantArg
from replaysafe_pg._heartbeat import Heartbeats
from replaysafe_pg.errors import InvalidArgument
from replaysafe_pg.execution import Encoder, Execution, Retryable
from replaysafe_pg.limits import DEFAULT_LIMITS, Limits
from replaysafe_pg.models import Action, ActionState, Attempt, AttemptToken, Claim, ReportOutcome
from replaysafe_pg.reconcile import DEFAULT_CONCURRENCY, Lookup, Reconciliation, Request
from replaysafe_pg.run_policy import CallSpec, Plan
from replaysafe_pg.statements import Lease, Statement, Statements, default_worker_id

__all__ = ["DEFAULT_LEASE", "DEFAULT_WAIT_TIMEOUT", "AsyncLedger", "CallSpec", "Encoder", "Lease",
           "Ledger", "default_worker_id"]

DEFAULT_LEASE = timedelta(seconds=30)
DEFAULT_WAIT_TIMEOUT = run_policy.DEFAULT_WAIT_TIMEOUT

T = TypeVar("T")


def _in_transaction(method: str) -> str:
    """Why ``reconcile`` refuses a connection inside the caller's open transaction."""
    return (f"{method} was given a connection inside an open transaction: each settlement "
            "must be a transaction of its own (its lock wait would stay set in yours, and an "
            "action held by another transaction, or a row the server cannot return, would "
            "abort yours). Nothing was sent; commit or roll back first, or give the ledger a "
            "DSN or a pool")


def _refuse_in_event_loop(method: str) -> None:
    """A sync run waits (for the tool, for another worker's claim) and would stall every
    task of a running event loop meanwhile: refused, pointing at the async flavour."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise InvalidArgument(f"Ledger.{method} was called inside a running asyncio event loop, "
                          f"which it would block: use AsyncLedger.{method} (await it)")


class _LedgerBase:
    """What the sync and async flavours share: the calls bound to tenant and worker, and
    the plan of a ``run``. Every builder checks types and ranges first, so a bad argument is
    refused before anything is sent."""

    _can_await = False  # the async flavour awaits coroutine tools

    def __init__(self, *, tenant_id: str | None, worker_id: str | None,
                 encoder: Encoder | None, grant: GrantArg | None, limits: Limits) -> None:
        self._sql = Statements(tenant_id, worker_id, grant, limits)
        # run(): what turns a tool's result into JSON data; None is pydantic-core's
        # to_jsonable_python (docs/run.md).
        self.encoder = encoder

    @property
    def tenant_id(self) -> str:
        return self._sql.tenant_id

    @property
    def worker_id(self) -> str:
        return self._sql.worker_id

    @property
    def limits(self) -> Limits:
        """The size limits checked before anything is sent (docs/python.md#size-limits)."""
        return self._sql.limits

    def _plans(self, calls: Sequence[CallSpec], *, encoder: Encoder | None,
               **options: Any) -> list[Plan]:
        return run_policy.make_plans(self._sql, calls, can_await=self._can_await,
                                 encoder=self.encoder if encoder is None else encoder, **options)

    def _plan(self, operation: str, fn: Callable[..., Any], args: dict[str, Any], key: str, *,
              encoder: Encoder | None, **options: Any) -> Plan:
        return run_policy.make_plan(self._sql, operation, fn, args, key,
                                can_await=self._can_await,
                                encoder=self.encoder if encoder is None else encoder, **options)


class Ledger(_LedgerBase):
    """The action ledger for one tenant (synchronous).

    ``conninfo`` is a DSN (the ledger opens one autocommit connection lazily), a psycopg
    connection, or a psycopg_pool pool. ``encoder`` turns what ``run``'s tools return into
    JSON data (default: pydantic-core's ``to_jsonable_python``; see docs/run.md).
    ``prepare``: None (default), prepared statements on a connection whose server session is
    its own (a direct one), unnamed through a pooler; True, prepared wherever psycopg allows
    (a session pooler); False, always unnamed (docs/deploying.md). ``listen``: where
    ``run``'s waiters LISTEN for wake-ups: True (one connection to where ``conninfo``
    points, outside any pool), a DSN (a direct one, behind a transaction pooler), or False
    (none: waiters claim again every second).

    ``grant``: a tenant grant (``replaysafe_pg.issue_grant``), or a zero-argument callable
    returning the current one (asked once here and before every statement, so a long-lived
    ledger can be handed fresh grants), for a pooled login that is bound to no tenant
    (docs/isolation.md#tenant-grants). Every call then sends it; ``tenant_id`` may be
    omitted (it is then the grant's) and must be the grant's when given (``tenant_id``
    omitted without a grant: ``"default"``). The reads of the views (``get``, ``attempts``,
    ``reconcile``'s work list and pages) put the grant in force with ``use_grant`` first, in
    their own transaction; on a connection inside a transaction of the caller's, in that one
    (where it then stays in force until it ends; ``reconcile`` refuses such a connection).

    ``limits``: the size limits the driver checks before it sends anything (default: those
    the schema installs; give the owner's values when they were changed,
    docs/python.md#size-limits). A request or error over them raises
    :class:`~replaysafe_pg.errors.InvalidArgument`; a result or provider reference over them
    (which come after the side effect) is recorded as an ``unknown`` action instead, its
    error ``{"reason": "result_too_large", "bytes": n}`` (``"provider_reference_bytes": n``
    for the reference).
    """

    def __init__(self, conninfo: Conninfo, *, tenant_id: str | None = None,
                 worker_id: str | None = None, encoder: Encoder | None = None,
                 prepare: bool | None = None, listen: str | bool = True,
                 grant: GrantArg | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(tenant_id=tenant_id, worker_id=worker_id, encoder=encoder,
                         grant=grant, limits=limits)
        self._source = SyncSource(conninfo, prepare=prepare, listen=listen,
                                  use_grant=queries.get("use_grant"))
        self._heartbeats = Heartbeats(self._source)
        self._runner = run_sync.Runner(self._sql, self._source, self._heartbeats)

    def close(self) -> None:
        self._heartbeats.close()
        self._source.close()

    def run(self, operation: str, fn: Callable[..., Any], args: dict[str, Any], *, key: str,
            thread_id: str | None = None, lease: Lease = DEFAULT_LEASE,
            on_expired: str = "unknown", wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
            timeout: float | None = None, retryable: Retryable = None,
            encoder: Encoder | None = None) -> Execution:
        """Run ``fn(**args)`` at most once for ``key``; see docs/run.md.

        Claims the action; if it is ours, runs the tool (with heartbeats, passing
        ``idempotency_key=`` when ``fn`` takes it) and records the outcome; if it is
        recorded, returns it (``replay=True``); if another attempt runs it, waits for it up
        to ``wait_timeout`` seconds (then ``status="running"``). ``result`` is what a replay
        returns: the stored JSON of ``encoder(fn's result)`` (default: the ledger's).
        """
        _refuse_in_event_loop("run")
        return self._runner.run(self._plan(
            operation, fn, args, key, thread_id=thread_id, lease=lease, on_expired=on_expired,
            wait_timeout=wait_timeout, timeout=timeout, retryable=retryable, encoder=encoder))

    def run_many(self, calls: Sequence[CallSpec], *, thread_id: str | None = None,
                 lease: Lease = DEFAULT_LEASE, on_expired: str = "unknown",
                 wait_timeout: float = DEFAULT_WAIT_TIMEOUT, timeout: float | None = None,
                 retryable: Retryable = None, max_workers: int = 16,
                 encoder: Encoder | None = None) -> list[Execution]:
        """The parallel tool calls of one model turn: ``(operation, fn, args, key)`` each.

        All claims in one round trip; the claimed calls run in a thread pool and each is
        recorded as soon as it returns. Executions come back in input order.
        """
        _refuse_in_event_loop("run_many")
        return self._runner.run_many(self._plans(
            calls, thread_id=thread_id, lease=lease, on_expired=on_expired,
            wait_timeout=wait_timeout, timeout=timeout, retryable=retryable, encoder=encoder),
            max_workers)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, statement: Statement[T]) -> T:
        return statement.decode(self._source.execute(statement.query, statement.params))

    def claim(self, action_key: str, operation: str, request: dict[str, Any], *,
              lease: Lease = DEFAULT_LEASE, thread_id: str | None = None,
              on_expired: str = "unknown", now: datetime | None = None,
              claim_token: str | None = None) -> Claim:
        """``claim_action``: create or find the action; see :class:`Claim`. A
        ``claim_token`` (unique per call) lets a claim whose answer was lost be asked again."""
        return self._send(self._sql.claim(action_key, operation, request, lease, thread_id,
                                            on_expired, now, claim_token))

    def claim_many(self, calls: list[tuple[str, str, dict[str, Any]]], *,
                   lease: Lease = DEFAULT_LEASE, thread_id: str | None = None,
                   on_expired: str = "unknown", now: datetime | None = None,
                   claim_tokens: Sequence[str | None] | None = None) -> list[Claim]:
        """``claim_actions``: claim ``(action_key, operation, request)`` calls in one round trip;
        answers in input order. ``claim_tokens``: one per call, as ``claim_token``."""
        return self._send(self._sql.claim_many(calls, lease, thread_id, on_expired, now,
                                                 claim_tokens))

    def heartbeat(self, claim: Claim | AttemptToken, *, lease: Lease = DEFAULT_LEASE,
                  now: datetime | None = None) -> datetime:
        """``heartbeat_action`` for the attempt ``claim`` holds (a ``claimed`` :class:`Claim`,
        or an :class:`AttemptToken`): extend its lease, never shortening it;
        :class:`LeaseLost` if it is gone."""
        return self._send(self._sql.heartbeat(claim, lease, now))

    def complete(self, claim: Claim | AttemptToken, result: Any, *,
                 provider_reference: str | None = None,
                 now: datetime | None = None) -> ReportOutcome:
        """``complete_action`` for the attempt ``claim`` holds. A ``result`` over
        ``limits.result`` is not sent: ``mark_action_unknown`` records the action ``unknown``
        with the error ``{"reason": "result_too_large", "bytes": n}`` (or ``"digits": n``,
        and the ``provider_reference`` when given; ``"provider_reference_bytes": n`` when the
        reference is over its limit), and its outcome is returned."""
        return self._send(self._sql.complete(claim, result, provider_reference, now))

    def fail(self, claim: Claim | AttemptToken, error: Any, *, retryable: bool = False,
             now: datetime | None = None) -> ReportOutcome:
        """``fail_action`` for the attempt ``claim`` holds."""
        return self._send(self._sql.fail(claim, error, retryable, now))

    def mark_unknown(self, claim: Claim | AttemptToken, error: Any, *,
                     now: datetime | None = None) -> ReportOutcome:
        """``mark_action_unknown`` for the attempt ``claim`` holds."""
        return self._send(self._sql.mark_unknown(claim, error, now))

    def resolve(self, action_key: str, state: ActionState | str, *, result: Any = None,
                error: Any = None, provider_reference: str | None = None,
                note: str | None = None, now: datetime | None = None,
                expected_attempt: int | None = None) -> ActionState:
        """``resolve_action`` (an operator's duty): settle an ``unknown`` action; with
        ``expected_attempt``, only while it is still on that attempt."""
        return self._send(self._sql.resolve(action_key, state, result, error,
                                              provider_reference, note, now, expected_attempt))

    def reopen(self, action_key: str, *, note: str, now: datetime | None = None) -> ActionState:
        """``reopen_action`` (an operator's duty): a ``failed`` action may run again."""
        return self._send(self._sql.reopen(action_key, note, now))

    def reconcile(self, lookups: Mapping[str, Lookup], *, limit: int = 100,
                  older_than: Lease = 0, not_found: str = "retry", dry_run: bool = False,
                  concurrency: int = DEFAULT_CONCURRENCY) -> list[Reconciliation]:
        """Settle up to ``limit`` of the tenant's ``unknown`` actions (oldest first, unknown
        for longer than ``older_than``) by asking the provider: ``lookups`` maps an
        operation to ``lookup(action) -> Succeeded | Failed | NotFound``; up to
        ``concurrency`` lookups run at once, on a page of actions whose payloads are read
        just before. An action whose row another transaction holds is ``skipped`` (its
        ``note`` says so) after a short lock wait; one whose row cannot be decoded or
        returned is in ``error``; the others go on. A connection of the caller's inside an
        open transaction is refused (``InvalidArgument``) before anything is sent. See
        docs/reconcile.md."""
        request = Request.of(lookups, limit, older_than, not_found, dry_run, concurrency)
        self._source.refuse_open_transaction(_in_transaction("Ledger.reconcile"))
        return reconcile.reconcile(self._send, self._sql, request, self._settle)

    def _settle(self, statement: Statement[T]) -> T:
        """``statement`` after reconcile's lock wait, in one transaction."""
        return statement.decode(self._source.execute(statement.query, statement.params,
                                                     first=reconcile.lock_wait()))

    def sweep(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        """``sweep_expired_actions`` over every tenant this role may see (under a grant:
        the grant's tenant)."""
        return self._send(self._sql.sweep(limit, now))

    def purge(self, older_than: Lease, *, limit: int = 10000, now: datetime | None = None) -> int:
        """``purge_actions`` over every tenant this role may see (under a grant: the
        grant's tenant); one batch of ``limit``."""
        return self._send(self._sql.purge(older_than, limit, now))

    def revoke_grants(self) -> int:
        """``revoke_tenant_grants`` for this ledger's tenant (the schema owner, or an
        operator of the tenant: bound to it, or under a grant with the operator duty): every
        grant issued for the tenant so far, this ledger's own included, is refused from the
        next call on. Returns the tenant's new revocation generation."""
        return self._send(self._sql.revoke_grants())

    def get(self, action_key: str) -> Action | None:
        return self._send(self._sql.get(action_key))

    def attempts(self, action_key: str) -> list[Attempt]:
        return self._send(self._sql.attempts(action_key))


class AsyncLedger(_LedgerBase):
    """The action ledger for one tenant (asyncio); same methods as :class:`Ledger`."""

    _can_await = True

    def __init__(self, conninfo: AsyncConninfo, *, tenant_id: str | None = None,
                 worker_id: str | None = None, encoder: Encoder | None = None,
                 prepare: bool | None = None, listen: str | bool = True,
                 grant: GrantArg | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(tenant_id=tenant_id, worker_id=worker_id, encoder=encoder,
                         grant=grant, limits=limits)
        self._source = AsyncSource(conninfo, prepare=prepare, listen=listen,
                                   use_grant=queries.get("use_grant"))
        self._runner = run_async.AsyncRunner(self._sql, self._source)

    async def close(self) -> None:
        await self._source.close()

    async def run(self, operation: str, fn: Callable[..., Any], args: dict[str, Any], *,
                  key: str, thread_id: str | None = None, lease: Lease = DEFAULT_LEASE,
                  on_expired: str = "unknown", wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
                  timeout: float | None = None, retryable: Retryable = None,
                  encoder: Encoder | None = None) -> Execution:
        """See :meth:`Ledger.run`; coroutine functions are awaited, plain ones run in a thread."""
        return await self._runner.run(self._plan(
            operation, fn, args, key, thread_id=thread_id, lease=lease, on_expired=on_expired,
            wait_timeout=wait_timeout, timeout=timeout, retryable=retryable, encoder=encoder))

    async def run_many(self, calls: Sequence[CallSpec], *, thread_id: str | None = None,
                       lease: Lease = DEFAULT_LEASE, on_expired: str = "unknown",
                       wait_timeout: float = DEFAULT_WAIT_TIMEOUT, timeout: float | None = None,
                       retryable: Retryable = None,
                       encoder: Encoder | None = None) -> list[Execution]:
        """See :meth:`Ledger.run_many`; the claimed calls run concurrently as tasks."""
        return await self._runner.run_many(self._plans(
            calls, thread_id=thread_id, lease=lease, on_expired=on_expired,
            wait_timeout=wait_timeout, timeout=timeout, retryable=retryable, encoder=encoder))

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, statement: Statement[T]) -> T:
        return statement.decode(await self._source.execute(statement.query, statement.params))

    async def claim(self, action_key: str, operation: str, request: dict[str, Any], *,
                    lease: Lease = DEFAULT_LEASE, thread_id: str | None = None,
                    on_expired: str = "unknown", now: datetime | None = None,
                    claim_token: str | None = None) -> Claim:
        return await self._send(self._sql.claim(action_key, operation, request, lease,
                                                  thread_id, on_expired, now, claim_token))

    async def claim_many(self, calls: list[tuple[str, str, dict[str, Any]]], *,
                         lease: Lease = DEFAULT_LEASE, thread_id: str | None = None,
                         on_expired: str = "unknown", now: datetime | None = None,
                         claim_tokens: Sequence[str | None] | None = None) -> list[Claim]:
        return await self._send(self._sql.claim_many(calls, lease, thread_id, on_expired,
                                                       now, claim_tokens))

    async def heartbeat(self, claim: Claim | AttemptToken, *, lease: Lease = DEFAULT_LEASE,
                        now: datetime | None = None) -> datetime:
        return await self._send(self._sql.heartbeat(claim, lease, now))

    async def complete(self, claim: Claim | AttemptToken, result: Any, *,
                       provider_reference: str | None = None,
                       now: datetime | None = None) -> ReportOutcome:
        return await self._send(self._sql.complete(claim, result, provider_reference, now))

    async def fail(self, claim: Claim | AttemptToken, error: Any, *, retryable: bool = False,
                   now: datetime | None = None) -> ReportOutcome:
        return await self._send(self._sql.fail(claim, error, retryable, now))

    async def mark_unknown(self, claim: Claim | AttemptToken, error: Any, *,
                           now: datetime | None = None) -> ReportOutcome:
        return await self._send(self._sql.mark_unknown(claim, error, now))

    async def resolve(self, action_key: str, state: ActionState | str, *, result: Any = None,
                      error: Any = None, provider_reference: str | None = None,
                      note: str | None = None, now: datetime | None = None,
                      expected_attempt: int | None = None) -> ActionState:
        return await self._send(self._sql.resolve(action_key, state, result, error,
                                                    provider_reference, note, now,
                                                    expected_attempt))

    async def reopen(self, action_key: str, *, note: str,
                     now: datetime | None = None) -> ActionState:
        return await self._send(self._sql.reopen(action_key, note, now))

    async def reconcile(self, lookups: Mapping[str, Lookup], *, limit: int = 100,
                        older_than: Lease = 0, not_found: str = "retry", dry_run: bool = False,
                        concurrency: int = DEFAULT_CONCURRENCY) -> list[Reconciliation]:
        """As :meth:`Ledger.reconcile`; coroutine lookups are awaited."""
        request = Request.of(lookups, limit, older_than, not_found, dry_run, concurrency)
        self._source.refuse_open_transaction(_in_transaction("AsyncLedger.reconcile"))
        return await reconcile.areconcile(self._send, self._sql, request, self._settle)

    async def _settle(self, statement: Statement[T]) -> T:
        """See :meth:`Ledger._settle`."""
        return statement.decode(await self._source.execute(statement.query, statement.params,
                                                           first=reconcile.lock_wait()))

    async def sweep(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        return await self._send(self._sql.sweep(limit, now))

    async def purge(self, older_than: Lease, *, limit: int = 10000,
                    now: datetime | None = None) -> int:
        return await self._send(self._sql.purge(older_than, limit, now))

    async def revoke_grants(self) -> int:
        """See :meth:`Ledger.revoke_grants`."""
        return await self._send(self._sql.revoke_grants())

    async def get(self, action_key: str) -> Action | None:
        return await self._send(self._sql.get(action_key))

    async def attempts(self, action_key: str) -> list[Attempt]:
        return await self._send(self._sql.attempts(action_key))
