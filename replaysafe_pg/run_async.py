"""``AsyncLedger.run`` / ``run_many``: the asyncio I/O shell of :mod:`replaysafe_pg.run_policy`.

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

from replaysafe_pg import _tracing, run_policy
from replaysafe_pg._conn import AsyncSource
from replaysafe_pg._heartbeat import AsyncHeartbeats
from replaysafe_pg._listen import AsyncSubscription
from replaysafe_pg.errors import unavailable
from replaysafe_pg.execution import Execution
from replaysafe_pg.models import Claim, ClaimOutcome
from replaysafe_pg.run_policy import Plan, Steps
from replaysafe_pg.statements import Statement, Statements

T = TypeVar("T")


async def drive(steps: Steps[T], perform: Callable[[run_policy.Effect], Awaitable[Any]]) -> T:
    """See :func:`replaysafe_pg.run_sync.drive`; ``perform`` is a coroutine function."""
    stepper = run_policy.Stepper(steps)
    while (effect := stepper.effect) is not None:
        try:
            value, error = await perform(effect), None
        except BaseException as exc:
            value, error = None, exc
        stepper.step(value, error)
    return stepper.result  # type: ignore[return-value]


@contextlib.contextmanager
def _no_raw_errors() -> Iterator[None]:
    """See :func:`replaysafe_pg.run_sync._no_raw_errors`."""
    try:
        yield
    except run_policy.RAW_ERRORS as exc:
        raise unavailable(exc) from exc


class AsyncRunner:
    """Claims, runs and records for an ``AsyncLedger``."""

    def __init__(self, sql: Statements, source: AsyncSource) -> None:
        self._sql = sql
        self._source = source
        self._heartbeats = AsyncHeartbeats(source)

    async def _send(self, statement: Statement[T], alone: bool = False) -> T:
        return statement.decode(await self._source.execute(statement.query, statement.params,
                                                           alone=alone))

    async def _claim(self, statement: Statement[T], plan: Plan) -> T:
        steps = run_policy.claim_within_lease(statement, plan.lease_seconds,
                                              self._source.can_reconnect)
        return await drive(steps, self._perform)

    async def run(self, plan: Plan) -> Execution:
        with _tracing.span(plan.operation, plan.key) as call, _no_raw_errors():
            claim = await self._claim(run_policy.claim_one(self._sql, plan), plan)
            return run_policy.traced(call, await self._resolve(plan, claim))

    async def run_many(self, plans: list[Plan]) -> list[Execution]:
        if not plans:
            return []
        # As the sync Runner: a span per call, from before the claim.
        calls = _tracing.calls([(p.operation, p.key) for p in plans])
        with _tracing.ending(calls), _no_raw_errors():
            return await self._run_many(plans, calls)

    async def _run_many(self, plans: list[Plan], calls: list[_tracing.NoCall]) -> list[Execution]:
        claims = await self._claim(run_policy.claim_many(self._sql, plans), plans[0])
        out, work = run_policy.to_run(plans, claims)
        for i, answer in enumerate(out):
            if isinstance(answer, Execution):  # answered by the claim: a replay, unknown, ...
                run_policy.traced(calls[i], answer)
                calls[i].end()
        done = await asyncio.gather(*(self._resolve_traced(plans[i], claims[i], calls[i])
                                      for i in work), return_exceptions=True)
        for i, value in zip(work, done, strict=True):
            out[i] = value
        return run_policy.collected(out)

    async def _resolve_traced(self, plan: Plan, claim: Claim, call: _tracing.NoCall) -> Execution:
        try:
            with call.current():
                return run_policy.traced(call, await self._resolve(plan, claim))
        finally:
            call.end()

    async def _resolve(self, plan: Plan, claim: Claim) -> Execution:
        aside = False  # as the sync Runner: a waiter's claim is recorded beside the caller's
        if claim.outcome is ClaimOutcome.RUNNING and plan.wait_timeout > 0:
            claim, aside = await self._wait(plan, claim), True
        if claim.outcome is ClaimOutcome.CLAIMED:
            ticket = run_policy.heartbeat_ticket(self._sql, plan, claim)
            self._heartbeats.start(ticket)
            try:
                return await drive(run_policy.execute(self._sql, plan, claim, ticket),
                                   lambda effect: self._perform(effect, aside=aside))
            finally:
                self._heartbeats.stop(ticket)
        return run_policy.answered(plan, claim)

    async def _wait(self, plan: Plan, claim: Claim) -> Claim:
        deadline = time.monotonic() + plan.wait_timeout
        subscription = AsyncSubscription(await self._source.listener())
        try:
            steps = run_policy.wait(self._sql, plan, claim, deadline, self._source.can_reconnect)
            return await drive(steps, lambda effect: self._perform(effect, subscription, aside=True))
        finally:
            subscription.drop()

    async def _perform(self, effect: run_policy.Effect,
                       subscription: AsyncSubscription | None = None, *,
                       aside: bool = False) -> Any:
        match effect:
            case run_policy.Send(statement, alone):
                if aside:  # see Runner._perform of replaysafe_pg.run_sync
                    return statement.decode(await self._source.execute_aside(
                        statement.query, statement.params, alone=alone))
                return await self._send(statement, alone)
            case run_policy.Listen(key):
                assert subscription is not None
                await subscription.subscribe(key)
                return None
            case run_policy.Notified(seconds):
                assert subscription is not None
                await subscription.wait(seconds)
                return None
            case run_policy.Sleep(seconds):
                await asyncio.sleep(seconds)
                return None
            case run_policy.RunTool(plan, kwargs):
                return await _call_within(plan, kwargs)
            case run_policy.Record(report, pending, ticket):
                steps = run_policy.record(self._sql, report, pending, ticket,
                                          self._source.can_reconnect)
                return await asyncio.shield(
                    drive(steps, lambda effect: self._perform(effect, aside=aside)))
        raise AssertionError(effect)


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
        raise run_policy.ToolTimedOut from None


async def _call(plan: Plan, kwargs: dict[str, Any]) -> Any:
    if plan.is_async:
        return await plan.fn(**kwargs)
    result = await asyncio.to_thread(plan.fn, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result
