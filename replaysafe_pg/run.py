"""``Ledger.run`` and ``Ledger.run_many``: claim, run the tool, record, or wait for the owner.

Round trips: a first call costs two (claim, record), a replay one. Heartbeats are sent
only for tools that run longer than a third of their lease; waiting costs a LISTEN
connection and one claim per wake-up.

The async flavour (``arun.py``) follows the same steps; what does not touch I/O lives here.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from replaysafe_pg import _args, _tracing, queries
from replaysafe_pg._conn import execute_on
from replaysafe_pg._heartbeat import RETRY_ERRORS, Ticket, lease_lost_warning
from replaysafe_pg.errors import InvalidArgument, OutcomeNotRecorded, UnstorableResult, wrap_errors
from replaysafe_pg.execution import (
    Call,
    Execution,
    ExecutionStatus,
    Retryable,
    as_call,
    dump_error,
    dump_result,
    error_of,
    is_retryable,
    tool_info,
    tool_kwargs,
)
from replaysafe_pg.models import ActionState, Attempt, Claim, ClaimOutcome, ReportOutcome

if TYPE_CHECKING:
    from replaysafe_pg.ledger import Lease, Ledger, _LedgerBase

log = logging.getLogger("replaysafe_pg.run")

CHANNEL = "replaysafe_actions"
DEFAULT_WAIT_TIMEOUT = 30.0
# Backoff between attempts to record an outcome after a connection error (~6 s in all).
RECORD_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
# A waiter claims again at the lease's end; if the lease looks over but the owner's claim
# still answers "running" (clock skew), it backs off from this, doubling up to a second.
MIN_RECLAIM_WAIT = 0.05


@dataclass(frozen=True, slots=True)
class Plan:
    """One call, validated before anything is claimed."""

    operation: str
    fn: Callable[..., Any]
    args: dict[str, Any]
    key: str
    claim_params: dict[str, Any]
    lease_seconds: float
    wait_timeout: float
    timeout: float | None
    retryable: Retryable
    is_async: bool


def make_plan(ledger: _LedgerBase, operation: str, fn: Callable[..., Any], args: dict[str, Any],
              key: str, *, thread_id: str | None, lease: Lease, on_expired: str,
              wait_timeout: float, timeout: float | None, retryable: Retryable,
              async_ok: bool) -> Plan:
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, got {type(fn).__name__}")
    is_async = tool_info(fn).is_async
    if is_async and not async_ok:
        raise InvalidArgument(
            f"fn {getattr(fn, '__qualname__', fn)!r} is a coroutine function: a sync Ledger "
            "cannot await it; use AsyncLedger.run")
    # Serialising the request validates args: a JSON object, nothing written otherwise.
    claim_params = ledger._claim_params(key, operation, args, lease, thread_id, on_expired, None)
    if not all(isinstance(name, str) for name in args):
        raise InvalidArgument("args must have string keys (they are passed as keyword arguments)")
    lease_seconds = claim_params["lease"].total_seconds()  # positive: checked by the builder
    if _args.seconds(wait_timeout, "wait_timeout") < 0:
        raise InvalidArgument("wait_timeout must be a number of seconds >= 0")
    if timeout is not None and _args.seconds(timeout, "timeout") <= 0:
        raise InvalidArgument("timeout must be None or a positive number of seconds")
    if not (retryable is None or callable(retryable) or isinstance(retryable, tuple)):
        raise InvalidArgument("retryable must be an exception type, a tuple of them, or a predicate")
    return Plan(operation, fn, args, key, claim_params, lease_seconds, float(wait_timeout),
                None if timeout is None else float(timeout), retryable, is_async)


CallSpec = Call | tuple[str, Callable[..., Any], dict[str, Any], str]


def make_plans(ledger: _LedgerBase, calls: Sequence[CallSpec], **options: Any) -> list[Plan]:
    plans = [make_plan(ledger, c.operation, c.fn, c.args, c.key, **options)
             for c in map(as_call, calls)]
    if len({p.key for p in plans}) != len(plans):
        raise InvalidArgument("run_many: every call needs its own key")
    return plans


def claim_many_params(ledger: _LedgerBase, plans: list[Plan]) -> dict[str, Any]:
    first = plans[0].claim_params
    return {"tenant_id": ledger.tenant_id,
            "action_keys": [p.key for p in plans],
            "operations": [p.operation for p in plans],
            "requests": [p.claim_params["request"] for p in plans],
            "worker_id": first["worker_id"], "lease": first["lease"],
            "thread_id": first["thread_id"], "on_expired": first["on_expired"], "now": None}


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


def report_params(ledger: _LedgerBase, plan: Plan, attempt: int, **values: Any) -> dict[str, Any]:
    return {"tenant_id": ledger.tenant_id, "action_key": plan.key, "attempt": attempt,
            "now": None, **values}


class Report:
    """One record to write: which function, its parameters, the state it sets."""

    __slots__ = ("name", "params", "state")

    def __init__(self, name: str, params: dict[str, Any], state: ActionState) -> None:
        self.name = name
        self.params = params
        self.state = state

    def landed(self, attempts: list[Attempt], attempt: int) -> bool:
        """Did this very report commit although its answer was lost? Only if the attempt's
        row shows our outcome with the value we sent, and the report reached the action
        (a sweep also leaves an "unknown" outcome, with an error of its own)."""
        row = next((a for a in attempts if a.attempt == attempt), None)
        if row is None or row.outcome != self.state or row.superseded:
            return False
        field = "result" if self.state == ActionState.SUCCEEDED else "error"
        sent = self.params.get(field)
        return sent is not None and getattr(row, field) == json.loads(sent)

    @classmethod
    def success(cls, ledger: _LedgerBase, plan: Plan, attempt: int, text: str) -> Report:
        return cls("complete_action", report_params(
            ledger, plan, attempt, result=text, provider_reference=None), ActionState.SUCCEEDED)

    @classmethod
    def failure(cls, ledger: _LedgerBase, plan: Plan, attempt: int, error: dict[str, Any],
                retryable: bool) -> Report:
        return cls("fail_action", report_params(
            ledger, plan, attempt, error=dump_error(error), retryable=retryable),
            ActionState.RETRYABLE if retryable else ActionState.FAILED)

    @classmethod
    def unknown(cls, ledger: _LedgerBase, plan: Plan, attempt: int, error: dict[str, Any]) -> Report:
        return cls("mark_action_unknown", report_params(
            ledger, plan, attempt, error=dump_error(error)), ActionState.UNKNOWN)


def timeout_error(plan: Plan) -> dict[str, Any]:
    return {"reason": "timeout", "timeout_seconds": plan.timeout,
            "message": f"the tool did not return within {plan.timeout} s; it may still be running "
                       "and its effect may have happened"}


def unawaited_error(result: Any) -> InvalidArgument:
    if inspect.iscoroutine(result):
        result.close()  # it never started: nothing of it ran
    return InvalidArgument("fn returned an awaitable, which a sync Ledger cannot await: "
                           "use AsyncLedger.run (the action was marked retryable: nothing ran)")


def finish(execution: Execution, ticket_lost: bool, outcome: ReportOutcome) -> Execution:
    execution.outcome = outcome
    if outcome is not ReportOutcome.RECORDED:
        if not ticket_lost:
            lease_lost_warning(execution.action_key, execution.attempt, f"its report was {outcome}")
        execution.lease_lost = True
    elif ticket_lost:
        execution.lease_lost = True
    return execution


def not_recorded(pending: Execution, last: BaseException | None) -> OutcomeNotRecorded:
    log.error("could not record the outcome (%s) of action %r, attempt %d: %s. The action stays "
              "running until its lease runs out, then becomes unknown (or retryable if it was "
              "claimed with on_expired='reclaim')", pending.status, pending.action_key,
              pending.attempt, last)
    return OutcomeNotRecorded(
        f"the outcome of action {pending.action_key!r} (attempt {pending.attempt}) could not be "
        f"recorded: {last}", execution=pending)


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


class _TimedOut(Exception):
    pass


# --- sync ------------------------------------------------------------------------------

def run(ledger: Ledger, plan: Plan) -> Execution:
    with _tracing.span(plan.operation) as span:
        query = queries.get("claim_action", plan.claim_params)
        claim = Claim.from_row(ledger._source.execute(query, plan.claim_params, alone=True)[0])
        execution = resolve(ledger, plan, claim)
        span.set(idempotency_key=execution.idempotency_key, status=str(execution.status),
                 replay=execution.replay, attempt=execution.attempt)
        return execution


def run_many(ledger: Ledger, plans: list[Plan], max_workers: int) -> list[Execution]:
    if not plans:
        return []
    params = claim_many_params(ledger, plans)
    rows = ledger._source.execute(queries.get("claim_actions", params), params, alone=True)
    claims = [Claim.from_row(r) for r in rows]
    out: list[Execution | None] = [None] * len(plans)
    work = []
    for i, (plan, claim) in enumerate(zip(plans, claims, strict=True)):
        if claim.outcome in (ClaimOutcome.CLAIMED, ClaimOutcome.RUNNING):
            work.append(i)
        else:
            out[i] = answered(plan, claim)
    errors: list[BaseException] = []
    if len(work) == 1:
        out[work[0]] = resolve_traced(ledger, plans[work[0]], claims[work[0]])
    elif work:
        with ThreadPoolExecutor(max_workers=min(len(work), max_workers),
                                thread_name_prefix="replaysafe-run") as pool:
            futures = {i: pool.submit(resolve_traced, ledger, plans[i], claims[i]) for i in work}
        for i, future in futures.items():
            exc = future.exception()
            if exc is None:
                out[i] = future.result()
            else:
                errors.append(exc)
    if errors:
        # Every other call has finished and is recorded; the first problem is raised.
        raise errors[0]
    return [e for e in out if e is not None]


def resolve_traced(ledger: Ledger, plan: Plan, claim: Claim) -> Execution:
    with _tracing.span(plan.operation) as span:
        execution = resolve(ledger, plan, claim)
        span.set(idempotency_key=execution.idempotency_key, status=str(execution.status),
                 replay=execution.replay, attempt=execution.attempt)
        return execution


def resolve(ledger: Ledger, plan: Plan, claim: Claim) -> Execution:
    if claim.outcome is ClaimOutcome.RUNNING:
        claim = wait(ledger, plan, claim)
    if claim.outcome is ClaimOutcome.CLAIMED:
        return execute(ledger, plan, claim)
    return answered(plan, claim)


def wait(ledger: Ledger, plan: Plan, claim: Claim) -> Claim:
    """SPEC §2 wake-ups: LISTEN, claim again, wait for the key's NOTIFY or the lease's end."""
    if plan.wait_timeout <= 0:
        return claim
    deadline = time.monotonic() + plan.wait_timeout
    source = ledger._source
    with source.dedicated() as conn:
        execute_on(conn, queries.get("listen_actions"))
        try:
            clock = WaitClock()
            query = queries.get("claim_action", plan.claim_params)
            while True:
                claim = Claim.from_row(execute_on(conn, query, plan.claim_params, alone=True)[0])
                remaining = deadline - time.monotonic()
                if claim.outcome is not ClaimOutcome.RUNNING or remaining <= 0:
                    return claim
                _await_notify(conn, claim.idempotency_key, clock.seconds(claim, remaining))
        finally:
            if source.outlives(conn) and not conn.closed and not conn.broken:
                # A pooled (or, failing a second one, the caller's) connection goes back
                # without our LISTEN; a connection of our own is simply closed.
                execute_on(conn, queries.get("unlisten_actions"))


def _await_notify(conn: Any, key: str, seconds: float) -> bool:
    with wrap_errors():
        for note in conn.notifies(timeout=seconds):
            if note.channel == CHANNEL and note.payload == key:
                return True
    return False


def execute(ledger: Ledger, plan: Plan, claim: Claim) -> Execution:
    ticket = ledger._heartbeats.start(
        plan.key, claim.attempt,
        ledger._heartbeat_params(plan.key, claim.attempt, plan.claim_params["lease"], None),
        plan.lease_seconds)
    try:
        return _execute(ledger, plan, claim, ticket)
    finally:
        ledger._heartbeats.stop(ticket)


def _execute(ledger: Ledger, plan: Plan, claim: Claim, ticket: Ticket) -> Execution:
    attempt = claim.attempt
    kwargs = tool_kwargs(plan.args, plan.fn, claim.idempotency_key)
    try:
        result = _call(plan, kwargs)
    except _TimedOut:
        error = timeout_error(plan)
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error)
        return finish(pending, ticket.lease_lost,
                      record(ledger, ticket, Report.unknown(ledger, plan, attempt, error), pending))
    except Exception as exc:
        retry = is_retryable(exc, plan.retryable)
        error = error_of(exc)
        pending = started(plan, claim, ExecutionStatus.FAILED, error=error, retryable=retry,
                          exception=exc)
        return finish(pending, ticket.lease_lost, record(
            ledger, ticket, Report.failure(ledger, plan, attempt, error, retry), pending))
    except BaseException as exc:
        # KeyboardInterrupt, SystemExit...: the tool may have acted; never leave it "running".
        error = error_of(exc, reason="interrupted")
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error, exception=exc)
        with contextlib.suppress(OutcomeNotRecorded):  # logged; the interruption matters more
            record(ledger, ticket, Report.unknown(ledger, plan, attempt, error), pending)
        raise
    if inspect.isawaitable(result):
        problem = unawaited_error(result)
        error = error_of(problem, reason="unawaited")
        pending = started(plan, claim, ExecutionStatus.FAILED, error=error, retryable=True)
        record(ledger, ticket, Report.failure(ledger, plan, attempt, error, True), pending)
        raise problem
    pending = started(plan, claim, ExecutionStatus.SUCCEEDED, result=result)
    try:
        text = dump_result(result, plan.key, ledger.max_result_bytes)
        outcome = record(ledger, ticket, Report.success(ledger, plan, attempt, text), pending)
    except (UnstorableResult, InvalidArgument) as exc:
        unstorable = exc if isinstance(exc, UnstorableResult) else UnstorableResult(
            f"the result of action {plan.key!r} was refused by the database: {exc}",
            action_key=plan.key, result=result)
        error = {"reason": "unstorable_result", "message": str(unstorable)}
        pending = started(plan, claim, ExecutionStatus.UNKNOWN, error=error)
        record(ledger, ticket, Report.unknown(ledger, plan, attempt, error), pending)
        raise unstorable from None
    return finish(pending, ticket.lease_lost, outcome)


def _call(plan: Plan, kwargs: dict[str, Any]) -> Any:
    if plan.timeout is None:
        return plan.fn(**kwargs)
    # The tool runs in a daemon thread we stop waiting for at the timeout: Python cannot stop
    # a thread, so the tool may go on (and act) after the action was marked unknown.
    box: list[tuple[bool, Any]] = []
    done = threading.Event()

    def target() -> None:
        try:
            box.append((True, plan.fn(**kwargs)))
        except BaseException as exc:
            box.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=target, daemon=True, name=f"replaysafe-tool:{plan.operation}").start()
    if not done.wait(plan.timeout):
        raise _TimedOut
    ok, value = box[0]
    if ok:
        return value
    raise value


def record(ledger: Ledger, ticket: Ticket, report: Report, pending: Execution) -> ReportOutcome:
    """Write the attempt's report; after a connection error retry on a fresh connection.

    A retry first reads the attempt's row: if the lost answer had in fact committed, the
    report is not sent again (a second send would answer ``superseded``).
    """
    ticket.recording = True
    source = ledger._source
    query = queries.get(report.name, report.params)
    last: BaseException | None = None
    for delay in (0.0, *RECORD_RETRY_DELAYS):
        if delay:
            if not source.can_reconnect:
                break
            time.sleep(delay)
            try:
                attempts = ledger.attempts(pending.action_key)
            except RETRY_ERRORS as exc:
                last = exc
                continue
            if report.landed(attempts, pending.attempt):
                return ReportOutcome.RECORDED
        try:
            return ReportOutcome(source.execute(query, report.params)[0][0])
        except RETRY_ERRORS as exc:
            last = exc
            log.warning("recording the outcome of action %r (attempt %d) failed, retrying on a "
                        "fresh connection: %s", pending.action_key, pending.attempt, exc)
    raise not_recorded(pending, last)
