"""Reconciliation is shared machinery (SPEC §4): a row another transaction holds is skipped
after a short lock wait, never waited for; the payloads are read a page at a time, when
their lookups are about to run; a row that cannot be decoded is that action's error alone.
Real transactions hold the rows (a no-op ``late`` report left open), real PgBouncer in
transaction mode carries the statements."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers import pgbouncer
from helpers.db import bind, dsn_as, own_connection
from helpers.reconcile_rows import (
    SLOW_TO_PRINT,
    held,
    quickly,
    state,
    unknown,
    unprintable,
    workers_of,
)
from psycopg import conninfo as pg_conninfo
from psycopg.pq import TransactionStatus

from replaysafe_pg import AccessDenied, AsyncLedger, InvalidArgument, Ledger, queries
from replaysafe_pg.models import Action
from replaysafe_pg.reconcile import (
    GONE_NOTE,
    HELD_LIMIT,
    HELD_NOTE,
    NOT_TRIED_NOTE,
    ROW_BYTES,
    NotFound,
    ReconcileOutcome,
    Succeeded,
)


@pytest.fixture
def worker_of(dsn: str, make_role: Callable[..., str]) -> Callable[[str], str]:
    """A LOGIN role in replaysafe_worker bound to the tenant."""
    return workers_of(dsn, make_role)


def found(action: Action) -> Succeeded:
    return Succeeded({"order": action.action_key}, provider_reference=f"re_{action.action_key}")


# --- rows held by another transaction ----------------------------------------------------------

def test_a_held_row_is_skipped_quickly_and_the_tenants_others_settled(
        dsn: str, worker_of: Callable[[str], str]) -> None:
    with Ledger(dsn, tenant_id="A") as a, Ledger(dsn, tenant_id="B") as b:
        locked = unknown(a, "a_locked")
        unknown(a, "a_free")
        unknown(b, "b_free")
    def both() -> tuple[dict[str, Any], list[Any]]:
        with Ledger(dsn, tenant_id="A") as led:
            results = {r.action_key: r for r in led.reconcile({"refund": found})}
            # Set in the settlement's own transaction only: the session keeps nothing.
            assert own_connection(led).execute("SHOW lock_timeout").fetchone() == ("0",)
        with Ledger(dsn, tenant_id="B") as led:
            return results, led.reconcile({"refund": found})

    with held(dsn, worker_of("A"), "A", locked) as release:
        results, other = quickly(release, both)
        assert state(dsn, "A", "a_locked") == "unknown"
    assert {k: r.outcome for k, r in results.items()} == {
        "a_locked": ReconcileOutcome.SKIPPED, "a_free": ReconcileOutcome.SUCCEEDED}
    assert results["a_locked"].note == HELD_NOTE
    assert "held by another transaction" in HELD_NOTE
    assert [(r.action_key, r.outcome) for r in other] == [("b_free", "succeeded")]
    assert state(dsn, "A", "a_free") == state(dsn, "B", "b_free") == "succeeded"
    # Once the holder has let go, the next pass settles it.
    with Ledger(dsn, tenant_id="A") as led:
        assert [r.outcome for r in led.reconcile({"refund": found})] == ["succeeded"]


def test_async_a_held_row_is_skipped_quickly_and_the_others_settled(
        dsn: str, worker_of: Callable[[str], str]) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        locked = unknown(a, "a_locked")
        unknown(a, "a_free")

    async def lookup(action: Action) -> Succeeded:
        await asyncio.sleep(0)
        return found(action)

    async def main() -> list[Any]:
        async with AsyncLedger(dsn, tenant_id="A") as led:
            return await led.reconcile({"refund": lookup})

    with held(dsn, worker_of("A"), "A", locked) as release:
        results = quickly(release, lambda: asyncio.run(main()))
    assert [(r.action_key, r.outcome, r.note) for r in results] == [
        ("a_locked", "skipped", HELD_NOTE),
        ("a_free", "succeeded", "reconciled: found at provider, reference re_a_free")]


def test_a_tenant_holding_many_rows_delays_a_pass_by_a_few_lock_waits(
        dsn: str, worker_of: Callable[[str], str]) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        claims = [unknown(a, f"k{i:02}") for i in range(12)]  # 12 waits would be 6 s
        unknown(a, "k99")
    asked: list[str] = []

    def lookup(action: Action) -> Succeeded:
        asked.append(action.action_key)
        return found(action)

    def once() -> list[Any]:
        with Ledger(dsn, tenant_id="A") as led:
            return led.reconcile({"refund": lookup}, concurrency=2)

    with held(dsn, worker_of("A"), "A", *claims) as release:
        results = quickly(release, once)
    notes = [r.note for r in results]
    assert notes[:HELD_LIMIT] == [HELD_NOTE] * HELD_LIMIT
    assert notes[HELD_LIMIT:] == [NOT_TRIED_NOTE] * (13 - HELD_LIMIT)
    assert all(r.outcome == "skipped" for r in results)
    assert len(asked) <= HELD_LIMIT + 1  # the rest is not even read or looked up
    with Ledger(dsn, tenant_id="A") as led:
        assert {r.outcome for r in led.reconcile({"refund": lookup})} == {"succeeded"}


def test_through_a_transaction_pooler_nothing_stays_on_the_server_session(
        dsn: str, admin_dsn: str, make_role: Callable[..., str],
        worker_of: Callable[[str], str]) -> None:
    if not pgbouncer.available():
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    operator = make_role("replaysafe_operator")
    bind(dsn, operator, "A")
    with Ledger(dsn, tenant_id="A") as a:
        locked = unknown(a, "a_locked")
        unknown(a, "a_free")
    # One server connection: every client of the login lands on the same session.
    with pgbouncer.running(admin_dsn, pool_mode="transaction", pool_size=1) as bouncer:
        through = bouncer.through(pg_conninfo.make_conninfo(dsn, user=operator))
        def once() -> list[Any]:
            with Ledger(through, tenant_id="A") as led:
                return led.reconcile({"refund": found})

        with held(dsn, worker_of("A"), "A", locked) as release:
            results = quickly(release, once)
        with psycopg.connect(through, autocommit=True) as c:
            assert c.execute("SHOW lock_timeout").fetchone() == ("0",)
    assert [(r.action_key, r.outcome) for r in results] == [
        ("a_locked", "skipped"), ("a_free", "succeeded")]


# --- payloads: a page at a time, each row decoded alone ------------------------------------------

def test_requests_are_read_a_page_at_a_time_when_their_lookups_run(dsn: str) -> None:
    """With one lookup at a time, a page is one action: the second action's row is read only
    after the first one's lookup, which settles it itself (as another reconciler would)."""
    with Ledger(dsn, tenant_id="A") as a:
        unknown(a, "first")
        unknown(a, "second")
    asked: list[str] = []

    def lookup(action: Action) -> NotFound:
        asked.append(action.action_key)
        if action.action_key == "first":
            with Ledger(dsn, tenant_id="A") as other:
                other.resolve("second", "failed", error={"by": "the other"})
        return NotFound()

    with Ledger(dsn, tenant_id="A") as led:
        results = led.reconcile({"refund": lookup}, concurrency=1)
    assert asked == ["first"]
    assert [(r.action_key, r.outcome, r.note) for r in results] == [
        ("first", "retryable",
         "reconciled: not found at provider, will run again with the same idempotency key"),
        ("second", "already_resolved", GONE_NOTE)]


