"""docs/sql-ledger.md, row by row, against a real Postgres. The clock is p_now: no sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers.db import derived_key
from helpers.fixed_clock import LEASE, at

from replaysafe_pg import (
    ActionState,
    AttemptToken,
    FingerprintConflict,
    InvalidTransition,
    LeaseLost,
    Ledger,
)


def unclaimed(key: str, attempt: int) -> AttemptToken:
    """An attempt nobody claimed (no action, or no such attempt): its token is made up."""
    return AttemptToken(key, attempt, "rsat_" + "0" * 64)


def claim(led: Ledger, key: str = "k", request: dict[str, Any] | None = None,
          seconds: float = 0, **kw: Any) -> Any:
    return led.claim(key, "refund", request if request is not None else {"order": 42},
                     lease=LEASE, now=at(seconds), **kw)


def row(conn: psycopg.Connection[Any], key: str = "k", tenant: str = "t1") -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    found = cur.execute("SELECT * FROM replaysafe.actions WHERE tenant_id = %s AND action_key = %s",
                        (tenant, key)).fetchone()
    assert found is not None
    return found


def attempts(conn: psycopg.Connection[Any], key: str = "k") -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute("SELECT * FROM replaysafe.action_attempts_v WHERE action_key = %s "
                       "ORDER BY attempt", (key,)).fetchall()


# --- claim outcomes --------------------------------------------------------------------

def test_new_key_is_claimed_with_attempt_1_and_a_lease(ledger: Ledger, dsn: str) -> None:
    c = claim(ledger)
    assert (c.outcome, c.state, c.attempt) == ("claimed", "running", 1)
    assert c.lease_expires_at == at(30)
    assert c.idempotency_key == derived_key(dsn, "t1", "k")


def test_terminal_actions_replay_their_recorded_outcome(ledger: Ledger) -> None:
    c = claim(ledger)
    ledger.complete(c, {"refund_id": "re_1"}, provider_reference="re_1", now=at(1))
    again = claim(ledger, seconds=2)
    assert (again.outcome, again.state, again.result) == ("replay", "succeeded", {"refund_id": "re_1"})
    assert again.provider_reference == "re_1"

    c2 = claim(ledger, key="k2")
    ledger.fail(c2, {"message": "card declined"}, now=at(1))
    replay = claim(ledger, key="k2", seconds=2)
    assert (replay.outcome, replay.state, replay.error) == (
        "replay", "failed", {"message": "card declined"})


def test_live_lease_answers_running_and_registers_a_waiter(ledger: Ledger, conn: Any) -> None:
    claim(ledger)
    other = claim(ledger, seconds=10)
    assert (other.outcome, other.state, other.attempt) == ("running", "running", 1)
    assert row(conn)["has_waiters"] is True


def test_replay_and_unknown_answers_write_nothing(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.complete(c, {"ok": True}, now=at(1))
    # No transaction id is assigned: the claim is a pure read.
    conn.execute("BEGIN")
    conn.execute("SELECT * FROM replaysafe.claim_action('t1', 'k', 'refund', '{\"order\": 42}', 'w9')")
    assert conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0] is None
    conn.execute("ROLLBACK")


def test_changed_operation_or_request_raises_rs001_and_changes_nothing(
        ledger: Ledger, conn: Any) -> None:
    claim(ledger)
    before = row(conn)
    with pytest.raises(FingerprintConflict):
        claim(ledger, request={"order": 43})
    with pytest.raises(FingerprintConflict):
        ledger.claim("k", "charge", {"order": 42}, now=at(1))
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT replaysafe.claim_action('t1', 'k', 'refund', '{\"order\": true}', 'w')")
    assert info.value.sqlstate == "RS001"
    assert row(conn) == before


@pytest.mark.parametrize(("first", "second", "same"), [
    ({"a": 1}, {"a": 1.0}, True),
    ({"a": 1, "b": [1, 2]}, {"b": [1.00, 2], "a": 1}, True),
    ({"a": {"x": 1, "y": 2}}, {"a": {"y": 2, "x": 1}}, True),
    ({"a": True}, {"a": 1}, False),
    ({"a": "1"}, {"a": 1}, False),
    ({"a": None}, {}, False),
])
def test_request_fingerprint_is_jsonb_equality(ledger: Ledger, first: dict[str, Any],
                                               second: dict[str, Any], same: bool) -> None:
    claim(ledger, request=first)
    if same:
        assert claim(ledger, request=second, seconds=1).outcome == "running"
    else:
        with pytest.raises(FingerprintConflict):
            claim(ledger, request=second, seconds=1)


def test_request_key_order_and_whitespace_in_sql_text(conn: Any) -> None:
    conn.execute("SELECT replaysafe.claim_action('t1', 'k', 'op', '{\"a\": 1, \"b\": 2}', 'w')")
    out = conn.execute("SELECT outcome FROM replaysafe.claim_action('t1', 'k', 'op', "
                       "'{ \"b\":2.0,\"a\" :1 }', 'w')").fetchone()
    assert out[0] == "running"


def test_idempotency_key_is_stable_and_distinct(ledger: Ledger, dsn: str, conn: Any) -> None:
    c = claim(ledger, on_expired="reclaim")
    c2 = claim(ledger, seconds=60)  # expired under reclaim: a new attempt, same key
    assert c2.attempt == 2 and c2.idempotency_key == c.idempotency_key
    with Ledger(dsn, tenant_id="t2") as other:
        assert claim(other).idempotency_key != c.idempotency_key
    keys = {conn.execute("SELECT replaysafe.idempotency_key(%s, %s)", p).fetchone()[0]
            for p in [("ab", "c"), ("a", "bc"), ("", "abc"), ("abc", "")]}
    assert len(keys) == 4
    assert {len(k) for k in keys} == {68}
    assert conn.execute("SELECT replaysafe.idempotency_key('t1', 'k')").fetchone()[0] == \
        c.idempotency_key


# --- leases and expiry ------------------------------------------------------------------

def test_expired_lease_default_policy_claim_persists_unknown(ledger: Ledger, conn: Any) -> None:
    claim(ledger)
    out = claim(ledger, seconds=30)  # lease_expires_at <= now: expired
    assert (out.outcome, out.state) == ("unknown", "unknown")
    assert row(conn)["state"] == "unknown"
    assert attempts(conn)[0]["outcome"] == "unknown"
    # Nothing runs it again until it is resolved.
    assert claim(ledger, seconds=100).outcome == "unknown"


def test_expired_lease_reclaim_policy_claims_a_new_attempt(ledger: Ledger, conn: Any) -> None:
    claim(ledger, on_expired="reclaim")
    out = claim(ledger, seconds=31)
    assert (out.outcome, out.attempt, out.lease_expires_at) == ("claimed", 2, at(61))
    rows = attempts(conn)
    assert [(r["attempt"], r["outcome"]) for r in rows] == [(1, "unknown"), (2, None)]


def test_on_expired_is_fixed_at_creation(ledger: Ledger) -> None:
    claim(ledger, on_expired="reclaim")
    out = claim(ledger, seconds=31, on_expired="unknown")
    assert out.outcome == "claimed"


def test_sweep_moves_expired_leases_by_policy(ledger: Ledger, conn: Any) -> None:
    claim(ledger, key="a")
    claim(ledger, key="b", on_expired="reclaim")
    claim(ledger, key="live", seconds=20)
    c = claim(ledger, key="done")
    ledger.complete(c, 1, now=at(1))
    assert ledger.sweep(now=at(29)) == 0
    assert ledger.sweep(now=at(30)) == 2
    assert row(conn, "a")["state"] == "unknown"
    assert row(conn, "b")["state"] == "retryable"
    assert row(conn, "live")["state"] == "running"
    assert row(conn, "done")["state"] == "succeeded"
    assert claim(ledger, key="b", seconds=31).outcome == "claimed"


def test_sweep_respects_limit(ledger: Ledger) -> None:
    for i in range(5):
        claim(ledger, key=f"k{i}")
    assert ledger.sweep(limit=2, now=at(60)) == 2
    assert ledger.sweep(limit=10, now=at(60)) == 3
    assert ledger.sweep(now=at(60)) == 0


def test_heartbeat_extends_the_lease_even_after_expiry_if_unnoticed(ledger: Ledger) -> None:
    c = claim(ledger)
    assert ledger.heartbeat(c, lease=LEASE, now=at(20)) == at(50)
    assert ledger.heartbeat(c, lease=LEASE, now=at(55)) == at(85)
    assert claim(ledger, seconds=60).outcome == "running"


def test_heartbeat_after_expiry_was_noticed_raises_lease_lost(ledger: Ledger) -> None:
    c = claim(ledger)
    ledger.sweep(now=at(31))
    with pytest.raises(LeaseLost):
        ledger.heartbeat(c, now=at(32))


def test_heartbeat_with_stale_attempt_never_touches_the_new_one(ledger: Ledger, conn: Any) -> None:
    old = claim(ledger, on_expired="reclaim")
    new = claim(ledger, seconds=31)
    with pytest.raises(LeaseLost):
        ledger.heartbeat(old, lease=timedelta(hours=1), now=at(32))
    assert row(conn)["lease_expires_at"] == new.lease_expires_at


def test_heartbeat_on_missing_action_raises_lease_lost(ledger: Ledger) -> None:
    with pytest.raises(LeaseLost):
        ledger.heartbeat(unclaimed("nope", 1))


# --- reports: recorded / late / superseded ----------------------------------------------

def test_complete_records_and_closes_the_attempt(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    assert ledger.complete(c, {"id": 1}, provider_reference="re_1", now=at(5)) \
        == "recorded"
    r = row(conn)
    assert (r["state"], r["result"], r["provider_reference"], r["completed_at"]) == (
        "succeeded", {"id": 1}, "re_1", at(5))
    a = attempts(conn)[0]
    assert (a["outcome"], a["ended_at"], a["superseded"]) == ("succeeded", at(5), False)


def test_report_after_lease_ran_out_but_unnoticed_is_recorded(ledger: Ledger) -> None:
    c = claim(ledger)
    assert ledger.complete(c, 1, now=at(100)) == "recorded"


@pytest.mark.parametrize("policy", ["unknown", "reclaim"])
def test_late_report_after_sweep_resolves_the_action(ledger: Ledger, conn: Any,
                                                     policy: str) -> None:
    c = claim(ledger, on_expired=policy)
    ledger.sweep(now=at(31))
    assert row(conn)["state"] == ("unknown" if policy == "unknown" else "retryable")
    assert ledger.complete(c, {"id": 1}, now=at(40)) == "late"
    assert row(conn)["state"] == "succeeded"
    assert attempts(conn)[0]["outcome"] == "succeeded"
    assert claim(ledger, seconds=41).outcome == "replay"


def test_late_report_after_claim_noticed_expiry(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    claim(ledger, seconds=31)
    assert ledger.fail(c, {"e": 1}, now=at(40)) == "late"
    assert row(conn)["state"] == "failed"


def test_report_after_own_mark_unknown_is_late(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    assert ledger.mark_unknown(c, {"reason": "timeout"}, now=at(5)) == "recorded"
    assert row(conn)["state"] == "unknown"
    assert claim(ledger, seconds=6).outcome == "unknown"
    assert ledger.complete(c, {"id": 9}, now=at(7)) == "late"
    assert row(conn)["state"] == "succeeded"


def test_report_after_own_retryable_failure_is_superseded(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    assert ledger.fail(c, {"e": "503"}, retryable=True, now=at(1)) == "recorded"
    # The attempt already made its final report: a later one does not rewrite it.
    assert ledger.complete(c, {"id": 1}, now=at(2)) == "superseded"
    assert row(conn)["state"] == "retryable"
    assert claim(ledger, seconds=3).outcome == "claimed"


def test_zombie_report_cannot_overturn_an_operator_resolution(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.sweep(now=at(31))
    ledger.resolve("k", "retryable", note="checked: not charged", now=at(40))
    assert ledger.fail(c, {"e": "late"}, now=at(41)) == "superseded"
    assert row(conn)["state"] == "retryable"
    second = claim(ledger, seconds=42)
    assert (second.outcome, second.attempt) == ("claimed", 2)
    # The resolution was about attempt 1: attempt 2's own late report still resolves.
    ledger.sweep(now=at(80))
    assert ledger.complete(second, {"id": 2}, now=at(81)) == "late"
    assert row(conn)["state"] == "succeeded"


def test_stale_attempt_report_is_superseded_and_never_overwrites(ledger: Ledger, conn: Any) -> None:
    old = claim(ledger, on_expired="reclaim")
    new = claim(ledger, seconds=31)
    for report in (lambda: ledger.complete(old, {"from": "old"}, now=at(32)),
                   lambda: ledger.fail(old, {"from": "old"}, now=at(33)),
                   lambda: ledger.mark_unknown(old, {"from": "old"}, now=at(34))):
        assert report() == "superseded"
    r = row(conn)
    assert (r["state"], r["attempt"], r["result"]) == ("running", 2, None)
    old = attempts(conn)[0]
    assert (old["superseded"], old["outcome"]) == (True, "succeeded")
    assert ledger.complete(new, {"from": "new"}, now=at(40)) == "recorded"
    assert row(conn)["result"] == {"from": "new"}


def test_report_after_final_outcome_is_superseded(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.complete(c, {"n": 1}, now=at(1))
    assert ledger.fail(c, {"n": 2}, now=at(2)) == "superseded"
    assert ledger.complete(c, {"n": 3}, now=at(3)) == "superseded"
    assert row(conn)["result"] == {"n": 1}
    # The attempt's own recorded report stays as it was: it did reach the action.
    a = attempts(conn)[0]
    assert (a["outcome"], a["superseded"], a["result"], a["ended_at"]) == (
        "succeeded", False, {"n": 1}, at(1))


def test_success_reported_after_a_recorded_failure_still_shows(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.fail(c, {"e": "timeout"}, now=at(1))
    assert ledger.complete(c, {"n": 1}, now=at(2)) == "superseded"
    # An attempt's final report is written once: the later success changes nothing.
    a = attempts(conn)[0]
    assert (a["outcome"], a["superseded"], a["result"], a["error"], a["ended_at"]) == (
        "failed", False, None, {"e": "timeout"}, at(1))
    assert row(conn)["state"] == "failed"


def test_report_after_resolution_is_superseded(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.sweep(now=at(31))
    ledger.resolve("k", "failed", error={"by": "operator"}, now=at(40))
    assert ledger.complete(c, {"id": 1}, now=at(41)) == "superseded"
    assert row(conn)["state"] == "failed"


def test_reporting_on_missing_action_or_attempt_raises_rs006(ledger: Ledger) -> None:
    with pytest.raises(InvalidTransition):
        ledger.complete(unclaimed("nope", 1), {})
    with pytest.raises(InvalidTransition):
        ledger.fail(unclaimed("nope", 1), {})
    with pytest.raises(InvalidTransition):
        ledger.mark_unknown(unclaimed("nope", 1), {})
    c = claim(ledger)
    with pytest.raises(InvalidTransition):
        ledger.complete(AttemptToken("k", 2, c.attempt_token), {})


def test_superseded_success_counts_in_multi_effect_actions(ledger: Ledger, conn: Any) -> None:
    old = claim(ledger, on_expired="reclaim")
    new = claim(ledger, seconds=31)
    ledger.complete(new, {"n": 2}, now=at(32))
    ledger.complete(old, {"n": 1}, now=at(33))
    rows = conn.execute("SELECT tenant_id, action_key, operation, successful_attempts "
                        "FROM replaysafe.multi_effect_actions").fetchall()
    assert rows == [("t1", "k", "refund", 2)]


# --- retryable vs terminal failure -------------------------------------------------------

def test_retryable_failure_is_claimed_again_terminal_is_replayed(ledger: Ledger) -> None:
    c = claim(ledger)
    assert ledger.fail(c, {"e": "503"}, retryable=True, now=at(1)) == "recorded"
    again = claim(ledger, seconds=2)
    assert (again.outcome, again.attempt) == ("claimed", 2)
    ledger.fail(again, {"e": "declined"}, now=at(3))
    final = claim(ledger, seconds=4)
    assert (final.outcome, final.state, final.error) == ("replay", "failed", {"e": "declined"})


# --- resolve -----------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["succeeded", "failed", "retryable"])
def test_resolve_moves_unknown_to_each_state(ledger: Ledger, conn: Any, target: str) -> None:
    c = claim(ledger)
    ledger.mark_unknown(c, {"reason": "timeout"}, now=at(1))
    assert ledger.resolve("k", target, result={"ok": 1} if target == "succeeded" else None,
                          provider_reference="re_9", note="checked the provider",
                          now=at(2)) == target
    r = row(conn)
    assert (r["state"], r["resolution_note"], r["resolved_at"]) == (
        target, "checked the provider", at(2))
    expected = {"succeeded": "replay", "failed": "replay", "retryable": "claimed"}[target]
    assert claim(ledger, seconds=3).outcome == expected


@pytest.mark.parametrize("state", ["running", "succeeded", "failed", "retryable"])
def test_resolve_from_anything_but_unknown_raises_rs006(ledger: Ledger, conn: Any,
                                                        state: str) -> None:
    c = claim(ledger)
    if state == "succeeded":
        ledger.complete(c, 1, now=at(1))
    elif state == "failed":
        ledger.fail(c, 1, now=at(1))
    elif state == "retryable":
        ledger.fail(c, 1, retryable=True, now=at(1))
    before = row(conn)
    with pytest.raises(InvalidTransition):
        ledger.resolve("k", "succeeded", now=at(2))
    assert row(conn) == before


def test_resolve_missing_action_raises_rs006(ledger: Ledger) -> None:
    with pytest.raises(InvalidTransition):
        ledger.resolve("nope", ActionState.SUCCEEDED)


# --- purge -------------------------------------------------------------------------------

def test_purge_deletes_only_old_terminal_actions(ledger: Ledger, conn: Any) -> None:
    def make(key: str, how: str) -> None:
        c = claim(ledger, key=key, on_expired="reclaim" if how == "retryable" else "unknown")
        if how == "succeeded":
            ledger.complete(c, 1, now=at(1))
        elif how == "failed":
            ledger.fail(c, 1, now=at(1))
        elif how == "unknown":
            ledger.mark_unknown(c, 1, now=at(1))
        elif how == "retryable":
            ledger.fail(c, 1, retryable=True, now=at(1))

    for how in ("succeeded", "failed", "unknown", "retryable", "running"):
        make(how, how)
    day = 86400
    assert ledger.purge(timedelta(days=1), now=at(day)) == 0  # finished exactly a day ago
    assert ledger.purge(timedelta(days=1), now=at(day + 2)) == 2
    left = {r[0] for r in conn.execute("SELECT action_key FROM replaysafe.actions")}
    assert left == {"unknown", "retryable", "running"}
    kept = {r[0] for r in conn.execute("SELECT DISTINCT action_key FROM replaysafe.action_attempts_v")}
    assert kept == left


def test_purge_is_batched(ledger: Ledger) -> None:
    for i in range(7):
        c = claim(ledger, key=f"k{i}")
        ledger.complete(c, i, now=at(1))
    assert ledger.purge(timedelta(0), limit=3, now=at(2)) == 3
    assert ledger.purge(timedelta(0), limit=3, now=at(2)) == 3
    assert ledger.purge(timedelta(0), limit=3, now=at(2)) == 1
    assert claim(ledger, key="k0", seconds=3).outcome == "claimed"


# --- views -------------------------------------------------------------------------------

def test_audit_views_have_the_spec_columns(conn: Any) -> None:
    want = {
        "actions_v": "tenant_id action_key thread_id operation state attempt on_expired "
                     "idempotency_key request result error provider_reference lease_expires_at "
                     "created_at updated_at completed_at",
        "action_attempts_v": "tenant_id action_key attempt worker_id claimed_at ended_at outcome "
                             "superseded error",
        "unresolved_actions": "tenant_id action_key operation state lease_expires_at age",
        "multi_effect_actions": "tenant_id action_key operation successful_attempts",
    }
    for view, cols in want.items():
        have = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'replaysafe' AND table_name = %s", (view,))}
        assert set(cols.split()) <= have, view


def test_unresolved_actions_lists_unknown_and_expired_running(ledger: Ledger, conn: Any) -> None:
    now = datetime.now(UTC)
    ledger.claim("expired", "op", {}, lease=timedelta(seconds=1), now=now - timedelta(minutes=5))
    c = ledger.claim("unk", "op", {})
    ledger.mark_unknown(c, {"why": "timeout"})
    ledger.claim("live", "op", {})
    rows = dict(conn.execute("SELECT action_key, state FROM replaysafe.unresolved_actions"))
    assert rows == {"expired": "running", "unk": "unknown"}
    age = conn.execute("SELECT age FROM replaysafe.unresolved_actions "
                       "WHERE action_key = 'expired'").fetchone()[0]
    assert timedelta(minutes=4) < age < timedelta(minutes=6)


def test_attempts_keep_worker_and_times(ledger: Ledger, dsn: str, conn: Any) -> None:
    claim(ledger, on_expired="reclaim")
    with Ledger(dsn, tenant_id="t1", worker_id="w2") as second:
        c2 = claim(second, seconds=31)
        second.complete(c2, {"ok": 1}, now=at(35))
    got = [(a.attempt, a.worker_id, a.claimed_at, a.ended_at, a.outcome)
           for a in ledger.attempts("k")]
    assert got == [(1, "w1", at(0), at(31), "unknown"), (2, "w2", at(31), at(35), "succeeded")]
    action = ledger.get("k")
    assert action is not None and action.attempt == 2 and action.worker_id == "w2"
    assert ledger.get("missing") is None
