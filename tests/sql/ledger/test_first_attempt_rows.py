"""Revision 0007: an action's first attempt has no row in action_attempts until something
other than its own report changes the action. The audit view must answer exactly as when
every attempt had its row: each transition below is checked against the row 0006 wrote.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as
from helpers.fixed_clock import LEASE, at

import replaysafe_pg
from replaysafe_pg import Ledger

COLUMNS = "attempt, worker_id, claimed_at, ended_at, outcome::text, superseded, result, error"


def claim(led: Ledger, seconds: float = 0, **kw: Any) -> Any:
    return led.claim("k", "refund", {"order": 42}, lease=LEASE, now=at(seconds), **kw)


def view(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(f"SELECT {COLUMNS} FROM replaysafe.action_attempts_v "
                        "WHERE action_key = 'k' ORDER BY attempt").fetchall()


def stored(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(f"SELECT {COLUMNS} FROM replaysafe.action_attempts "
                        "WHERE action_key = 'k' ORDER BY attempt").fetchall()


def test_claim_and_complete_write_no_attempt_row_yet_the_view_shows_it(
        ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    assert stored(conn) == []
    assert view(conn) == [(1, "w1", at(0), None, None, False, None, None)]
    ledger.complete(c, {"ok": True}, now=at(1))
    assert stored(conn) == []
    assert view(conn) == [(1, "w1", at(0), at(1), "succeeded", False, {"ok": True}, None)]
    ledger.complete(c, {"ok": True}, now=at(2))  # a retried commit that had landed
    assert view(conn) == [(1, "w1", at(0), at(1), "succeeded", False, {"ok": True}, None)]


@pytest.mark.parametrize("how", ["failed", "retryable", "unknown"])
def test_the_attempts_own_report_is_its_row(ledger: Ledger, conn: Any, how: str) -> None:
    c = claim(ledger)
    if how == "unknown":
        ledger.mark_unknown(c, {"why": "timeout"}, now=at(1))
    else:
        ledger.fail(c, {"why": "card"}, retryable=how == "retryable", now=at(1))
    error = {"why": "timeout" if how == "unknown" else "card"}
    assert stored(conn) == []
    assert view(conn) == [(1, "w1", at(0), at(1), how, False, None, error)]


def test_a_second_attempt_keeps_the_first_ones_row(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.fail(c, {"why": "busy"}, retryable=True, now=at(1))
    claim(ledger, seconds=2)
    first = (1, "w1", at(0), at(1), "retryable", False, None, {"why": "busy"})
    assert stored(conn) == [first, (2, "w1", at(2), None, None, False, None, None)]
    assert view(conn) == stored(conn)


@pytest.mark.parametrize("noticed_by", ["sweep", "claim"])
def test_an_expiry_writes_the_first_attempts_row(ledger: Ledger, conn: Any,
                                                 noticed_by: str) -> None:
    claim(ledger)
    if noticed_by == "sweep":
        assert ledger.sweep(now=at(31)) == 1
    else:
        assert claim(ledger, seconds=31).outcome == "unknown"
    expired = {"reason": "lease_expired", "lease_expires_at": "2026-01-01T12:00:30+00:00"}
    assert stored(conn) == [(1, "w1", at(0), at(31), "unknown", False, None, expired)]
    assert view(conn) == stored(conn)


def test_an_operators_resolution_leaves_the_attempts_own_outcome(
        ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.mark_unknown(c, {"why": "timeout"}, now=at(1))
    ledger.resolve("k", "succeeded", result={"found": True}, note="seen at the bank", now=at(5))
    attempt = (1, "w1", at(0), at(1), "unknown", False, None, {"why": "timeout"})
    assert stored(conn) == [attempt] and view(conn) == [attempt]
    # ... and a zombie report of that attempt after the resolution is kept, superseded.
    assert ledger.complete(c, {"late": True}, now=at(6)) == "superseded"
    assert view(conn) == [(1, "w1", at(0), at(1), "succeeded", True, {"late": True},
                           {"why": "timeout"})]


def test_a_reopen_leaves_the_attempts_own_failure(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.fail(c, {"why": "card"}, now=at(1))
    ledger.reopen("k", note="card replaced", now=at(5))
    attempt = (1, "w1", at(0), at(1), "failed", False, None, {"why": "card"})
    assert stored(conn) == [attempt] and view(conn) == [attempt]


def test_a_late_report_after_the_attempts_own_unknown(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.mark_unknown(c, {"why": "timeout"}, now=at(1))
    assert ledger.complete(c, {"ok": True}, now=at(2)) == "late"
    assert view(conn) == [(1, "w1", at(0), at(1), "succeeded", False, {"ok": True},
                           {"why": "timeout"})]


def test_a_success_after_the_attempts_own_failure_shows(ledger: Ledger, conn: Any) -> None:
    c = claim(ledger)
    ledger.fail(c, {"why": "card"}, now=at(1))
    assert ledger.complete(c, {"ok": True}, now=at(2)) == "superseded"
    # An attempt's final report is written once: the later success leaves its row as it was.
    assert view(conn) == [(1, "w1", at(0), at(1), "failed", False, None, {"why": "card"})]
    assert ledger.get("k").state == "failed"  # type: ignore[union-attr]


def test_a_bound_reader_sees_its_own_first_attempts_only(
        dsn: str, make_role: Callable[..., str]) -> None:
    for tenant in ("A", "B"):
        with Ledger(dsn, tenant_id=tenant, worker_id="w1") as led:
            claim(led)
    reader = make_role("replaysafe_auditor")
    bind(dsn, reader, "A")
    with connect_as(dsn, reader) as c:
        assert c.execute("SELECT tenant_id, attempt FROM replaysafe.action_attempts_v"
                         ).fetchall() == [("A", 1)]


def test_0007_downgrade_writes_every_first_attempts_row(empty_dsn: str) -> None:
    dsn = empty_dsn
    replaysafe_pg.migrate(dsn)
    with Ledger(dsn, tenant_id="t1", worker_id="w1") as led, \
            psycopg.connect(dsn, autocommit=True) as conn:
        led.complete(claim(led), {"ok": True}, now=at(1))
        led.claim("running", "refund", {}, lease=LEASE, now=at(0))
        before = conn.execute(f"SELECT action_key, {COLUMNS} FROM replaysafe.action_attempts_v "
                              "ORDER BY 1, 2").fetchall()
        assert len(before) == 2
        replaysafe_pg.downgrade(dsn, "0006")
        after = conn.execute(f"SELECT action_key, {COLUMNS} FROM replaysafe.action_attempts "
                             "ORDER BY 1, 2").fetchall()
        assert after == before
        # 0006's complete (no attempt token: the driver speaks 0011's) updates the row the
        # downgrade wrote.
        conn.execute("SELECT replaysafe.complete_action(p_tenant_id => 't1', "
                     "p_action_key => 'running', p_attempt => 1, p_result => '{\"ok\": 2}', "
                     "p_now => %s)", (at(1),))
        assert conn.execute("SELECT outcome::text FROM replaysafe.action_attempts "
                            "WHERE action_key = 'running'").fetchone() == ("succeeded",)
        replaysafe_pg.migrate(dsn)  # and up again: the stored rows are used as they are
        assert conn.execute(f"SELECT action_key, {COLUMNS} FROM replaysafe.action_attempts_v "
                            "ORDER BY 1, 2").fetchall() == conn.execute(
            f"SELECT action_key, {COLUMNS} FROM replaysafe.action_attempts ORDER BY 1, 2").fetchall()


def test_the_downgrade_waits_for_a_claim_in_flight(empty_dsn: str) -> None:
    """The downgrade locks the actions first: a worker's open claim (0007 code, no attempt
    row) commits before the rows are written, so 0006 finds a row for it (without
    the lock, claims committed during the downgrade were left without one)."""
    dsn = empty_dsn
    replaysafe_pg.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as worker:
        claimed = worker.execute("SELECT attempt_token FROM replaysafe.claim_action("
                                 "p_tenant_id => 't1', p_action_key => 'k', p_operation => 'refund', "
                                 "p_request => '{}', p_worker_id => 'w1', p_now => %s)",
                                 (at(0),)).fetchone()
        assert claimed is not None
        down = threading.Thread(target=replaysafe_pg.downgrade, args=(dsn, "0006"))
        down.start()
        pid = worker.info.backend_pid
        for _ in range(1000):  # until the downgrade waits for the worker's lock
            if conn.execute("SELECT count(*) FROM pg_stat_activity "
                            "WHERE %s = ANY (pg_blocking_pids(pid))", (pid,)).fetchone() == (1,):
                break
            down.join(0.01)
        else:
            raise AssertionError("the downgrade never waited for the worker")
        worker.execute("SELECT replaysafe.complete_action(p_tenant_id => 't1', p_action_key => 'k', "
                       "p_attempt => 1, p_attempt_token => %s, p_result => '{\"ok\": 1}', "
                       "p_now => %s)", (claimed[0], at(1)))
        worker.commit()
        down.join(60)
        assert replaysafe_pg.current_revision(dsn) == "0006"
        assert conn.execute("SELECT attempt, outcome::text, ended_at FROM replaysafe.action_attempts "
                            "WHERE action_key = 'k'").fetchall() == [(1, "succeeded", at(1))]
