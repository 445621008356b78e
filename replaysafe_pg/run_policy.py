"""What ``run`` decides, written once for the sync and async flavours; no I/O here.

Round trips: a first call costs two (claim, record), a replay one. Heartbeats are sent
only for tools that run longer than a third of their lease; waiting costs one claim per
wake-up (a NOTIFY on the ledger's one LISTEN session, or at the latest every second).

Connection errors are ridden out for as long as the lease asked for (docs/run.md, "When the
database goes away"): the claim is sent again with the call's claim token, the record
again after checking whether it had landed, a waiter's claim again until its deadline.

The steps that send something are generators: they yield an effect (:class:`Send`,
:class:`Sleep`, :class:`RunTool`, :class:`Record`, :class:`Notified`) and get its answer
back, or its exception thrown in. The I/O shells (``run_sync.py`` with threads, ``run_async.py`` on
asyncio) perform the effects; the plan, the reports, the retry schedule and the wait clock
live here only.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeAlias, TypeVar

import psycopg

from replaysafe_pg import _args, _json
from replaysafe_pg._json import TooLong
from replaysafe_pg._listen import POLL_INTERVAL
from replaysafe_pg._tool import (
    dump_error,
    dump_result,
    error_of,
    is_retryable,
    tool_info,
    tool_kwargs,
    unstorable,
    unstorable_error,
)
from replaysafe_pg.errors import (
    DatabaseUnavailable,
    InvalidArgument,
    LoginRefused,
    OutcomeNotRecorded,
    UnstorableResult,
    unavailable,
)
from replaysafe_pg.execution import Call, Encoder, Execution, ExecutionStatus, Retryable, as_call
from replaysafe_pg.models import ActionState, Attempt, Claim, ClaimOutcome, ReportOutcome
from replaysafe_pg.statements import Encoded, Lease, Statement, Statements, result_too_large

log = logging.getLogger("replaysafe_pg.run")

T = TypeVar("T")

DEFAULT_WAIT_TIMEOUT = 30.0
# A statement that failed on these is tried again on a fresh connection (the driver's own
# errors are DatabaseUnavailable; the raw ones can only come from a caller's connection).
RAW_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)
RETRY_ERRORS = (DatabaseUnavailable, *RAW_ERRORS)
# Backoff between tries after a connection error: doubling from the first, at most the last.
RETRY_FIRST_DELAY = 0.05
RETRY_MAX_DELAY = 1.0
# A waiter claims again at the lease's end; if the lease looks over but the owner's claim
# still answers "running" (clock skew), it backs off from this, doubling up to a second.
MIN_RECLAIM_WAIT = 0.05
# A waiter claims again at most this often (seconds), however many wake-ups arrive.
MIN_CLAIM_GAP = 0.1


# --- the plan ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Plan:
    """One call, validated before anything is claimed: what its claim sends (built from
    these fields by :func:`claim_one` and :func:`claim_many` where it is sent) and how the
    shell runs the tool."""

    operation: str
    fn: Callable[..., Any]
    args: dict[str, Any]
    key: str
    request: Encoded  # the args' JSON object, checked against the request's size limit
    lease: timedelta
    thread_id: str | None
    on_expired: str
    # A fresh token per call: a claim whose answer is lost is asked for again with it.
    claim_token: str
    wait_timeout: float
    timeout: float | None
    retryable: Retryable
    is_async: bool  # the tool is a coroutine function
    can_await: bool  # the async flavour: it awaits what the tool returns
    encoder: Encoder | None  # None: the default (pydantic-core)

    @property
    def lease_seconds(self) -> float:
        return self.lease.total_seconds()


def make_plan(sql: Statements, operation: str, fn: Callable[..., Any], args: dict[str, Any],
              key: str, *, thread_id: str | None, lease: Lease, on_expired: str,
              wait_timeout: float, timeout: float | None, retryable: Retryable,
              can_await: bool, encoder: Encoder | None) -> Plan:
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, got {type(fn).__name__}")
    is_async = tool_info(fn).is_async
    if is_async and not can_await:
        raise InvalidArgument(
            f"fn {getattr(fn, '__qualname__', fn)!r} is a coroutine function: a sync Ledger "
            "cannot await it; use AsyncLedger.run")
    # Serialising the request validates args: strict JSON (the request's fingerprint), a
    # JSON object within the request's size limits, nothing written otherwise.
    request = Encoded(_json.dumps_object(args, "args", "request", sql.limits))
    token = new_claim_token()
    # Built only to check what the claim will send (key, operation, ids, lease); each send
    # builds it again from the plan (claim_one).
    sql.claim(key, operation, request, lease, thread_id, on_expired, None, token)
    if not all(isinstance(name, str) for name in args):
        raise InvalidArgument("args must have string keys (they are passed as keyword arguments)")
    if _args.seconds(wait_timeout, "wait_timeout") < 0:
        raise InvalidArgument("wait_timeout must be a number of seconds >= 0")
    if timeout is not None and _args.seconds(timeout, "timeout") <= 0:
        raise InvalidArgument("timeout must be None or a positive number of seconds")
    if not (retryable is None or callable(retryable) or isinstance(retryable, tuple)):
        raise InvalidArgument("retryable must be an exception type, a tuple of them, or a predicate")
    if encoder is not None and not callable(encoder):
        raise InvalidArgument(f"encoder must be None or callable, got {type(encoder).__name__}")
    return Plan(operation, fn, args, key, request, _args.lease(lease), thread_id, on_expired,
                token, float(wait_timeout), None if timeout is None else float(timeout),
                retryable, is_async, can_await, encoder)


CallSpec = Call | tuple[str, Callable[..., Any], dict[str, Any], str]


def make_plans(sql: Statements, specs: Sequence[CallSpec], **options: Any) -> list[Plan]:
    plans = [make_plan(sql, c.operation, c.fn, c.args, c.key, **options)
             for c in map(as_call, specs)]
    if len({p.key for p in plans}) != len(plans):
        raise InvalidArgument("run_many: every call needs its own key")
    return plans


def new_claim_token() -> str:
    return secrets.token_hex(16)


def claim_one(sql: Statements, plan: Plan) -> Statement[Claim]:
    """The plan's claim, with its claim token (sent again as is after a lost answer)."""
    return sql.claim(plan.key, plan.operation, plan.request, plan.lease, plan.thread_id,
                     plan.on_expired, None, plan.claim_token)


