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

from replaysafe_pg import AsyncLedger, Ledger, _listen


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


def test_the_waiters_of_many_ledgers_share_one_session(dsn: str) -> None:
    done = _held(dsn, "busy", 1.0)
    ledgers = [Ledger(dsn, tenant_id="t1", worker_id=f"w{n}") for n in range(5)]
    seen: list[int] = []
    waiting = [threading.Thread(target=lambda led=led: seen.append(
        led.run("op", lambda: None, {}, key="busy", wait_timeout=10).attempt)) for led in ledgers]
    for t in waiting:
        t.start()
    time.sleep(0.5)
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
        out: list[Any] = []
        waiter = threading.Thread(target=lambda: out.append(
            ledger.run("op", lambda: None, {}, key="busy", wait_timeout=10)))
        waiter.start()
        time.sleep(0.5)  # the waiter's first claim (on the given connection) is answered
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
