"""The runner's retry budget is the lease (docs/run.md, "When the database goes away"):
driven step by step against a fake clock that only the runner's sleeps move, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from replaysafe_pg import run_policy
from replaysafe_pg.errors import DatabaseUnavailable, OutcomeNotRecorded, unavailable
from replaysafe_pg.execution import ExecutionStatus
from replaysafe_pg.models import ActionState, Claim, ClaimOutcome, ReportOutcome
from replaysafe_pg.statements import Statements

# The attempt token of the claims made by hand (claim_action's answer carries one).
TOKEN = "rsat_" + "0" * 64


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(run_policy.time, "monotonic", c.monotonic)
    return c


def down() -> DatabaseUnavailable:
    cause = psycopg.OperationalError("server closed the connection unexpectedly")
    exc = unavailable(cause)
    exc.__cause__ = cause
    return exc


def drive(steps: Any, clock: Clock, answer: Any) -> tuple[Any, list[Any]]:
    """Run ``steps``; ``answer(effect)`` returns a value or raises; sleeps move the clock."""
    stepper = run_policy.Stepper(steps)
    seen = []
    while (effect := stepper.effect) is not None:
        seen.append(effect)
        if isinstance(effect, run_policy.Sleep):
            clock.now += effect.seconds
            stepper.step(None, None)
            continue
        try:
            value, error = answer(effect), None
        except BaseException as exc:
            value, error = None, exc
        stepper.step(value, error)
    return stepper.result, seen


STATEMENTS = Statements("t", "w")


def plan(lease: float = 30) -> run_policy.Plan:
    return run_policy.make_plan(STATEMENTS, "op", lambda: 1, {}, "k", thread_id=None,
                                lease=lease, on_expired="unknown", wait_timeout=30,
                                timeout=None, retryable=None, can_await=False, encoder=None)


def test_every_plan_claims_with_a_fresh_token() -> None:
    tokens = {plan().claim_token for _ in range(50)}
    assert len(tokens) == 50 and all(len(t) == 32 for t in tokens)


def test_a_claim_is_sent_again_for_as_long_as_the_lease(clock: Clock) -> None:
    p = plan(lease=30)
    start = clock.now

    def answer(effect: Any) -> Any:
        if clock.now - start < 25:
            raise down()
        return "claimed"

    claim = run_policy.claim_one(STATEMENTS, p)
    result, seen = drive(run_policy.claim_within_lease(claim, 30, True), clock, answer)
    assert result == "claimed"
    sends = [e for e in seen if isinstance(e, run_policy.Send)]
    assert all(e.statement is claim for e in sends)  # the same token every time
    assert claim.params["claim_token"] == p.claim_token
    assert max(e.seconds for e in seen if isinstance(e, run_policy.Sleep)) == run_policy.RETRY_MAX_DELAY


def test_a_claim_gives_up_at_the_lease_with_database_unavailable(clock: Clock) -> None:
    p = plan(lease=5)
    start = clock.now

    def answer(effect: Any) -> Any:
        raise down()

    with pytest.raises(DatabaseUnavailable) as caught:
        drive(run_policy.claim_within_lease(run_policy.claim_one(STATEMENTS, p), 5, True), clock, answer)
    assert 4.5 <= clock.now - start <= 5.0
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)


def test_a_raw_psycopg_error_becomes_database_unavailable(clock: Clock) -> None:
    def answer(effect: Any) -> Any:
        raise psycopg.OperationalError("connection refused")

    with pytest.raises(DatabaseUnavailable) as caught:
        claim = run_policy.claim_one(STATEMENTS, plan())
        drive(run_policy.claim_within_lease(claim, 30, False), clock, answer)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)


def record_steps(lease: float) -> tuple[Any, run_policy.Ticket]:
    p = plan(lease)
    calls = Statements("t", "w")
    claim = Claim(ClaimOutcome.CLAIMED, ActionState.RUNNING, 1,
                  datetime.now(UTC) + timedelta(seconds=lease), None, None, "ik", None,
                  attempt_token=TOKEN, action_key="k")
    ticket = run_policy.heartbeat_ticket(calls, p, claim)
    pending = run_policy.started(p, claim, ExecutionStatus.SUCCEEDED, result=1)
    report = run_policy.Report.success(calls, claim, "1")
    return run_policy.record(calls, report, pending, ticket, True), ticket


def test_a_record_is_retried_while_the_lease_lasts_not_six_seconds(clock: Clock) -> None:
    steps, _ = record_steps(30)
    start = clock.now

    def answer(effect: Any) -> Any:
        if clock.now - start < 20:
            raise down()
        return [] if effect.statement.name == "list_attempts" else ReportOutcome.RECORDED

    outcome, _ = drive(steps, clock, answer)
    assert outcome is ReportOutcome.RECORDED


def test_heartbeats_move_the_records_deadline_on(clock: Clock) -> None:
    steps, ticket = record_steps(6)
    start = clock.now

    def answer(effect: Any) -> Any:
        if clock.now - start < 15:
            ticket.extended(clock.now)  # the heartbeats get through, the record does not
            raise down()
        return [] if effect.statement.name == "list_attempts" else ReportOutcome.RECORDED

    outcome, _ = drive(steps, clock, answer)
    assert outcome is ReportOutcome.RECORDED


def test_a_record_gives_up_when_the_lease_ends_or_is_lost(clock: Clock) -> None:
    steps, _ = record_steps(4)
    start = clock.now

    def answer(effect: Any) -> Any:
        raise down()

    with pytest.raises(OutcomeNotRecorded) as caught:
        drive(steps, clock, answer)
    assert 3.5 <= clock.now - start <= 4.5
    assert isinstance(caught.value.__cause__, DatabaseUnavailable)

    steps, ticket = record_steps(30)
    ticket.lease_lost = True
    with pytest.raises(OutcomeNotRecorded):
        drive(steps, clock, answer)


def test_a_claim_answered_again_by_its_token_heartbeats_early() -> None:
    p = plan(30)
    late = Claim(ClaimOutcome.CLAIMED, ActionState.RUNNING, 1,
                 datetime.now(UTC) + timedelta(seconds=6), None, None, "ik", None,
                 attempt_token=TOKEN, action_key="k")
    ticket = run_policy.heartbeat_ticket(Statements("t", "w"), p, late)
    assert 2.5 <= ticket.first_beat <= 3.0  # half of what is left, not a third of 30 s
    fresh = Claim(ClaimOutcome.CLAIMED, ActionState.RUNNING, 1,
                  datetime.now(UTC) + timedelta(seconds=30), None, None, "ik", None,
                  attempt_token=TOKEN, action_key="k")
    assert run_policy.heartbeat_ticket(Statements("t", "w"), p, fresh).first_beat == pytest.approx(10)