def claim_many(sql: Statements, plans: list[Plan]) -> Statement[list[Claim]]:
    """One claim for every plan (their requests already serialised by :func:`make_plan`),
    each with its plan's claim token; lease, thread and on_expired are the first plan's
    (``run_many`` gives every plan the same)."""
    first = plans[0]
    return sql.claim_many([(p.key, p.operation, p.request) for p in plans], first.lease,
                          first.thread_id, first.on_expired, None,
                          [p.claim_token for p in plans])


def to_run(plans: list[Plan], claims: list[Claim]) -> tuple[list[Execution | BaseException | None],
                                                            list[int]]:
    """``run_many``: the answers known from the claims, and the indexes still to resolve."""
    out: list[Execution | BaseException | None] = [None] * len(plans)
    work = []
    for i, (plan, claim) in enumerate(zip(plans, claims, strict=True)):
        if claim.outcome in (ClaimOutcome.CLAIMED, ClaimOutcome.RUNNING):
            work.append(i)
        else:
            out[i] = answered(plan, claim)
    return out, work


def collected(out: list[Execution | BaseException | None]) -> list[Execution]:
    for item in out:
        if isinstance(item, BaseException):
            raise item  # every other call has finished and is recorded
    return [e for e in out if isinstance(e, Execution)]


# --- what an execution says ----------------------------------------------------------------

def answered(plan: Plan, claim: Claim) -> Execution:
    """The Execution for a claim that did not hand us the action (replay, unknown, running)."""
    if claim.outcome is ClaimOutcome.REPLAY:
        status = (ExecutionStatus.SUCCEEDED if claim.state is ActionState.SUCCEEDED
                  else ExecutionStatus.FAILED)
    elif claim.outcome is ClaimOutcome.UNKNOWN:
        status = ExecutionStatus.UNKNOWN
    else:
        status = ExecutionStatus.RUNNING
    return Execution(status, claim.result, claim.error, status is not ExecutionStatus.RUNNING,
                     claim.attempt, claim.idempotency_key, plan.key, plan.operation,
                     provider_reference=claim.provider_reference)


def started(plan: Plan, claim: Claim, status: ExecutionStatus, *, result: Any = None,
            error: Any = None, retryable: bool = False,
            exception: BaseException | None = None) -> Execution:
    return Execution(status, result, error, False, claim.attempt, claim.idempotency_key, plan.key,
                     plan.operation, retryable=retryable, exception=exception)