def test_a_reconcile_holds_one_pages_requests_not_the_batchs(dsn: str) -> None:
    blob = "x" * 900_000  # under the 1 MiB payload limit
    with Ledger(dsn, tenant_id="A") as a:
        for i in range(20):
            unknown(a, f"k{i:02}", {"order": i, "blob": blob})
    del blob
    with Ledger(dsn, tenant_id="A") as led:
        tracemalloc.start()
        try:
            results = led.reconcile({"refund": lambda action: NotFound()}, not_found="leave",
                                    concurrency=2)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert [r.outcome for r in results] == ["left_unknown"] * 20
    # Two pages' worth at most (text and decoded, ~0.9 MB each): not the 20 requests' 18 MB.
    assert peak < 8_000_000, peak


def _undecodable(dsn: str, tenant: str, key: str) -> None:
    """Give the action a request with an integer of 5000 digits: jsonb keeps it, Python's
    json refuses to read it (over sys.get_int_max_str_digits())."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE replaysafe.actions SET request = ('{\"order\": 1, \"n\": ' || "
                  "repeat('7', 5000) || '}')::jsonb WHERE tenant_id = %s AND action_key = %s",
                  (tenant, key))


def test_a_row_that_cannot_be_decoded_is_that_actions_error_alone(dsn: str) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        for key in ("before", "huge", "after"):
            unknown(a, key)
    _undecodable(dsn, "A", "huge")
    asked: list[str] = []

    def lookup(action: Action) -> Succeeded:
        asked.append(action.action_key)
        return found(action)

    with Ledger(dsn, tenant_id="A") as led:
        results = {r.action_key: r for r in led.reconcile({"refund": lookup})}
    assert {k: r.outcome for k, r in results.items()} == {
        "before": "succeeded", "huge": "error", "after": "succeeded"}
    assert sorted(asked) == ["after", "before"]  # nothing asked about the unreadable one
    note = results["huge"].note or ""
    assert note == results["huge"].error
    assert note.startswith("its row cannot be read: ValueError: ") and "4300 digits" in note
    with psycopg.connect(dsn) as c:  # (get() cannot read it either)
        assert c.execute("SELECT state::text FROM replaysafe.actions WHERE action_key = 'huge'"
                         ).fetchone() == ("unknown",)


def test_async_a_row_that_cannot_be_decoded_is_that_actions_error_alone(dsn: str) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        for key in ("before", "huge", "after"):
            unknown(a, key)
    _undecodable(dsn, "A", "huge")

    async def main() -> list[Any]:
        async with AsyncLedger(dsn, tenant_id="A") as led:
            return await led.reconcile({"refund": found})

    assert [(r.action_key, r.outcome) for r in asyncio.run(main())] == [
        ("before", "succeeded"), ("huge", "error"), ("after", "succeeded")]


def test_any_value_the_driver_cannot_load_is_that_actions_error_alone(dsn: str) -> None:
    """A timestamp Python has no datetime for fails the page's whole fetch in psycopg: the
    page is read again action by action."""
    with Ledger(dsn, tenant_id="A") as a:
        for key in ("before", "odd", "after"):
            unknown(a, key)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE replaysafe.actions SET lease_expires_at = 'infinity' "
                  "WHERE tenant_id = 'A' AND action_key = 'odd'")
    with Ledger(dsn, tenant_id="A") as led:
        results = {r.action_key: r for r in led.reconcile({"refund": found})}
    assert {k: r.outcome for k, r in results.items()} == {
        "before": "succeeded", "odd": "error", "after": "succeeded"}
    assert "its row cannot be read" in (results["odd"].note or "")
    assert "timestamp too large" in (results["odd"].note or "")


def test_actions_larger_than_the_payload_limits_are_read_one_at_a_time(dsn: str) -> None:
    """A row whose payloads are larger than the limits (one written before the owner lowered
    them; here: set by hand), or whose JSON text is longer than what it stores (this one
    compresses well), is read alone, after its page, not with the others."""
    with Ledger(dsn, tenant_id="A") as a:
        for i in range(6):
            unknown(a, f"k{i}")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE replaysafe.actions SET request = jsonb_build_object('order', "
                  "action_key, 'blob', repeat('x', %s)) WHERE action_key IN ('k1', 'k2', 'k3', 'k4')",
                  (ROW_BYTES + 100_000,))
    asked: list[str] = []

    def lookup(action: Action) -> NotFound:
        asked.append(action.action_key)
        return NotFound()

    with Ledger(dsn, tenant_id="A") as led:
        tracemalloc.start()
        try:
            results = led.reconcile({"refund": lookup}, not_found="leave")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert [(r.action_key, r.outcome) for r in results] == [
        (f"k{i}", "left_unknown") for i in range(6)]  # reported oldest first all the same
    assert asked == ["k0", "k5", "k1", "k2", "k3", "k4"]  # the page, then each large one
    # One large row at a time (its text and its decoded value, ~3.2 MB each), not four.
    assert peak < 3 * ROW_BYTES, peak


def test_a_role_that_acts_for_no_tenant_is_refused_not_told_nothing_is_due(
        dsn: str, make_role: Callable[..., str]) -> None:
    role = make_role("replaysafe_operator")
    lookups = {"refund": lambda _a: NotFound()}
    with Ledger(dsn_as(dsn, role), tenant_id="A") as led, pytest.raises(AccessDenied,
                                                                        match="acts for no tenant"):
        led.reconcile(lookups)
    bind(dsn, role, "A")
    with Ledger(dsn_as(dsn, role), tenant_id="A") as led:
        assert led.reconcile(lookups) == []


def test_async_a_role_that_acts_for_no_tenant_is_refused(dsn: str,
                                                         make_role: Callable[..., str]) -> None:
    role = make_role("replaysafe_operator")

    async def main() -> None:
        async with AsyncLedger(dsn_as(dsn, role), tenant_id="A") as led:
            with pytest.raises(AccessDenied, match="acts for no tenant"):
                await led.reconcile({"refund": lambda _a: NotFound()})

    asyncio.run(main())


# --- rows the server cannot return ---------------------------------------------------------------

def _outcomes(results: list[Any]) -> dict[str, str]:
    return {r.action_key: r.outcome.value for r in results}


def test_a_page_measures_stored_sizes_before_it_prints_any_payload(dsn: str) -> None:
    """A row stored larger than ROW_BYTES is left out of its page unprinted: this one's JSON
    text is more than the server can produce, and the page is read all the same."""
    with Ledger(dsn, tenant_id="A") as a:
        unknown(a, "large")
        unknown(a, "small")
    assert unprintable(dsn, "A", "large", stored_large=True) > ROW_BYTES
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute(queries.get("reconcile_page"), {
            "tenant_id": "A", "action_keys": ["large", "small"], "row_bytes": ROW_BYTES}).fetchall()
    assert {r[1]: (r[8], r[19]) for r in rows} == {
        "large": (None, False), "small": ('{"order": "small"}', True)}


def test_a_row_the_server_cannot_return_is_that_actions_error_alone(dsn: str) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        for key in ("before", "poison", "after"):
            unknown(a, key)
    unprintable(dsn, "A", "poison")
    asked: list[str] = []

    def lookup(action: Action) -> Succeeded:
        asked.append(action.action_key)
        return found(action)

    with Ledger(dsn, tenant_id="A") as led:
        results = led.reconcile({"refund": lookup})
    assert _outcomes(results) == {"before": "succeeded", "poison": "error", "after": "succeeded"}
    assert sorted(asked) == ["after", "before"]
    [poison] = [r for r in results if r.action_key == "poison"]
    assert poison.note == poison.error
    assert (poison.note or "").startswith(
        "its row cannot be read: the server cannot return it: SQLSTATE 54000: ")
    assert "exceeds maximum allowed length" in (poison.note or "")
    assert state(dsn, "A", "before") == state(dsn, "A", "after") == "succeeded"


def test_async_a_row_the_server_cannot_return_is_that_actions_error_alone(dsn: str) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        for key in ("before", "poison", "after"):
            unknown(a, key)
    unprintable(dsn, "A", "poison")

    async def main() -> list[Any]:
        async with AsyncLedger(dsn, tenant_id="A") as led:
            return await led.reconcile({"refund": found})

    results = asyncio.run(main())
    assert _outcomes(results) == {"before": "succeeded", "poison": "error", "after": "succeeded"}
    assert "SQLSTATE 54000" in (results[1].note or "")


def test_a_large_row_the_server_cannot_return_is_that_actions_error_alone(dsn: str) -> None:
    """Left out of its page (stored larger than ROW_BYTES), then read alone: it fails there."""
    with Ledger(dsn, tenant_id="A") as a:
        for key in ("large", "after"):
            unknown(a, key)
    unprintable(dsn, "A", "large", stored_large=True)
    with Ledger(dsn, tenant_id="A") as led:
        results = led.reconcile({"refund": found})
    assert _outcomes(results) == {"large": "error", "after": "succeeded"}
    assert "SQLSTATE 54000" in (results[0].note or "")


def test_a_row_whose_read_outlasts_statement_timeout_is_that_actions_error_alone(
        dsn: str) -> None:
    """Printing the row's request takes seconds: under a statement_timeout of 300 ms its page
    is cancelled, and then its own read; the others are read and settled."""
    with Ledger(dsn, tenant_id="A") as a:
        for key in ("before", "slow", "after"):
            unknown(a, key)
    unprintable(dsn, "A", "slow", numbers=SLOW_TO_PRINT)
    timed = pg_conninfo.make_conninfo(dsn, options="-c statement_timeout=300")
    with Ledger(timed, tenant_id="A") as led:
        results = led.reconcile({"refund": found})
    assert _outcomes(results) == {"before": "succeeded", "slow": "error", "after": "succeeded"}
    assert results[1].note == (
        "its row cannot be read: the server cannot return it: SQLSTATE 57014: canceling "
        "statement due to statement timeout; nothing looked up or written (a later pass may "
        "read it, or settle it by hand: resolve)")


# --- a connection of the caller's ----------------------------------------------------------------

def test_a_connection_inside_the_callers_transaction_is_refused_before_anything_is_sent(
        dsn: str) -> None:
    """Each settlement is a transaction of its own: inside the caller's, its lock wait would
    stay set there and a held row would abort it. Refused, the transaction is untouched."""
    with Ledger(dsn, tenant_id="A") as a:
        unknown(a, "k")
    asked: list[str] = []

    def lookup(action: Action) -> Succeeded:
        asked.append(action.action_key)
        return found(action)

    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")  # the caller's transaction is open from here
        with Ledger(conn, tenant_id="A") as led, pytest.raises(
                InvalidArgument, match="inside an open transaction"):
            led.reconcile({"refund": lookup})
        assert asked == []
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)
        conn.rollback()
        # Idle, the same connection reconciles, each settlement in a transaction of its own.
        with Ledger(conn, tenant_id="A") as led:
            assert _outcomes(led.reconcile({"refund": lookup})) == {"k": "succeeded"}
        assert conn.info.transaction_status == TransactionStatus.IDLE
        assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)
        conn.rollback()
    assert state(dsn, "A", "k") == "succeeded"


def test_async_a_connection_inside_the_callers_transaction_is_refused(dsn: str) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        unknown(a, "k")

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await conn.execute("SELECT 1")
            async with AsyncLedger(conn, tenant_id="A") as led:
                with pytest.raises(InvalidArgument, match=r"AsyncLedger\.reconcile was given a "
                                                           "connection inside an open transaction"):
                    await led.reconcile({"refund": found})
            assert conn.info.transaction_status == TransactionStatus.INTRANS
            cur = await conn.execute("SHOW lock_timeout")
            assert await cur.fetchone() == ("0",)

    asyncio.run(main())
    assert state(dsn, "A", "k") == "unknown"
