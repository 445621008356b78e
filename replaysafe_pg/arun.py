"""``AsyncLedger.run`` / ``run_many``: the asyncio I/O shell of :mod:`replaysafe_pg.runner`.

Coroutine functions are awaited; plain functions run in a worker thread
(``asyncio.to_thread``) so heartbeats and other tasks keep going while they block.
Cancellation (``asyncio.CancelledError``) marks the attempt ``unknown`` and propagates.
Records are shielded: a cancellation arriving while the outcome is written does not lose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from replaysafe_pg import _tracing, runner
from replaysafe_pg._conn import AsyncSource, aexecute_on
from replaysafe_pg._heartbeat import AsyncHeartbeats
from replaysafe_pg.calls import LISTEN, UNLISTEN, Calls, Statement
from replaysafe_pg.errors import unavailable, wrap_errors
from replaysafe_pg.execution import Execution
from replaysafe_pg.models import Claim, ClaimOutcome
from replaysafe_pg.runner import Plan, Steps

T = TypeVar("T")


async def drive(steps: Steps[T], perform: Callable[[runner.Effect], Awaitable[Any]]) -> T:
    """See :func:`replaysafe_pg.run.drive`; ``perform`` is a coroutine function."""
    stepper = runner.Stepper(steps)
    while (effect := stepper.effect) is not None:
        try:
            value, error = await perform(effect), None
        except BaseException as exc:
            value, error = None, exc
        stepper.step(value, error)
    return stepper.result  # type: ignore[return-value]


async def _send_on(conn: Any, statement: Statement[T], alone: bool = False) -> T:
    return statement.decode(await aexecute_on(conn, statement.query, statement.params,
                                              alone=alone))


@contextlib.contextmanager
def _no_raw_errors() -> Iterator[None]:
    """See :func:`replaysafe_pg.run._no_raw_errors`."""
    try:
        yield
    except runner.RAW_ERRORS as exc:
        raise unavailable(exc) from exc


class _Listener:
    """See :class:`replaysafe_pg.run._Listener`."""

    def __init__(self, source: AsyncSource) -> None:
        self._source = source
        self._stack: contextlib.AsyncExitStack | None = None
        self.conn: Any = None

    async def open(self) -> None:
        await self.close()
        stack = contextlib.AsyncExitStack()
        try:
            with wrap_errors():
                conn = await stack.enter_async_context(self._source.dedicated())
            await _send_on(conn, LISTEN)
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self.conn = stack, conn

    async def close(self) -> None:
        stack, conn, self._stack, self.conn = self._stack, self.conn, None, None
        if stack is None:
            return
        async with stack:
            with contextlib.suppress(*runner.RETRY_ERRORS):
                if self._source.outlives(conn) and not conn.closed and not conn.broken:
                    await _send_on(conn, UNLISTEN)


class Runner:
    """Claims, runs and records for an ``AsyncLedger``."""

    def __init__(self, calls: Calls, source: AsyncSource) -> None:
        self._calls = calls
        self._source = source
        self._heartbeats = AsyncHeartbeats(source)

    async def _send(self, statement: Statement[T], alone: bool = False) -> T:
        return statement.decode(await self._source.execute(statement.query, statement.params,
                                                           alone=alone))

    async def _claim(self, statement: Statement[T], plan: Plan) -> T:
        return await drive(runner.claim_within_lease(statement, plan.lease_seconds,
                                                     self._source.can_reconnect), self._perform)

    async def run(self, plan: Plan) -> Execution:
        with _tracing.span(plan.operation) as span, _no_raw_errors():
            claim = await self._claim(plan.claim, plan)
            return runner.traced(span, await self._resolve(plan, claim))

    async def run_many(self, plans: list[Plan]) -> list[Execution]:
        if not plans:
            return []
        with _no_raw_errors():
            return await self._run_many(plans)

    async def _run_many(self, plans: list[Plan]) -> list[Execution]:
        claims = await self._claim(runner.claim_many(self._calls, plans), plans[0])
        out, work = runner.to_run(plans, claims)
        done = await asyncio.gather(*(self._resolve_traced(plans[i], claims[i]) for i in work),
                                    return_exceptions=True)
        for i, value in zip(work, done, strict=True):
            out[i] = value
        return runner.collected(out)

    async def _resolve_traced(self, plan: Plan, claim: Claim) -> Execution:
        with _tracing.span(plan.operation) as span:
            return runner.traced(span, await self._resolve(plan, claim))

    async def _resolve(self, plan: Plan, claim: Claim) -> Execution:
        if claim.outcome is ClaimOutcome.RUNNING and plan.wait_timeout > 0:
            claim = await self._wait(plan, claim)
        if claim.outcome is ClaimOutcome.CLAIMED:
            ticket = runner.heartbeat_ticket(self._calls, plan, claim)
            self._heartbeats.start(ticket)
            try:
                return await drive(runner.execute(self._calls, plan, claim, ticket),
                                   self._perform)
            finally:
                self._heartbeats.stop(ticket)
        return runner.answered(plan, claim)

    async def _wait(self, plan: Plan, claim: Claim) -> Claim:
        deadline = time.monotonic() + plan.wait_timeout
        listener = _Listener(self._source)
        try:
            return await drive(runner.wait(plan, claim, deadline, self._source.can_reconnect),
                               lambda effect: self._perform(effect, listener))
        finally:
            await listener.close()

    async def _perform(self, effect: runner.Effect, listener: _Listener | None = None) -> Any:
        match effect:
            case runner.Send(statement, alone):
                if listener is not None:
                    return await _send_on(listener.conn, statement, alone)
                return await self._send(statement, alone)
            case runner.Listen():
                assert listener is not None
                await listener.open()
                return None
            case runner.Sleep(seconds):
                await asyncio.sleep(seconds)
                return None
            case runner.RunTool(plan, kwargs):
                return await _call_within(plan, kwargs)
            case runner.Record(report, pending, ticket):
                steps = runner.record(self._calls, report, pending, ticket,
                                      self._source.can_reconnect)
                return await asyncio.shield(drive(steps, self._perform))
            case runner.Notified(key, seconds):
                assert listener is not None
                return await _await_notify(listener.conn, key, seconds)
        raise AssertionError(effect)


async def _await_notify(conn: Any, key: str, seconds: float) -> bool:
    with wrap_errors():
        notes = conn.notifies(timeout=seconds)
        try:
            async for note in notes:
                if note.channel == runner.CHANNEL and note.payload == key:
                    return True
        finally:
            await notes.aclose()
    return False


async def _call_within(plan: Plan, kwargs: dict[str, Any]) -> Any:
    if plan.timeout is None:
        return await _call(plan, kwargs)
    limit = asyncio.timeout(plan.timeout)
    try:
        async with limit:
            return await _call(plan, kwargs)
    except TimeoutError:
        if not limit.expired():
            raise  # the tool's own TimeoutError: an ordinary failure
        raise runner.ToolTimedOut from None


async def _call(plan: Plan, kwargs: dict[str, Any]) -> Any:
    if plan.is_async:
        return await plan.fn(**kwargs)
    result = await asyncio.to_thread(plan.fn, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result