def traced(call: Any, execution: Execution) -> Execution:
    """Puts the outcome on the call's span and metrics (``_tracing``; a no-op without them)."""
    call.set(idempotency_key=execution.idempotency_key, outcome=str(execution.status),
             replay=execution.replay, attempt=execution.attempt, error=execution.error)
    return execution


def lease_lost_warning(action_key: str, attempt: int, how: str) -> None:
    log.warning("attempt %d of action %r lost its lease (%s): another attempt may run or may have "
                "run it; this attempt's report cannot overwrite that outcome", attempt, action_key, how)


def finish(execution: Execution, ticket_lost: bool, outcome: ReportOutcome) -> Execution:
    execution.outcome = outcome
    if outcome is not ReportOutcome.RECORDED:
        if not ticket_lost:
            lease_lost_warning(execution.action_key, execution.attempt, f"its report was {outcome}")
        execution.lease_lost = True
    elif ticket_lost:
        execution.lease_lost = True
    return execution


def timeout_error(plan: Plan) -> dict[str, Any]:
    return {"reason": "timeout", "timeout_seconds": plan.timeout,
            "message": f"the tool did not return within {plan.timeout} s; it may still be running "
                       "and its effect may have happened"}


def unawaited_error(result: Any) -> InvalidArgument:
    if inspect.iscoroutine(result):
        result.close()  # it never started: nothing of it ran
    return InvalidArgument("fn returned an awaitable, which a sync Ledger cannot await: "
                           "use AsyncLedger.run (the action was marked retryable: nothing ran)")


def not_recorded(pending: Execution, last: BaseException | None) -> OutcomeNotRecorded:
    log.error("could not record the outcome (%s) of action %r, attempt %d: %s. The action stays "
              "running until its lease runs out, then becomes unknown (or retryable if it was "
              "claimed with on_expired='reclaim')", pending.status, pending.action_key,
              pending.attempt, last)
    return OutcomeNotRecorded(
        f"the outcome of action {pending.action_key!r} (attempt {pending.attempt}) could not be "
        f"recorded: {last}", execution=pending)


class Report:
    """One record to write: the report's statement, the state it sets and the JSON text it
    carries (the result, or the error)."""

    __slots__ = ("sent", "state", "statement")

    def __init__(self, statement: Statement[ReportOutcome], state: ActionState,
                 sent: str) -> None:
        self.statement = statement
        self.state = state
        self.sent = sent

    def landed(self, attempts: list[Attempt], attempt: int) -> bool:
        """Did this very report commit although its answer was lost? Only if the attempt's
        row shows our outcome with the value we sent, and the report reached the action
        (a sweep also leaves an "unknown" outcome, with an error of its own)."""
        row = next((a for a in attempts if a.attempt == attempt), None)
        if row is None or row.outcome != self.state or row.superseded:
            return False
        stored = row.result if self.state == ActionState.SUCCEEDED else row.error
        return bool(stored == _json.loads(self.sent))

    @classmethod
    def success(cls, sql: Statements, claim: Claim, text: str) -> Report:
        return cls(sql.complete(claim, Encoded(text), None, None), ActionState.SUCCEEDED, text)

    @classmethod
    def failure(cls, sql: Statements, claim: Claim, error: dict[str, Any],
                retryable: bool) -> Report:
        text = dump_error(error)
        return cls(sql.fail(claim, Encoded(text), retryable, None),
                   ActionState.RETRYABLE if retryable else ActionState.FAILED, text)

    @classmethod
    def unknown(cls, sql: Statements, claim: Claim, error: dict[str, Any]) -> Report:
        text = dump_error(error)
        return cls(sql.mark_unknown(claim, Encoded(text), None), ActionState.UNKNOWN, text)


class WaitClock:
    """How long a waiter sleeps before claiming again: until the owner's lease ends (a
    NOTIFY may wake it sooner). If the lease looks over but the claim still answers
    "running" (clock skew), back off from MIN_RECLAIM_WAIT, doubling up to a second."""

    def __init__(self) -> None:
        self.floor = MIN_RECLAIM_WAIT
        self.last_expiry: datetime | None = None

    def seconds(self, claim: Claim, remaining: float) -> float:
        assert claim.lease_expires_at is not None
        if claim.lease_expires_at == self.last_expiry:
            self.floor = min(self.floor * 2, 1.0)
        else:
            self.floor, self.last_expiry = MIN_RECLAIM_WAIT, claim.lease_expires_at
        until_expiry = (claim.lease_expires_at - datetime.now(UTC)).total_seconds()
        return min(remaining, max(until_expiry, self.floor))


