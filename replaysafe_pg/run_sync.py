"""``Ledger.run`` and ``Ledger.run_many``: the sync I/O shell of :mod:`replaysafe_pg.run_policy`.

It performs the runner's effects with blocking calls: the claimed calls of ``run_many`` run
in a thread pool, a tool with a timeout in a daemon thread, a waiter blocks on its
subscription to the ledger's LISTEN session.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from replaysafe_pg import _tracing, run_policy
from replaysafe_pg._conn import SyncSource
from replaysafe_pg._heartbeat import Heartbeats
from replaysafe_pg._listen import Subscription
from replaysafe_pg.errors import unavailable
from replaysafe_pg.execution import Execution
from replaysafe_pg.models import Claim, ClaimOutcome
from replaysafe_pg.run_policy import Plan, Steps
from replaysafe_pg.statements import Statement, Statements

T = TypeVar("T")


def drive(steps: Steps[T], perform: Callable[[run_policy.Effect], Any]) -> T:
    """Run ``steps`` to their end, performing each effect they yield."""
    stepper = run_policy.Stepper(steps)
    while (effect := stepper.effect) is not None:
        try:
            value, error = perform(effect), None
        except BaseException as exc:
            value, error = None, exc
        stepper.step(value, error)
    return stepper.result  # type: ignore[return-value]


@contextlib.contextmanager
def _no_raw_errors() -> Iterator[None]:
    """docs/errors.md: a connection error reaches the caller of ``run`` as DatabaseUnavailable,
    never as a psycopg exception (the steps convert theirs; this catches any other)."""
    try:
        yield
    except run_policy.RAW_ERRORS as exc:
        raise unavailable(exc) from exc


class Runner:
    """Claims, runs and records for a sync ``Ledger``."""

    def __init__(self, sql: Statements, source: SyncSource, heartbeats: Heartbeats) -> None:
        self._sql = sql
        self._source = source
        self._heartbeats = heartbeats

    def _send(self, statement: Statement[T], alone: bool = False) -> T:
        return statement.decode(self._source.execute(statement.query, statement.params,
                                                     alone=alone))

    def _claim(self, statement: Statement[T], plan: Plan) -> T:
        steps = run_policy.claim_within_lease(statement, plan.lease_seconds,
                                              self._source.can_reconnect)
        return drive(steps, self._perform)

    def run(self, plan: Plan) -> Execution:
        with _tracing.span(plan.operation, plan.key) as call, _no_raw_errors():
            claim = self._claim(run_policy.claim_one(self._sql, plan), plan)
            return run_policy.traced(call, self._resolve(plan, claim))

    def run_many(self, plans: list[Plan], max_workers: int) -> list[Execution]:
        if not plans:
            return []
        # A span per call, from before the claim; each ends with its call (_tracing.ending
        # ends any left, recording what escaped).
        calls = _tracing.calls([(p.operation, p.key) for p in plans])
        with _tracing.ending(calls), _no_raw_errors():
            return self._run_many(plans, calls, max_workers)

    def _run_many(self, plans: list[Plan], calls: list[_tracing.NoCall],
                  max_workers: int) -> list[Execution]:
        claims = self._claim(run_policy.claim_many(self._sql, plans), plans[0])
        out, work = run_policy.to_run(plans, claims)
        for i, answer in enumerate(out):
            if isinstance(answer, Execution):  # answered by the claim: a replay, unknown, ...
                run_policy.traced(calls[i], answer)
                calls[i].end()
        if len(work) == 1:
            out[work[0]] = self._resolve_traced(plans[work[0]], claims[work[0]], calls[work[0]])
        elif work:
            with ThreadPoolExecutor(max_workers=min(len(work), max_workers),
                                    thread_name_prefix="replaysafe-run") as pool:
                futures = {i: pool.submit(self._resolve_traced, plans[i], claims[i], calls[i])
                           for i in work}
            for i, future in futures.items():
                exc = future.exception()
                out[i] = future.result() if exc is None else exc
        return run_policy.collected(out)

    def _resolve_traced(self, plan: Plan, claim: Claim, call: _tracing.NoCall) -> Execution:
        try:
            with call.current():
                return run_policy.traced(call, self._resolve(plan, claim))
        finally:
            call.end()

    def _resolve(self, plan: Plan, claim: Claim) -> Execution:
        # A claim a waiter took beside a caller's connection is recorded there too: the
        # caller's connection may be inside a transaction of its own by now.
        aside = False
        if claim.outcome is ClaimOutcome.RUNNING and plan.wait_timeout > 0:
            claim, aside = self._wait(plan, claim), True
        if claim.outcome is ClaimOutcome.CLAIMED:
            ticket = run_policy.heartbeat_ticket(self._sql, plan, claim)
            self._heartbeats.start(ticket)
            try:
                return drive(run_policy.execute(self._sql, plan, claim, ticket),
                             lambda effect: self._perform(effect, aside=aside))
            finally:
                self._heartbeats.stop(ticket)
        return run_policy.answered(plan, claim)

    def _wait(self, plan: Plan, claim: Claim) -> Claim:
        deadline = time.monotonic() + plan.wait_timeout
        subscription = Subscription(self._source.listener())
        try:
            steps = run_policy.wait(self._sql, plan, claim, deadline, self._source.can_reconnect)
            return drive(steps, lambda effect: self._perform(effect, subscription, aside=True))
        finally:
            subscription.drop()

    def _perform(self, effect: run_policy.Effect, subscription: Subscription | None = None, *,
                 aside: bool = False) -> Any:
        """``aside``: a waiter's statements (beside a caller's connection)."""
        match effect:
            case run_policy.Send(statement, alone):
                if aside:
                    return statement.decode(self._source.execute_aside(
                        statement.query, statement.params, alone=alone))
                return self._send(statement, alone)
            case run_policy.Listen(key):
                assert subscription is not None
                subscription.subscribe(key)
                return None
            case run_policy.Notified(seconds):
                assert subscription is not None
                subscription.wait(seconds)
                return None
            case run_policy.Sleep(seconds):
                time.sleep(seconds)
                return None
            case run_policy.RunTool(plan, kwargs):
                return _call(plan, kwargs)
            case run_policy.Record(report, pending, ticket):
                steps = run_policy.record(self._sql, report, pending, ticket,
                                          self._source.can_reconnect)
                return drive(steps, lambda effect: self._perform(effect, aside=aside))
        raise AssertionError(effect)


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
        raise run_policy.ToolTimedOut
    ok, value = box[0]
    if ok:
        return value
    raise value
