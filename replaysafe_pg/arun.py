"""``AsyncLedger.run`` / ``run_many``: the steps of ``run.py`` on asyncio.

Coroutine functions are awaited; plain functions run in a worker thread
(``asyncio.to_thread``) so heartbeats and other tasks keep going while they block.
Cancellation (``asyncio.CancelledError``) marks the attempt ``unknown`` and propagates.
Records are shielded: a cancellation arriving while the outcome is written does not lose it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from replaysafe_pg import _tracing, queries
from replaysafe_pg._conn import aexecute_on
from replaysafe_pg._heartbeat import RETRY_ERRORS, Ticket, lease_lost_warning
from replaysafe_pg.errors import (
    InvalidArgument,
    LeaseLost,
    OutcomeNotRecorded,
    UnstorableResult,
    wrap_errors,
)
from replaysafe_pg.execution import (
    Execution,
    ExecutionStatus,
    dump_result,
    error_of,
    is_retryable,
    tool_kwargs,
)
from replaysafe_pg.models import Claim, ClaimOutcome, ReportOutcome
from replaysafe_pg.run import (
    CHANNEL,
    RECORD_RETRY_DELAYS,
    Plan,
    Report,
    WaitClock,
    answered,
    claim_many_params,
    finish,
    not_recorded,
    started,
    timeout_error,
)

if TYPE_CHECKING:
    from replaysafe_pg.ledger import AsyncLedger

log = logging.getLogger("replaysafe_pg.run")


async def run(ledger: AsyncLedger, plan: Plan) -> Execution:
    with _tracing.span(plan.operation) as span:
        query = queries.get("claim_action", plan.claim_params)
        rows = await ledger._source.execute(query, plan.claim_params, alone=True)
        execution = await resolve(ledger, plan, Claim.from_row(rows[0]))
        span.set(idempotency_key=execution.idempotency_key, status=str(execution.status),
                 replay=execution.replay, attempt=execution.attempt)
        return execution


async def resolve_traced(ledger: AsyncLedger, plan: Plan, claim: Claim) -> Execution:
    with _tracing.span(plan.operation) as span:
        execution = await resolve(ledger, plan, claim)
        span.set(idempotency_key=execution.idempotency_key, status=str(execution.status),
                 replay=execution.replay, attempt=execution.attempt)
        return execution


async def run_many(ledger: AsyncLedger, plans: list[Plan]) -> list[Execution]:
    if not plans:
        return []
    params = claim_many_params(ledger, plans)
    rows = await ledger._source.execute(queries.get("claim_actions", params), params,
                                        alone=True)
    claims = [Claim.from_row(r) for r in rows]
    out: list[Execution | BaseException | None] = [None] * len(plans)
    work = []
    for i, (plan, claim) in enumerate(zip(plans, claims, strict=True)):
        if claim.outcome in (ClaimOutcome.CLAIMED, ClaimOutcome.RUNNING):
            work.append(i)
        else:
            out[i] = answered(plan, claim)
    done = await asyncio.gather(*(resolve_traced(ledger, plans[i], claims[i]) for i in work),
                                return_exceptions=True)
    for i, value in zip(work, done, strict=True):
        out[i] = value
    for item in out:
        if isinstance(item, BaseException):
            raise item  # every other call has finished and is recorded
    return [e for e in out if isinstance(e, Execution)]


async def resolve(ledger: AsyncLedger, plan: Plan, claim: Claim) -> Execution:
    if claim.outcome is ClaimOutcome.RUNNING:
        claim = await wait(ledger, plan, claim)
    if claim.outcome is ClaimOutcome.CLAIMED:
        return await execute(ledger, plan, claim)
    return answered(plan, claim)


async def wait(ledger: AsyncLedger, plan: Plan, claim: Claim) -> Claim:
    if plan.wait_timeout <= 0:
        return claim
    deadline = time.monotonic() + plan.wait_timeout
    source = ledger._source
    async with source.dedicated() as conn:
        await aexecute_on(conn, queries.get("listen_actions"))
        try:
            clock = WaitClock()
            query = queries.get("claim_action", plan.claim_params)
            while True:
                rows = await aexecute_on(conn, query, plan.claim_params, alone=True)
                claim = Claim.from_row(rows[0])
                remaining = deadline - time.monotonic()
                if claim.outcome is not ClaimOutcome.RUNNING or remaining <= 0:
                    return claim
                await _await_notify(conn, claim.idempotency_key, clock.seconds(claim, remaining))
        finally:
            if source.outlives(conn) and not conn.closed and not conn.broken:
                await aexecute_on(conn, queries.get("unlisten_actions"))


async def _await_notify(conn: Any, key: str, seconds: float) -> bool:
    with wrap_errors():
        notes = conn.notifies(timeout=seconds)
        try:
            async for note in notes:
                if note.channel == CHANNEL and note.payload == key:
                    return True
        finally:
            await notes.aclose()
    return False


async def _heartbeat(ledger: AsyncLedger, plan: Plan, ticket: Ticket) -> None:
    """Extend the lease every third of it, on a connection opened only once one is due."""
    await asyncio.sleep(ticket.interval)
    while True:
        try:
            query = queries.get("heartbeat_action", ticket.params)
            async with ledger._source.dedicated() as conn:
                while True:
                    await aexecute_on(conn, query, ticket.params)
                    await asyncio.sleep(ticket.interval)
        except LeaseLost:
            ticket.lease_lost = True
            if not ticket.recording:
                lease_lost_warning(plan.key, ticket.attempt, "heartbeat refused")
            return
        except RETRY_ERRORS as exc:
            log.warning("heartbeat for action %r (attempt %d) failed, retrying: %s",
                        plan.key, ticket.attempt, exc)
            await asyncio.sleep(ticket.interval / 2)
        except Exception:
            # As the sync heartbeat does: never die silently while the tool still runs.
            log.exception("heartbeat for action %r (attempt %d) failed", plan.key, ticket.attempt)
            await asyncio.sleep(ticket.interval / 2)


def _consume(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("heartbeat task failed", exc_info=task.exception())


async def execute(ledger: AsyncLedger, plan: Plan, claim: Claim) -> Execution:
    ticket = Ticket(plan.key, claim.attempt,
                    ledger._heartbeat_params(plan.key, claim.attempt, plan.claim_params["lease"], None),
                    plan.lease_seconds / 3)
    beat = asyncio.create_task(_heartbeat(ledger, plan, ticket))
    try:
        return await _execute(ledger, plan, claim, ticket)
    finally:
        ticket.done = True
        beat.cancel()
        beat.add_done_callback(_consume)


async def _call(plan: Plan, kwargs: dict[str, Any]) -> Any:
    if plan.is_async:
        return await plan.fn(**kwargs)
    result = await asyncio.to_thread(plan.fn, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _execute(ledger: AsyncLedger, plan: Plan, claim: Claim, ticket: Ticket) -> Execution:
    attempt = claim.attempt
    kwargs = tool_kwargs(plan.args, plan.fn, claim.idempotency_key)
    timed_out = False
    try:
        if plan.timeout is None:
            result = await _call(plan, kwargs)
        else:
            limit = asyncio.timeout(plan.timeout)
            try:
                async with limit:
                    result = await _call(plan, kwargs)
            except TimeoutError:
                if not limit.expired():
                    raise  # the tool's own TimeoutError: an ordinary failure
                timed_out = True
    except Exception as exc:
        retry = is_retryable(exc, plan.retryable)
        error = error_of(exc)
        pending = started(plan, claim, ExecutionStatus.FAILED, error=error, retryable=retry,
                          exception=exc)
        return finish(pending, ticket.lease_lost, await record(
            ledger, ticket, Report.failure(ledger, plan, attempt, error, retry), pending))
    except BaseException as exc:
        # CancelledError, KeyboardInterrupt: the tool may have acted; never leave it "running".
        error = error_of(exc, reason="cancelled" if isinstance(exc, asyncio.CancelledError)
                         else "interrupted")
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error, exception=exc)
        with contextlib.suppress(OutcomeNotRecorded, asyncio.CancelledError):
            await record(ledger, ticket, Report.unknown(ledger, plan, attempt, error), pending)
        raise
    if timed_out:
        error = timeout_error(plan)
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error)
        return finish(pending, ticket.lease_lost, await record(
            ledger, ticket, Report.unknown(ledger, plan, attempt, error), pending))
    pending = started(plan, claim, ExecutionStatus.SUCCEEDED, result=result)
    try:
        text = dump_result(result, plan.key, ledger.max_result_bytes)
        outcome = await record(ledger, ticket, Report.success(ledger, plan, attempt, text), pending)
    except (UnstorableResult, InvalidArgument) as exc:
        unstorable = exc if isinstance(exc, UnstorableResult) else UnstorableResult(
            f"the result of action {plan.key!r} was refused by the database: {exc}",
            action_key=plan.key, result=result)
        error = {"reason": "unstorable_result", "message": str(unstorable)}
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error)
        await record(ledger, ticket, Report.unknown(ledger, plan, attempt, error), pending)
        raise unstorable from None
    return finish(pending, ticket.lease_lost, outcome)


async def record(ledger: AsyncLedger, ticket: Ticket, report: Report,
                 pending: Execution) -> ReportOutcome:
    """See :func:`replaysafe_pg.run.record`; shielded from cancellation of the caller."""
    ticket.recording = True
    return await asyncio.shield(_record(ledger, report, pending))


async def _record(ledger: AsyncLedger, report: Report, pending: Execution) -> ReportOutcome:
    source = ledger._source
    query = queries.get(report.name, report.params)
    last: BaseException | None = None
    for delay in (0.0, *RECORD_RETRY_DELAYS):
        if delay:
            if not source.can_reconnect:
                break
            await asyncio.sleep(delay)
            try:
                attempts = await ledger.attempts(pending.action_key)
            except RETRY_ERRORS as exc:
                last = exc
                continue
            if report.landed(attempts, pending.attempt):
                return ReportOutcome.RECORDED
        try:
            return ReportOutcome((await source.execute(query, report.params))[0][0])
        except RETRY_ERRORS as exc:
            last = exc
            log.warning("recording the outcome of action %r (attempt %d) failed, retrying on a "
                        "fresh connection: %s", pending.action_key, pending.attempt, exc)
    raise not_recorded(pending, last)