# --- effects: what a step asks its shell to do ------------------------------------------

@dataclass(frozen=True, slots=True)
class Send:
    """Send a statement; the answer is its decoded value."""

    statement: Statement[Any]
    alone: bool = False


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class RunTool:
    """Call the tool; its result, or what it raised, or :class:`ToolTimedOut`."""

    plan: Plan
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Record:
    """Write a report (:func:`record`); the async shell shields it from cancellation."""

    report: Report
    pending: Execution
    ticket: Ticket


@dataclass(frozen=True, slots=True)
class Listen:
    """Subscribe the waiter to the key's NOTIFY (the ledger's LISTEN session listens before
    this returns, when it can), dropping its earlier subscription."""

    key: str


@dataclass(frozen=True, slots=True)
class Notified:
    """Wait for the subscribed key's NOTIFY, at most ``seconds``."""

    seconds: float


Effect: TypeAlias = Send | Sleep | RunTool | Record | Notified | Listen
Steps: TypeAlias = Generator[Effect, Any, T]


class Stepper(Generic[T]):
    """Steps being run by a shell: ``effect`` is the next effect to perform (None once the
    steps have ended, with ``result``); the shell hands back its answer or its exception."""

    __slots__ = ("_steps", "effect", "result")

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self.effect: Effect | None = None
        self.result: T | None = None
        self.step(None, None)

    def step(self, value: Any, error: BaseException | None) -> None:
        """Answer the last effect with ``value``, or throw ``error`` in where it was yielded
        (outside the shell's ``except``, so the steps see no exception being handled)."""
        try:
            self.effect = self._steps.send(value) if error is None else self._steps.throw(error)
        except StopIteration as stop:
            self.effect, self.result = None, stop.value


class ToolTimedOut(Exception):
    """The tool did not return within ``plan.timeout`` (raised by a shell's RunTool)."""


