"""``Ledger`` and ``AsyncLedger``: one method per ``replaysafe`` ledger function.

Each method is one round trip (a named query from ``sql/queries.sql``). The classes share
everything but I/O through :class:`_LedgerBase`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from replaysafe_pg import _args, _json, arun, queries, run
from replaysafe_pg._conn import AsyncConninfo, AsyncSource, Conninfo, SyncSource
from replaysafe_pg._heartbeat import Heartbeater
from replaysafe_pg.errors import InvalidArgument
from replaysafe_pg.execution import MAX_RESULT_BYTES, Execution, Retryable
from replaysafe_pg.models import Action, ActionState, Attempt, Claim, ReportOutcome

DEFAULT_LEASE = timedelta(seconds=30)
DEFAULT_WAIT_TIMEOUT = run.DEFAULT_WAIT_TIMEOUT
Lease = timedelta | float | int
CallSpec = run.CallSpec


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _LedgerBase:
    """Parameters in, values out: shared by the sync and async flavours. Every builder
    checks types and ranges first, so a bad argument is refused before anything is sent."""

    def __init__(self, *, tenant_id: str, worker_id: str | None) -> None:
        self.tenant_id = _args.text_id(tenant_id, "tenant_id")
        self.worker_id = _args.text_id(
            default_worker_id() if worker_id is None else worker_id, "worker_id")
        # run(): results whose JSON is larger are not stored (the action becomes unknown).
        self.max_result_bytes = MAX_RESULT_BYTES

    def _key(self, action_key: str) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "action_key": _args.text_id(action_key, "action_key")}

    def _attempt(self, action_key: str, attempt: int, now: datetime | None) -> dict[str, Any]:
        return self._key(action_key) | {"attempt": _args.integer(attempt, "attempt"),
                                        "now": _args.moment(now)}

    def _claim_params(self, action_key: str, operation: str, request: dict[str, Any],
                      lease: Lease, thread_id: str | None, on_expired: str,
                      now: datetime | None) -> dict[str, Any]:
        return self._key(action_key) | {
            "operation": _args.text_id(operation, "operation"),
            "request": _json.dumps_object(request, "request"),
            "worker_id": self.worker_id,
            "lease": _args.lease(lease),
            "thread_id": _args.optional_id(thread_id, "thread_id"),
            "on_expired": _args.text(on_expired, "on_expired"),
            "now": _args.moment(now),
        }

    def _claim_many_params(self, calls: list[tuple[str, str, dict[str, Any]]], lease: Lease,
                           thread_id: str | None, on_expired: str,
                           now: datetime | None) -> dict[str, Any]:
        if not all(isinstance(c, tuple | list) and len(c) == 3 for c in calls):
            raise InvalidArgument("claim_many takes (action_key, operation, request) tuples")
        return {
            "tenant_id": self.tenant_id,
            "action_keys": [_args.text_id(key, "action_key") for key, _, _ in calls],
            "operations": [_args.text_id(op, "operation") for _, op, _ in calls],
            "requests": [_json.dumps_object(req, "request") for _, _, req in calls],
            "worker_id": self.worker_id,
            "lease": _args.lease(lease),
            "thread_id": _args.optional_id(thread_id, "thread_id"),
            "on_expired": _args.text(on_expired, "on_expired"),
            "now": _args.moment(now),
        }

    def _complete_params(self, action_key: str, attempt: int, result: Any,
                         provider_reference: str | None, now: datetime | None) -> dict[str, Any]:
        return self._attempt(action_key, attempt, now) | {
            "result": _json.dumps(result, "result"),
            "provider_reference": _args.optional_text(provider_reference, "provider_reference")}

    def _fail_params(self, action_key: str, attempt: int, error: Any, retryable: bool,
                     now: datetime | None) -> dict[str, Any]:
        return self._attempt(action_key, attempt, now) | {
            "error": _json.dumps(error, "error"), "retryable": _args.flag(retryable, "retryable")}

    def _unknown_params(self, action_key: str, attempt: int, error: Any,
                        now: datetime | None) -> dict[str, Any]:
        return self._attempt(action_key, attempt, now) | {"error": _json.dumps(error, "error")}

    def _heartbeat_params(self, action_key: str, attempt: int, lease: Lease,
                          now: datetime | None) -> dict[str, Any]:
        return self._attempt(action_key, attempt, now) | {"lease": _args.lease(lease)}

    def _resolve_params(self, action_key: str, state: ActionState | str, result: Any, error: Any,
                        provider_reference: str | None, note: str | None,
                        now: datetime | None) -> dict[str, Any]:
        return self._key(action_key) | {
            "state": _args.text(str(state) if isinstance(state, ActionState) else state, "state"),
            "result": None if result is None else _json.dumps(result, "result"),
            "error": None if error is None else _json.dumps(error, "error"),
            "provider_reference": _args.optional_text(provider_reference, "provider_reference"),
            "note": _args.optional_text(note, "note"), "now": _args.moment(now)}

    @staticmethod
    def _sweep_params(limit: int, now: datetime | None) -> dict[str, Any]:
        return {"limit": _args.integer(limit, "limit"), "now": _args.moment(now)}

    @staticmethod
    def _purge_params(older_than: Lease, limit: int, now: datetime | None) -> dict[str, Any]:
        return {"older_than": _args.age(older_than, "older_than"),
                "limit": _args.integer(limit, "limit"), "now": _args.moment(now)}


class Ledger(_LedgerBase):
    """The action ledger for one tenant (synchronous).

    ``conninfo`` is a DSN (the ledger opens one autocommit connection lazily), a psycopg
    connection, or a psycopg_pool pool.
    """

    def __init__(self, conninfo: Conninfo, *, tenant_id: str = "default",
                 worker_id: str | None = None) -> None:
        super().__init__(tenant_id=tenant_id, worker_id=worker_id)
        self._source = SyncSource(conninfo)
        self._heartbeats = Heartbeater(self._source)

    def close(self) -> None:
        self._heartbeats.close()
        self._source.close()

    def run(self, operation: str, fn: Callable[..., Any], args: dict[str, Any], *, key: str,
            thread_id: str | None = None, lease: Lease = DEFAULT_LEASE,
            on_expired: str = "unknown", wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
            timeout: float | None = None, retryable: Retryable = None) -> Execution:
        """Run ``fn(**args)`` at most once for ``key``; see docs/run.md.

        Claims the action; if it is ours, runs the tool (with heartbeats, passing
        ``idempotency_key=`` when ``fn`` takes it) and records the outcome; if it is
        recorded, returns it (``replay=True``); if another attempt runs it, waits for it up
        to ``wait_timeout`` seconds (then ``status="running"``).
        """
        plan = run.make_plan(self, operation, fn, args, key, thread_id=thread_id, lease=lease,
                             on_expired=on_expired, wait_timeout=wait_timeout, timeout=timeout,
                             retryable=retryable, async_ok=False)
        return run.run(self, plan)

    def run_many(self, calls: Sequence[CallSpec], *, thread_id: str | None = None,
                 lease: Lease = DEFAULT_LEASE, on_expired: str = "unknown",
                 wait_timeout: float = DEFAULT_WAIT_TIMEOUT, timeout: float | None = None,
                 retryable: Retryable = None, max_workers: int = 16) -> list[Execution]:
        """The parallel tool calls of one model turn: ``(operation, fn, args, key)`` each.

        All claims in one round trip; the claimed calls run in a thread pool and each is
        recorded as soon as it returns. Executions come back in input order.
        """
        plans = run.make_plans(self, calls, thread_id=thread_id, lease=lease,
                               on_expired=on_expired, wait_timeout=wait_timeout, timeout=timeout,
                               retryable=retryable, async_ok=False)
        return run.run_many(self, plans, max_workers)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _one(self, name: str, params: dict[str, Any]) -> Any:
        return self._source.execute(queries.get(name, params), params)[0][0]

    def claim(self, action_key: str, operation: str, request: dict[str, Any], *,
              lease: Lease = DEFAULT_LEASE, thread_id: str | None = None,
              on_expired: str = "unknown", now: datetime | None = None) -> Claim:
        """``claim_action``: create or find the action; see :class:`Claim`."""
        params = self._claim_params(action_key, operation, request, lease, thread_id,
                                    on_expired, now)
        return Claim.from_row(self._source.execute(queries.get("claim_action", params), params)[0])

    def claim_many(self, calls: list[tuple[str, str, dict[str, Any]]], *,
                   lease: Lease = DEFAULT_LEASE, thread_id: str | None = None,
                   on_expired: str = "unknown", now: datetime | None = None) -> list[Claim]:
        """``claim_actions``: claim ``(action_key, operation, request)`` calls in one round trip;
        answers in input order."""
        params = self._claim_many_params(calls, lease, thread_id, on_expired, now)
        return [Claim.from_row(r) for r in self._source.execute(queries.get("claim_actions", params), params)]

    def heartbeat(self, action_key: str, attempt: int, *, lease: Lease = DEFAULT_LEASE,
                  now: datetime | None = None) -> datetime:
        """``heartbeat_action``: extend the lease; :class:`LeaseLost` if it is gone."""
        result: datetime = self._one("heartbeat_action",
                                     self._heartbeat_params(action_key, attempt, lease, now))
        return result

    def complete(self, action_key: str, attempt: int, result: Any, *,
                 provider_reference: str | None = None,
                 now: datetime | None = None) -> ReportOutcome:
        return ReportOutcome(self._one("complete_action", self._complete_params(
            action_key, attempt, result, provider_reference, now)))

    def fail(self, action_key: str, attempt: int, error: Any, *, retryable: bool = False,
             now: datetime | None = None) -> ReportOutcome:
        return ReportOutcome(self._one("fail_action", self._fail_params(
            action_key, attempt, error, retryable, now)))

    def mark_unknown(self, action_key: str, attempt: int, error: Any, *,
                     now: datetime | None = None) -> ReportOutcome:
        return ReportOutcome(self._one("mark_action_unknown", self._unknown_params(
            action_key, attempt, error, now)))

    def resolve(self, action_key: str, state: ActionState | str, *, result: Any = None,
                error: Any = None, provider_reference: str | None = None,
                note: str | None = None, now: datetime | None = None) -> ActionState:
        return ActionState(self._one("resolve_action", self._resolve_params(
            action_key, state, result, error, provider_reference, note, now)))

    def sweep(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        """``sweep_expired_actions`` over every tenant this role may see."""
        count: int = self._one("sweep_expired_actions", self._sweep_params(limit, now))
        return count

    def purge(self, older_than: Lease, *, limit: int = 10000, now: datetime | None = None) -> int:
        """``purge_actions`` over every tenant this role may see; one batch of ``limit``."""
        count: int = self._one("purge_actions", self._purge_params(older_than, limit, now))
        return count

    def get(self, action_key: str) -> Action | None:
        rows = self._source.execute(queries.get("get_action"), self._key(action_key))
        return Action.from_row(rows[0]) if rows else None

    def attempts(self, action_key: str) -> list[Attempt]:
        rows = self._source.execute(queries.get("list_attempts"), self._key(action_key))
        return [Attempt.from_row(r) for r in rows]


class AsyncLedger(_LedgerBase):
    """The action ledger for one tenant (asyncio); same methods as :class:`Ledger`."""

    def __init__(self, conninfo: AsyncConninfo, *, tenant_id: str = "default",
                 worker_id: str | None = None) -> None:
        super().__init__(tenant_id=tenant_id, worker_id=worker_id)
        self._source = AsyncSource(conninfo)

    async def close(self) -> None:
        await self._source.close()

    async def run(self, operation: str, fn: Callable[..., Any], args: dict[str, Any], *,
                  key: str, thread_id: str | None = None, lease: Lease = DEFAULT_LEASE,
                  on_expired: str = "unknown", wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
                  timeout: float | None = None, retryable: Retryable = None) -> Execution:
        """See :meth:`Ledger.run`; coroutine functions are awaited, plain ones run in a thread."""
        plan = run.make_plan(self, operation, fn, args, key, thread_id=thread_id, lease=lease,
                             on_expired=on_expired, wait_timeout=wait_timeout, timeout=timeout,
                             retryable=retryable, async_ok=True)
        return await arun.run(self, plan)

    async def run_many(self, calls: Sequence[CallSpec], *, thread_id: str | None = None,
                       lease: Lease = DEFAULT_LEASE, on_expired: str = "unknown",
                       wait_timeout: float = DEFAULT_WAIT_TIMEOUT, timeout: float | None = None,
                       retryable: Retryable = None) -> list[Execution]:
        """See :meth:`Ledger.run_many`; the claimed calls run concurrently as tasks."""
        plans = run.make_plans(self, calls, thread_id=thread_id, lease=lease,
                               on_expired=on_expired, wait_timeout=wait_timeout, timeout=timeout,
                               retryable=retryable, async_ok=True)
        return await arun.run_many(self, plans)

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _one(self, name: str, params: dict[str, Any]) -> Any:
        return (await self._source.execute(queries.get(name, params), params))[0][0]

    async def claim(self, action_key: str, operation: str, request: dict[str, Any], *,
                    lease: Lease = DEFAULT_LEASE, thread_id: str | None = None,
                    on_expired: str = "unknown", now: datetime | None = None) -> Claim:
        params = self._claim_params(action_key, operation, request, lease, thread_id,
                                    on_expired, now)
        return Claim.from_row((await self._source.execute(queries.get("claim_action", params), params))[0])

    async def claim_many(self, calls: list[tuple[str, str, dict[str, Any]]], *,
                         lease: Lease = DEFAULT_LEASE, thread_id: str | None = None,
                         on_expired: str = "unknown", now: datetime | None = None) -> list[Claim]:
        params = self._claim_many_params(calls, lease, thread_id, on_expired, now)
        rows = await self._source.execute(queries.get("claim_actions", params), params)
        return [Claim.from_row(r) for r in rows]

    async def heartbeat(self, action_key: str, attempt: int, *, lease: Lease = DEFAULT_LEASE,
                        now: datetime | None = None) -> datetime:
        result: datetime = await self._one(
            "heartbeat_action", self._heartbeat_params(action_key, attempt, lease, now))
        return result

    async def complete(self, action_key: str, attempt: int, result: Any, *,
                       provider_reference: str | None = None,
                       now: datetime | None = None) -> ReportOutcome:
        return ReportOutcome(await self._one("complete_action", self._complete_params(
            action_key, attempt, result, provider_reference, now)))

    async def fail(self, action_key: str, attempt: int, error: Any, *, retryable: bool = False,
                   now: datetime | None = None) -> ReportOutcome:
        return ReportOutcome(await self._one("fail_action", self._fail_params(
            action_key, attempt, error, retryable, now)))

    async def mark_unknown(self, action_key: str, attempt: int, error: Any, *,
                           now: datetime | None = None) -> ReportOutcome:
        return ReportOutcome(await self._one("mark_action_unknown", self._unknown_params(
            action_key, attempt, error, now)))

    async def resolve(self, action_key: str, state: ActionState | str, *, result: Any = None,
                      error: Any = None, provider_reference: str | None = None,
                      note: str | None = None, now: datetime | None = None) -> ActionState:
        return ActionState(await self._one("resolve_action", self._resolve_params(
            action_key, state, result, error, provider_reference, note, now)))

    async def sweep(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        count: int = await self._one("sweep_expired_actions", self._sweep_params(limit, now))
        return count

    async def purge(self, older_than: Lease, *, limit: int = 10000,
                    now: datetime | None = None) -> int:
        count: int = await self._one("purge_actions", self._purge_params(older_than, limit, now))
        return count

    async def get(self, action_key: str) -> Action | None:
        rows = await self._source.execute(queries.get("get_action"), self._key(action_key))
        return Action.from_row(rows[0]) if rows else None

    async def attempts(self, action_key: str) -> list[Attempt]:
        rows = await self._source.execute(queries.get("list_attempts"), self._key(action_key))
        return [Attempt.from_row(r) for r in rows]
