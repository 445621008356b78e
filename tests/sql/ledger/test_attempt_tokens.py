"""Inside a tenant every attempt is a capability (SPEC §2 "Attempt token", §4): two worker
logins of one tenant, each a real LOGIN role. A worker that does not hold an attempt's token
cannot heartbeat, settle, re-run or rewrite it — and when it tries, nothing is written
anywhere: not the action row, not an attempt row (as the audit views show them), not the
lease, no wake-up. Each scenario also runs its attack on revision 0010, where the attempt
number was the only fence, to show what it did there."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.claim_tokens import claim_as
from helpers.db import refused

import replaysafe_pg

Conn = psycopg.Connection[Any]


FORGED = "rsat_" + "0" * 64


def everything(dsn: str, key: str) -> tuple[Any, ...]:
    """What anyone could see changed: the action's row, its attempts (through the audit
    views, first attempts included) and the lease — read as the schema owner."""
    with psycopg.connect(dsn, autocommit=True) as c:
        action = c.execute("SELECT row_to_json(x)::text FROM replaysafe.actions x "
                           "WHERE tenant_id = 'A' AND action_key = %s", (key,)).fetchone()
        attempts = c.execute("SELECT json_agg(t ORDER BY attempt)::text FROM replaysafe.action_attempts_v t "
                             "WHERE tenant_id = 'A' AND action_key = %s", (key,)).fetchone()
        rows = c.execute("SELECT json_agg(t ORDER BY attempt)::text FROM replaysafe.action_attempts t "
                         "WHERE tenant_id = 'A' AND action_key = %s", (key,)).fetchone()
    return tuple(None if r is None else r[0] for r in (action, attempts, rows))


def wakeups(listener: Conn) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=0.2)]


def expire(dsn: str, key: str) -> None:
    """The lease ran out (moved into the past as the owner: no waiting)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE replaysafe.actions SET lease_expires_at = now() - interval '1 second' "
                  "WHERE tenant_id = 'A' AND action_key = %s", (key,))


REPORTS = {
    "complete": "SELECT replaysafe.complete_action(p_tenant_id => 'A', p_action_key => %s, "
                "p_attempt => %s, p_attempt_token => %s, p_result => '{\"forged\": true}')",
    "fail_retryable": "SELECT replaysafe.fail_action(p_tenant_id => 'A', p_action_key => %s, "
                      "p_attempt => %s, p_attempt_token => %s, p_error => '{\"forged\": true}', "
                      "p_retryable => true)",
    "mark_unknown": "SELECT replaysafe.mark_action_unknown(p_tenant_id => 'A', p_action_key => %s, "
                    "p_attempt => %s, p_attempt_token => %s, p_error => '{\"forged\": true}')",
}


@pytest.fixture
def at_0010(new_db_at: Callable[[str], str]) -> str:
    return new_db_at("0010")


# --- on 0010 the attempt number was the only fence ---------------------------------------------

def test_on_0010_a_colleague_settled_and_shortened_what_it_did_not_hold(at_0010: str) -> None:
    """The holes these tests close, as they were: with the public attempt number alone a
    second worker settled an unknown action with a forged result and cut a live lease."""
    with psycopg.connect(at_0010, autocommit=True) as c:
        c.execute("SELECT replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'k', "
                  "p_operation => 'refund', p_request => '{}', p_worker_id => 'w1')")
        c.execute("UPDATE replaysafe.actions SET lease_expires_at = now() - interval '1 s'")
        assert c.execute("SELECT outcome FROM replaysafe.claim_action(p_tenant_id => 'A', "
                         "p_action_key => 'k', p_operation => 'refund', p_request => '{}', "
                         "p_worker_id => 'w2')").fetchone() == ("unknown",)
        assert c.execute("SELECT replaysafe.complete_action(p_tenant_id => 'A', p_action_key => 'k', "
                         "p_attempt => 1, p_result => '{\"forged\": true}')").fetchone() == ("late",)
        c.execute("SELECT replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'live', "
                  "p_operation => 'refund', p_request => '{}', p_worker_id => 'w1', "
                  "p_lease => '5 minutes')")
        c.execute("SELECT replaysafe.heartbeat_action(p_tenant_id => 'A', p_action_key => 'live', "
                  "p_attempt => 1, p_lease => '1 microsecond')")
        left = c.execute("SELECT lease_expires_at - now() FROM replaysafe.actions "
                         "WHERE action_key = 'live'").fetchone()
        assert left is not None and left[0].total_seconds() < 1


# --- 1: settling someone else's unknown action ----------------------------------------------------