class Ticket:
    """One running attempt. ``lease_lost`` is set when a heartbeat finds the lease gone."""

    __slots__ = ("action_key", "attempt", "done", "first_beat", "heartbeat", "interval",
                 "lease_end", "lease_lost", "lease_seconds", "recording")

    def __init__(self, action_key: str, attempt: int, heartbeat: Statement[datetime],
                 lease_seconds: float, left: float | None = None) -> None:
        self.action_key = action_key
        self.attempt = attempt
        self.heartbeat = heartbeat
        self.lease_seconds = lease_seconds
        self.interval = lease_seconds / 3
        # Until when records are retried (time.monotonic()): the lease from the claim, moved
        # on by every heartbeat that was answered. Later than the true end at worst, and a
        # record that lands late still settles the action ("late").
        self.lease_end = time.monotonic() + lease_seconds
        # A claim answered again by its token (after a lost answer) holds a lease that began
        # earlier: the first heartbeat comes before the lease's remaining half is gone.
        left = lease_seconds if left is None else max(0.0, min(left, lease_seconds))
        self.first_beat = min(self.interval, left / 2)
        self.done = False
        # While the outcome is being written a lost lease is reported by the write itself.
        self.recording = False
        self.lease_lost = False

    def extended(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (time.monotonic()) was answered."""
        self.lease_end = max(self.lease_end, sent_at + self.lease_seconds)

    @property
    def retry_delay(self) -> float:
        """How soon a heartbeat that failed on a connection error is tried again."""
        return min(self.interval / 2, RETRY_MAX_DELAY)


def heartbeat_ticket(sql: Statements, plan: Plan, claim: Claim) -> Ticket:
    left = None
    if claim.lease_expires_at is not None:
        # The server's clock against ours: skew only moves the first heartbeat earlier (a
        # lease longer than asked is not believed).
        left = (claim.lease_expires_at - datetime.now(UTC)).total_seconds()
    return Ticket(plan.key, claim.attempt, sql.heartbeat(claim, plan.lease, None),
                  plan.lease_seconds, left)


# --- the steps ---------------------------------------------------------------------------

class Backoff:
    """Tries after connection errors until ``deadline`` (time.monotonic()): each failure waits
    a little longer, doubling from RETRY_FIRST_DELAY up to RETRY_MAX_DELAY."""

    __slots__ = ("deadline", "delay")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.delay = RETRY_FIRST_DELAY

    def next_delay(self) -> float | None:
        """Seconds to sleep before the next try, or None once the deadline would pass."""
        delay, self.delay = self.delay, min(self.delay * 2, RETRY_MAX_DELAY)
        left = self.deadline - time.monotonic()
        return None if left <= 0 else min(delay, left)


def claim_within_lease(statement: Statement[T], lease_seconds: float,
                       can_reconnect: bool) -> Steps[T]:
    """Send a claim (``claim_action`` or ``claim_actions``, with their claim tokens); after a
    connection error, send it again on a fresh connection for as long as the lease asked for.
    Its answer may have been lost after the commit: the token then answers "claimed" with the
    same attempt, which otherwise would look "running" under our own lease."""
    backoff = Backoff(time.monotonic() + lease_seconds)
    while True:
        try:
            answer: T = yield Send(statement, alone=True)
            return answer
        except RETRY_ERRORS as exc:
            delay = backoff.next_delay() if _retryable(exc, can_reconnect) else None
            if delay is None:
                raise as_unavailable(exc) from exc.__cause__ or exc
            log.warning("claiming failed, claiming again with the same token in %.2f s: %s",
                        delay, exc)
        yield Sleep(delay)


def _retryable(exc: BaseException, can_reconnect: bool) -> bool:
    """May a statement that failed on ``exc`` be sent again on a fresh connection?"""
    return can_reconnect and not isinstance(exc, LoginRefused)


def as_unavailable(exc: BaseException) -> BaseException:
    """What reaches the caller of ``run`` for a connection error: never a raw psycopg one."""
    return exc if isinstance(exc, DatabaseUnavailable) else unavailable(exc)


def wait(sql: Statements, plan: Plan, claim: Claim, deadline: float,
         can_reconnect: bool) -> Steps[Claim]:
    """The wake-ups of docs/sql-ledger.md: subscribe to the key's NOTIFY, claim again, wait
    for the NOTIFY, the lease's end or POLL_INTERVAL, whichever comes first, until the claim
    is no longer "running" or ``deadline``. The claims borrow a connection each, so a waiter
    holds none the owner needs. A claim that fails on a connection error is sent again
    (backing off) until ``deadline``."""
    clock = WaitClock()
    backoff = Backoff(deadline)
    claimed_at = time.monotonic()
    while True:
        try:
            yield Listen(claim.idempotency_key)
            # Wake-ups are anyone's NOTIFY: however many arrive, claim at most this often.
            if (gap := MIN_CLAIM_GAP - (time.monotonic() - claimed_at)) > 0:
                yield Sleep(gap)
            claimed_at = time.monotonic()
            claim = yield Send(claim_one(sql, plan), alone=True)
            backoff = Backoff(deadline)
            remaining = deadline - time.monotonic()
            if claim.outcome is not ClaimOutcome.RUNNING or remaining <= 0:
                return claim
            yield Notified(min(clock.seconds(claim, remaining), POLL_INTERVAL))
            continue
        except RETRY_ERRORS as exc:
            delay = backoff.next_delay() if _retryable(exc, can_reconnect) else None
            if delay is None:
                raise as_unavailable(exc) from exc.__cause__ or exc
            log.warning("waiting for action %r: claiming again failed, again in %.2f s: %s",
                        plan.key, delay, exc)
        yield Sleep(delay)


def execute(sql: Statements, plan: Plan, claim: Claim, ticket: Ticket) -> Steps[Execution]:
    """Run the claimed tool and record its outcome."""
    kwargs = tool_kwargs(plan.args, plan.fn, claim.idempotency_key)
    try:
        result = yield RunTool(plan, kwargs)
    except ToolTimedOut:
        error = timeout_error(plan)
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error)
        lost = ticket.lease_lost
        return finish(pending, lost, (yield from _record(
            ticket, Report.unknown(sql, claim, error), pending)))
    except Exception as exc:
        retry = is_retryable(exc, plan.retryable)
        error = error_of(exc)
        pending = started(plan, claim, ExecutionStatus.FAILED, error=error, retryable=retry,
                          exception=exc)
        lost = ticket.lease_lost
        return finish(pending, lost, (yield from _record(
            ticket, Report.failure(sql, claim, error, retry), pending)))
    except BaseException as exc:
        # KeyboardInterrupt, SystemExit, a cancelled task: the tool may have acted; never
        # leave it "running".
        cancelled = plan.can_await and isinstance(exc, asyncio.CancelledError)
        error = error_of(exc, reason="cancelled" if cancelled else "interrupted")
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error, exception=exc)
        # Logged; the interruption matters more.
        with contextlib.suppress(OutcomeNotRecorded, asyncio.CancelledError):
            yield from _record(ticket, Report.unknown(sql, claim, error), pending)
        raise
    if not plan.can_await and inspect.isawaitable(result):
        problem = unawaited_error(result)
        error = error_of(problem, reason="unawaited")
        pending = started(plan, claim, ExecutionStatus.FAILED, error=error, retryable=True)
        yield from _record(ticket, Report.failure(sql, claim, error, True), pending)
        raise problem
    try:
        # The result returned is the one a replay reads back (docs/run.md).
        text, stored = dump_result(result, plan.key, sql.limits, plan.encoder)
    except TooLong as exc:
        # The effect happened and its result is over the limit: the action is recorded
        # unknown (to be reconciled) without the result, as complete_action would record it.
        error = result_too_large(exc.over)
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error)
        return finish(pending, ticket.lease_lost, (yield from _record(
            ticket, Report.unknown(sql, claim, error), pending)))
    except UnstorableResult as exc:
        yield from _record_unstorable(sql, plan, claim, ticket, exc)
        raise exc from None
    try:
        pending = started(plan, claim, ExecutionStatus.SUCCEEDED, result=stored)
        outcome = yield from _record(ticket, Report.success(sql, claim, text), pending)
    except InvalidArgument as exc:
        refused = unstorable(plan.key, result, f"the database refused it: {exc}")
        yield from _record_unstorable(sql, plan, claim, ticket, refused)
        raise refused from None
    if outcome is ReportOutcome.RECORDED and len(text) > sql.limits.result // STORED_GROWTH:
        pending = yield from _as_stored(sql, pending)
    return finish(pending, ticket.lease_lost, outcome)


# How much larger than its compact JSON text a value may be in jsonb, which the database's
# limits measure (arrays of one-digit numbers: 2 bytes of text, about 12 of jsonb each).
STORED_GROWTH = 8


def _as_stored(sql: Statements, pending: Execution) -> Steps[Execution]:
    """A large result within the driver's limit may still be over the database's, which
    measures jsonb: complete_action then records the action ``unknown`` (result_too_large)
    and answers ``recorded``. One read says which (only for results this large)."""
    try:
        action = yield Send(sql.get(pending.action_key))
    except RETRY_ERRORS:
        return pending
    if (action is not None and action.state is ActionState.UNKNOWN
            and action.attempt == pending.attempt and isinstance(action.error, dict)
            and action.error.get("reason") == "result_too_large"):
        return replace(pending, status=ExecutionStatus.UNKNOWN, result=None,
                       error=action.error)
    return pending


def _record_unstorable(sql: Statements, plan: Plan, claim: Claim, ticket: Ticket,
                       refused: UnstorableResult) -> Steps[ReportOutcome]:
    error = unstorable_error(refused)
    pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error)
    return (yield from _record(ticket, Report.unknown(sql, claim, error), pending))


def _record(ticket: Ticket, report: Report, pending: Execution) -> Steps[ReportOutcome]:
    ticket.recording = True
    outcome: ReportOutcome = yield Record(report, pending, ticket)
    return outcome


def record(sql: Statements, report: Report, pending: Execution, ticket: Ticket,
           can_reconnect: bool) -> Steps[ReportOutcome]:
    """Write the attempt's report; after a connection error retry on a fresh connection
    for as long as the lease lasts (the heartbeats keep extending it meanwhile, so an outage
    shorter than the lease costs time, not an ``unknown``).

    A retry first reads the attempt's row: if the lost answer had in fact committed, the
    report is not sent again (a second send would answer ``superseded``).
    """
    last: BaseException | None = None
    backoff = Backoff(ticket.lease_end)
    first = True
    while True:
        if not first:
            # The deadline follows the lease as the heartbeats extend it.
            backoff.deadline = ticket.lease_end
            delay = backoff.next_delay() if can_reconnect and not ticket.lease_lost else None
            if delay is None:
                break
            yield Sleep(delay)
            try:
                attempts = yield Send(sql.attempts(pending.action_key))
            except RETRY_ERRORS as exc:
                last = exc
                continue
            if report.landed(attempts, pending.attempt):
                return ReportOutcome.RECORDED
        first = False
        try:
            outcome: ReportOutcome = yield Send(report.statement)
            return outcome
        except RETRY_ERRORS as exc:
            last = exc
            log.warning("recording the outcome of action %r (attempt %d) failed, retrying on a "
                        "fresh connection: %s", pending.action_key, pending.attempt, exc)
    raise not_recorded(pending, last) from last
