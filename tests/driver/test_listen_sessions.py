"""The LISTEN session of Ledger.run's waiters: one per place and process, opened while
someone waits and closed when nobody does or no ledger needs it."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from replaysafe_pg import AsyncLedger, Ledger, _conn, _listen


def _listen_sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND query = 'LISTEN replaysafe_actions'").fetchone()
    assert row is not None
    return int(row[0])


def _until(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _held(dsn: str, key: str, hold: float) -> threading.Thread:
    """Another worker holds ``key`` for ``hold`` seconds, then completes it."""
    holder = Ledger(dsn, tenant_id="t1", worker_id="holder")
    claim = holder.claim(key, "op", {}, lease=10)

    def finish() -> None:
        time.sleep(hold)
        holder.complete(claim, {"done": True})
        holder.close()

    thread = threading.Thread(target=finish)
    thread.start()
    return thread


def _waiting(ledger: Ledger, tool: Callable[[], Any],
             **options: Any) -> tuple[threading.Thread, list[Any]]:
    """A thread whose ``run`` waits for another worker's action: back once the waiter's
    first claim is answered (it subscribed); the list gets its Execution."""
    out: list[Any] = []
    waiter = threading.Thread(target=lambda: out.append(ledger.run("op", tool, {}, **options)))
    waiter.start()
    listener = ledger._source.listener()
    assert listener is not None
    assert _until(lambda: bool(listener._subscribers.by_key))
    return waiter, out


def test_the_waiters_of_many_ledgers_share_one_session(dsn: str) -> None:
    done = _held(dsn, "busy", 1.0)
    ledgers = [Ledger(dsn, tenant_id="t1", worker_id=f"w{n}") for n in range(5)]
    seen: list[int] = []
    waiting = [threading.Thread(target=lambda led=led: seen.append(
        led.run("op", lambda: None, {}, key="busy", wait_timeout=10).attempt)) for led in ledgers]
    for t in waiting:
        t.start()
    assert _until(lambda: _listen_sessions(dsn) >= 1)
    assert _listen_sessions(dsn) == 1
    for t in waiting:
        t.join()
    done.join()
    assert seen == [1] * 5
    for led in ledgers:
        led.close()


def test_the_session_closes_when_no_ledger_refers_to_it(dsn: str) -> None:
    done = _held(dsn, "busy", 0.5)
    ledger = Ledger(dsn, tenant_id="t1")
    assert ledger.run("op", lambda: None, {}, key="busy", wait_timeout=10).replay
    done.join()
    assert _listen_sessions(dsn) == 1, "kept for the next wait"
    ledger.close()
    del ledger
    gc.collect()
    assert _until(lambda: _listen_sessions(dsn) == 0), "closed with its last ledger"


def test_the_session_closes_when_nobody_waits(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_listen, "IDLE_CLOSE", 0.5)
    done = _held(dsn, "busy", 0.5)
    with Ledger(dsn, tenant_id="t1") as ledger:
        assert ledger.run("op", lambda: None, {}, key="busy", wait_timeout=10).replay
        done.join()
        assert _until(lambda: _listen_sessions(dsn) == 0), "closed while the ledger lives"
        done = _held(dsn, "busy2", 0.5)
        assert ledger.run("op", lambda: None, {}, key="busy2", wait_timeout=10).replay
        done.join()


def test_a_waiter_on_a_given_connection_claims_beside_it(dsn: str) -> None:
    """The caller's connection may be inside a transaction of its own while a run waits."""
    with psycopg.connect(dsn) as conn:
        ledger = Ledger(conn, tenant_id="t1")
        holder = Ledger(dsn, tenant_id="t1", worker_id="holder")
        claim = holder.claim("busy", "op", {}, lease=10)
        waiter, out = _waiting(ledger, lambda: None, key="busy", wait_timeout=10)
        with conn.transaction():
            conn.execute("SELECT 1")
            holder.complete(claim, {"done": True})
            waiter.join(5)
        holder.close()
        assert out and out[0].status == "succeeded" and out[0].replay


def test_an_async_ledger_waits_in_one_event_loop_after_another(dsn: str) -> None:
    ledger = AsyncLedger(dsn, tenant_id="t1")

    async def wait_for(key: str) -> Any:
        done = _held(dsn, key, 0.3)
        ex = await ledger.run("op", lambda: None, {}, key=key, wait_timeout=10)
        await asyncio.to_thread(done.join)
        return ex

    assert asyncio.run(wait_for("a")).replay
    assert asyncio.run(wait_for("b")).replay

    async def close() -> None:
        await ledger.close()

    asyncio.run(close())
    gc.collect()
    assert _until(lambda: _listen_sessions(dsn) == 0)


def test_an_async_ledgers_waits_in_one_loop_share_its_session(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real = _conn._aconnect_to

    async def counting(conninfo: str) -> Any:
        opened.append(conninfo)
        return await real(conninfo)

    monkeypatch.setattr(_conn, "_aconnect_to", counting)

    async def body() -> None:
        async with AsyncLedger(dsn, tenant_id="t1") as ledger:
            for key in ("a", "b", "c"):
                done = _held(dsn, key, 0.3)
                assert (await ledger.run("op", lambda: None, {}, key=key, wait_timeout=10)).replay
                await asyncio.to_thread(done.join)

    asyncio.run(body())
    assert len(opened) == 1


def test_a_flood_of_notifications_makes_a_waiter_claim_at_most_ten_times_a_second(
        dsn: str) -> None:
    """A NOTIFY is anyone's to send (the channel and the keys are the database's)."""
    holder = Ledger(dsn, tenant_id="t1", worker_id="holder")
    claim = holder.claim("busy", "op", {}, lease=10)
    with Ledger(dsn, tenant_id="t1") as ledger:
        claims: list[float] = []
        real = ledger._source.execute_aside

        def counted(*args: Any, **kwargs: Any) -> Any:
            claims.append(time.monotonic())
            return real(*args, **kwargs)

        ledger._source.execute_aside = counted  # type: ignore[method-assign]
        stop = threading.Event()

        def flood() -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    c.execute("SELECT pg_notify('replaysafe_actions', %s)",
                              (claim.idempotency_key,))

        flooder = threading.Thread(target=flood)
        flooder.start()
        try:
            ex = ledger.run("op", lambda: None, {}, key="busy", wait_timeout=2)
        finally:
            stop.set()
            flooder.join()
        holder.close()
    assert ex.status == "running"
    assert 3 <= len(claims) <= 2 / 0.1 + 2


def test_a_claim_a_waiter_takes_beside_a_given_connection_is_recorded_there(dsn: str) -> None:
    """The owner's lease runs out while the caller's connection is inside a transaction of
    its own: the waiter takes the action over, runs the tool, and records it beside that
    transaction, so the caller's rollback cannot erase the record."""
    holder = Ledger(dsn, tenant_id="t1", worker_id="holder")
    holder.claim("busy", "op", {}, lease=1, on_expired="reclaim")  # and never reports
    holder.close()
    ran: list[int] = []
    with psycopg.connect(dsn) as conn:
        ledger = Ledger(conn, tenant_id="t1")
        waiter, out = _waiting(ledger, lambda: ran.append(1) or {"done": True}, key="busy",
                               lease=5, on_expired="reclaim", wait_timeout=10)
        with conn.transaction():
            conn.execute("SELECT 1")
            waiter.join(10)
            raise psycopg.Rollback
    assert out and out[0].status == "succeeded" and not out[0].replay and ran == [1]
    with Ledger(dsn, tenant_id="t1") as check:
        action = check.get("busy")
    assert action is not None and action.state == "succeeded"

