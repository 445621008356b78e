"""Wake-ups (docs/sql-ledger.md): one NOTIFY on replaysafe_actions, payload exactly the idempotency key,
when an action with registered waiters leaves "running" — and none when nobody waits.

Absence is asserted by a short read of the listener (0.2 s): a NOTIFY is delivered when
its transaction commits, which has happened before the call returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.db import derived_key, reset_ledger
from helpers.fixed_clock import LEASE, at

from replaysafe_pg import Claim, Ledger


@pytest.fixture(scope="module")
def module_listener(shared_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(shared_dsn, autocommit=True) as c:
        c.execute("LISTEN replaysafe_actions")
        yield c


@pytest.fixture
def listener(module_listener: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    reset_ledger(module_listener)
    assert received(module_listener) == []
    return module_listener


@pytest.fixture
def ledger(shared_dsn: str, listener: Any) -> Iterator[Ledger]:
    with Ledger(shared_dsn, tenant_id="t1", worker_id="w1") as led:
        yield led


def received(listener: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in listener.notifies(timeout=0.2)]


def claim(led: Ledger, seconds: float, policy: str = "unknown", key: str = "k") -> Any:
    return led.claim(key, "refund", {"order": 42}, lease=LEASE, on_expired=policy,
                     now=at(seconds))


TRANSITIONS: dict[str, tuple[str, Callable[[Ledger, Claim], Any], str]] = {
    # name: (policy, the transition out of "running" of attempt 1 (its claim given), the
    # state it leaves behind)
    "complete": ("unknown", lambda led, c: led.complete(c, {"id": 1}, now=at(5)), "succeeded"),
    "fail": ("unknown", lambda led, c: led.fail(c, {"e": 1}, now=at(5)), "failed"),
    "fail_retryable": ("unknown", lambda led, c: led.fail(c, {"e": 1}, retryable=True,
                                                          now=at(5)), "retryable"),
    "mark_unknown": ("unknown", lambda led, c: led.mark_unknown(c, {"e": 1}, now=at(5)),
                     "unknown"),
    "claim_noticing_expiry": ("unknown", lambda led, _: claim(led, 31), "unknown"),
    "reclaim_noticing_expiry": ("reclaim", lambda led, _: claim(led, 31, "reclaim"), "running"),
    "sweep": ("unknown", lambda led, _: led.sweep(now=at(31)), "unknown"),
    "sweep_reclaim_policy": ("reclaim", lambda led, _: led.sweep(now=at(31)), "retryable"),
}


@pytest.mark.parametrize("waiting", [True, False], ids=["waiter", "no_waiter"])
@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_leaving_running_notifies_only_registered_waiters(
        ledger: Ledger, listener: psycopg.Connection[Any], shared_dsn: str, name: str,
        waiting: bool) -> None:
    policy, transition, left_in = TRANSITIONS[name]
    first = claim(ledger, 0, policy)
    if waiting:
        assert claim(ledger, 10, policy).outcome == "running"
    assert received(listener) == []  # claiming and registering a waiter send nothing

    transition(ledger, first)
    action = ledger.get("k")
    assert action is not None and action.state == left_in
    expected = [("replaysafe_actions", first.idempotency_key)] if waiting else []
    assert received(listener) == expected
    if waiting:
        # The payload reveals neither tenant nor key: it is the derived key only.
        assert expected[0][1] == derived_key(shared_dsn, "t1", "k")


def test_waiters_of_the_old_attempt_do_not_carry_over_to_the_new_one(
        ledger: Ledger, listener: psycopg.Connection[Any]) -> None:
    claim(ledger, 0, "reclaim")
    assert claim(ledger, 10, "reclaim").outcome == "running"
    new = claim(ledger, 31, "reclaim")
    assert (new.outcome, new.attempt) == ("claimed", 2)
    assert len(received(listener)) == 1  # the old attempt's waiters
    ledger.complete(new, {"id": 2}, now=at(40))
    assert received(listener) == []  # nobody waits for attempt 2


def test_more_waiters_still_one_notify_per_transition(
        ledger: Ledger, listener: psycopg.Connection[Any]) -> None:
    first = claim(ledger, 0)
    for s in (1, 2, 3):
        assert claim(ledger, s).outcome == "running"
    ledger.complete(first, {"id": 1}, now=at(5))
    assert received(listener) == [("replaysafe_actions", first.idempotency_key)]


def test_reports_that_do_not_leave_running_send_nothing(
        ledger: Ledger, listener: psycopg.Connection[Any]) -> None:
    first = claim(ledger, 0)
    assert claim(ledger, 10).outcome == "running"
    ledger.heartbeat(first, lease=LEASE, now=at(20))
    assert received(listener) == []
    ledger.sweep(now=at(60))
    assert len(received(listener)) == 1
    # Already out of "running": a late report wakes nobody a second time.
    assert ledger.complete(first, {"id": 1}, now=at(61)) == "late"
    assert received(listener) == []


def test_only_the_swept_actions_with_waiters_notify(
        ledger: Ledger, listener: psycopg.Connection[Any]) -> None:
    claims = {k: claim(ledger, 0, key=k) for k in ("a", "b", "c")}
    assert claim(ledger, 5, key="b").outcome == "running"
    assert ledger.sweep(now=at(31)) == 3
    assert received(listener) == [("replaysafe_actions", claims["b"].idempotency_key)]