@pytest.mark.parametrize("report", sorted(REPORTS))
def test_a_worker_cannot_settle_a_colleagues_unknown_action(
        dsn: str, two_workers: tuple[Conn, Conn, Conn], report: str) -> None:
    w1, w2, listener = two_workers
    outcome, attempt, token, _lease = claim_as(w1, "k", worker="w1", lease="1 second")
    assert outcome == "claimed" and token.startswith("rsat_")
    claim_as(w2, "k", worker="w2")  # a waiter: the switch to unknown would wake it
    expire(dsn, "k")
    assert claim_as(w2, "k", worker="w2")[0] == "unknown"
    wakeups(listener)
    before = everything(dsn, "k")
    for forged in (FORGED, token[:-1] + ("0" if token[-1] != "0" else "1"), "rsat_", "x"):
        refused(w2, REPORTS[report], "k", attempt, forged)
    assert everything(dsn, "k") == before
    assert wakeups(listener) == []
    assert claim_as(w2, "k", worker="w2")[0] == "unknown"  # nothing to replay, nothing re-run
    # The holder itself still may: its report after the expiry is late and settles it.
    assert w1.execute(REPORTS["complete"], ("k", attempt, token)).fetchone() == ("late",)


def test_a_missing_token_is_invalid_and_writes_nothing(dsn: str,
                                                        two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, _w2, _listener = two_workers
    _outcome, attempt, _token, _lease = claim_as(w1, "k")
    before = everything(dsn, "k")
    for token in (None, "", "t" * 513):
        for sql in REPORTS.values():
            with pytest.raises(psycopg.Error) as raised:
                w1.execute(sql, ("k", attempt, token))
            assert raised.value.sqlstate == "RS005"
            assert "p_attempt_token" in str(raised.value)
    assert everything(dsn, "k") == before


# --- 2: ending a colleague's live lease -----------------------------------------------------------

HEARTBEAT = ("SELECT replaysafe.heartbeat_action(p_tenant_id => 'A', p_action_key => %s, "
             "p_attempt => %s, p_attempt_token => %s, p_lease => %s::interval)")


def test_a_worker_cannot_end_a_colleagues_live_lease(dsn: str,
                                                     two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, w2, listener = two_workers
    _o, attempt, token, lease = claim_as(w1, "k", worker="w1", lease="5 minutes", on_expired="reclaim")
    before = everything(dsn, "k")
    refused(w2, HEARTBEAT, "k", attempt, FORGED, "1 microsecond")
    for report in REPORTS.values():  # nor settle the attempt while it runs
        refused(w2, report, "k", attempt, FORGED)
    assert everything(dsn, "k") == before
    # Not even its holder shortens it: a heartbeat extends, never cuts.
    assert w1.execute(HEARTBEAT, ("k", attempt, token, "1 microsecond")).fetchone() == (lease,)
    assert claim_as(w2, "k", worker="w2")[0] == "running"  # under reclaim: no attempt 2
    assert claim_as(w2, "k", worker="w2")[1] == 1
    assert wakeups(listener) == []


def test_a_heartbeat_with_the_right_token_extends_and_a_stale_one_is_lease_lost(
        dsn: str, two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, w2, _listener = two_workers
    _o, attempt, token, lease = claim_as(w1, "k", worker="w1", lease="1 second", on_expired="reclaim")
    (extended,) = w1.execute(HEARTBEAT, ("k", attempt, token, "1 minute")).fetchone()  # type: ignore[misc]
    assert extended > lease
    expire(dsn, "k")
    assert claim_as(w2, "k", worker="w2", on_expired="reclaim")[:2] == ("claimed", 2)
    with pytest.raises(psycopg.Error) as raised:
        w1.execute(HEARTBEAT, ("k", attempt, token, "1 minute"))
    assert raised.value.sqlstate == "RS002"


# --- 3: rewriting finished attempt records ----------------------------------------------------------

def test_a_worker_cannot_rewrite_a_colleagues_finished_attempt(
        dsn: str, two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, w2, listener = two_workers
    _o, first, _first_token, _l = claim_as(w1, "k", worker="w1", lease="1 second", on_expired="reclaim")
    expire(dsn, "k")
    _o, second, second_token, _l = claim_as(w2, "k", worker="w2", on_expired="reclaim")
    assert (first, second) == (1, 2)
    before = everything(dsn, "k")
    assert '"lease_expired"' in before[1]  # attempt 1's evidence
    for report in REPORTS.values():
        refused(w2, report, "k", first, second_token)  # its own token is not attempt 1's
        refused(w2, report, "k", first, FORGED)
    assert everything(dsn, "k") == before
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM replaysafe.multi_effect_actions").fetchone() == (0,)
    assert wakeups(listener) == []


def test_an_attempts_final_report_is_written_once(dsn: str,
                                                  two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, w2, _listener = two_workers
    _o, first, first_token, _l = claim_as(w1, "k", worker="w1", lease="1 second", on_expired="reclaim")
    expire(dsn, "k")
    claim_as(w2, "k", worker="w2", on_expired="reclaim")
    # Attempt 1's holder reports late: superseded (attempt 2 runs), kept on its row once.
    fail = REPORTS["fail_retryable"].replace("p_retryable => true", "p_retryable => false")
    assert w1.execute(fail, ("k", first, first_token)).fetchone() == ("superseded",)
    after_first = everything(dsn, "k")
    for report in (REPORTS["complete"], fail, REPORTS["mark_unknown"]):
        assert w1.execute(report, ("k", first, first_token)).fetchone() == ("superseded",)
    assert everything(dsn, "k") == after_first


def test_a_provisional_unknown_is_replaced_by_the_attempts_final_report(
        dsn: str, two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, _w2, _listener = two_workers
    _o, attempt, token, _l = claim_as(w1, "k", worker="w1")
    assert w1.execute(REPORTS["mark_unknown"], ("k", attempt, token)).fetchone() == ("recorded",)
    assert w1.execute(REPORTS["complete"], ("k", attempt, token)).fetchone() == ("late",)
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT state::text, result FROM replaysafe.actions_v").fetchone() == (
            "succeeded", {"forged": True})


# --- 4: a claim inside an open transaction -----------------------------------------------------------

@pytest.mark.parametrize("on_expired", ["reclaim", "unknown"])
def test_holding_a_transaction_until_a_lease_runs_out_gains_nothing(
        dsn: str, two_workers: tuple[Conn, Conn, Conn], on_expired: str) -> None:
    w1, w2, _listener = two_workers
    _o, attempt, token, _l = claim_as(w1, "k", worker="w1", lease="1 second", on_expired=on_expired)
    with w2.transaction():
        assert claim_as(w2, "k", worker="w2", on_expired=on_expired)[0] == "running"  # row locked
        time.sleep(1.2)  # the lease runs out while the transaction holds the row
        again = claim_as(w2, "k", worker="w2", on_expired=on_expired)
        assert again[:2] == ("running", 1) and again[2] is None
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT replaysafe.sweep_expired_actions()")  # skips the locked row
    # After it, a fresh claim sees the lease expired before its transaction: now it may.
    assert claim_as(w2, "k", worker="w2", on_expired=on_expired)[0] == (
        "claimed" if on_expired == "reclaim" else "unknown")
    outcome = w1.execute(REPORTS["complete"], ("k", attempt, token)).fetchone()
    assert outcome == (("superseded",) if on_expired == "reclaim" else ("late",))


def test_a_sweep_inside_a_transaction_takes_over_no_lease_that_was_live_when_it_began(
        dsn: str, two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, w2, _listener = two_workers
    claim_as(w1, "k", worker="w1", lease="1 second", on_expired="reclaim")
    with w2.transaction():
        w2.execute("SELECT 1")
        time.sleep(1.2)
        assert w2.execute("SELECT replaysafe.sweep_expired_actions()").fetchone() == (0,)
    assert w2.execute("SELECT replaysafe.sweep_expired_actions()").fetchone() == (1,)


# --- the documented signatures, and no other ---------------------------------------------------------

LEDGER_SIGNATURES = {
    "claim_action": ["p_tenant_id", "p_action_key", "p_operation", "p_request", "p_worker_id",
                     "p_lease", "p_thread_id", "p_on_expired", "p_now", "p_claim_token",
                     "p_grant"],
    "claim_actions": ["p_tenant_id", "p_action_keys", "p_operations", "p_requests", "p_worker_id",
                      "p_lease", "p_thread_id", "p_on_expired", "p_now", "p_claim_tokens",
                      "p_grant"],
    "heartbeat_action": ["p_tenant_id", "p_action_key", "p_attempt", "p_attempt_token", "p_lease",
                         "p_now", "p_grant"],
    "complete_action": ["p_tenant_id", "p_action_key", "p_attempt", "p_attempt_token", "p_result",
                        "p_provider_reference", "p_now", "p_grant"],
    "fail_action": ["p_tenant_id", "p_action_key", "p_attempt", "p_attempt_token", "p_error",
                    "p_retryable", "p_now", "p_grant"],
    "mark_action_unknown": ["p_tenant_id", "p_action_key", "p_attempt", "p_attempt_token",
                            "p_error", "p_now", "p_grant"],
}


def test_the_ledger_functions_have_exactly_the_documented_signatures(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT p.proname::text, p.proargnames::text[], p.pronargdefaults FROM pg_proc p "
        "WHERE p.pronamespace = 'replaysafe'::regnamespace AND p.proname = ANY(%s)",
        (list(LEDGER_SIGNATURES),)).fetchall()
    assert sorted(r[0] for r in rows) == sorted(LEDGER_SIGNATURES)  # one signature each
    for name, argnames, _defaults in rows:
        assert argnames == LEDGER_SIGNATURES[name], name
    defaults = {r[0]: r[2] for r in rows}
    # The token has no default: everything after it that has one, and nothing before.
    assert defaults["complete_action"] == 3 and defaults["heartbeat_action"] == 3
    assert defaults["fail_action"] == 3 and defaults["mark_action_unknown"] == 2


# --- a row lock held by a colleague gains it nothing ---------------------------------------------------

def test_a_heartbeat_that_waited_for_a_colleagues_lock_lands_a_live_lease(
        dsn: str, two_workers: tuple[Conn, Conn, Conn]) -> None:
    """Worker 2's claim answers "running" and registers it as a waiter under the row's lock,
    then keeps its transaction open past worker 1's lease: worker 1's heartbeat waits, and
    the lease it sets when it gets through counts from then, so no claim takes over."""
    import threading

    w1, w2, _listener = two_workers
    _o, attempt, token, _l = claim_as(w1, "k", worker="w1", lease="2 seconds", on_expired="reclaim")
    beat: list[Any] = []
    with w2.transaction():
        assert claim_as(w2, "k", worker="w2", on_expired="reclaim")[0] == "running"
        t = threading.Thread(target=lambda: beat.append(
            w1.execute(HEARTBEAT, ("k", attempt, token, "2 seconds")).fetchone()), daemon=True)
        t.start()
        with psycopg.connect(dsn, autocommit=True) as c:
            deadline = time.monotonic() + 10
            while not c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                "AND datname = current_database()").fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline
                time.sleep(0.02)
        time.sleep(2.5)  # worker 1's lease is over while its heartbeat waits
    t.join(10)
    (expires,) = beat[0]
    with psycopg.connect(dsn) as c:
        (now,) = c.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
    assert expires > now
    assert claim_as(w2, "k", worker="w2", on_expired="reclaim")[:2] == ("running", 1)


def test_an_old_attempts_report_never_locks_the_action(dsn: str,
                                                       two_workers: tuple[Conn, Conn, Conn]) -> None:
    """A report on an older attempt is superseded for good and changes that attempt's row
    only: held open in a transaction it does not stop the running attempt's heartbeat."""
    w1, w2, _listener = two_workers
    _o, old, old_token, _l = claim_as(w2, "k", worker="w2", lease="1 second", on_expired="reclaim")
    expire(dsn, "k")
    _o, current, token, _l = claim_as(w1, "k", worker="w1", on_expired="reclaim")
    with w2.transaction():
        assert w2.execute(REPORTS["mark_unknown"], ("k", old, old_token)).fetchone() == ("superseded",)
        w1.execute("SET lock_timeout = '1s'")
        w1.execute(HEARTBEAT, ("k", current, token, "30 seconds"))  # not blocked
        w1.execute("RESET lock_timeout")


# --- an attempt running when 0011 is installed -----------------------------------------------------------

def test_an_attempt_claimed_with_a_claim_token_before_the_upgrade_can_report_after_it(
        new_db_at: Callable[[str], str]) -> None:
    dsn = new_db_at("0010")
    secret = "claimed-before-the-upgrade-0123456789"
    with psycopg.connect(dsn, autocommit=True) as c:
        for key, token in (("with", secret), ("without", None)):
            c.execute("SELECT replaysafe.claim_action(p_tenant_id => 'A', p_action_key => %s, "
                      "p_operation => 'refund', p_request => '{}', p_worker_id => 'w', "
                      "p_lease => '1 hour', p_claim_token => %s)", (key, token))
    replaysafe_pg.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        again = claim_as(c, "with", claim_token=secret)
        assert again[:2] == ("claimed", 1) and again[2].startswith("rsat_")
        assert c.execute(REPORTS["complete"], ("with", 1, again[2])).fetchone() == ("recorded",)
        # Without a claim token there is no token to ask for again: nothing can report.
        assert claim_as(c, "without")[0] == "running"
        refused(c, REPORTS["complete"], "without", 1, FORGED)
