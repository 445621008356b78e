"""The driver over each kind of connection source: AsyncLedger with a DSN, an AsyncConnection
and an AsyncConnectionPool; Ledger with a Connection (autocommit or not: inside the caller's
transaction a call joins it) and a ConnectionPool."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from replaysafe_pg import (
    AsyncLedger,
    AttemptToken,
    FingerprintConflict,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    Ledger,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def exists(dsn: str, key: str) -> bool:
    with psycopg.connect(dsn) as c:
        return c.execute("SELECT count(*) FROM replaysafe.actions WHERE action_key = %s",
                         (key,)).fetchone() == (1,)


async def exercise_async(led: AsyncLedger, key: str = "k") -> None:
    c = await led.claim(key, "refund", {"order": 1}, now=T0)
    assert (c.outcome, c.attempt) == ("claimed", 1)
    assert (await led.claim(key, "refund", {"order": 1}, now=T0)).outcome == "running"
    assert await led.heartbeat(c, lease=60, now=T0) == T0 + timedelta(seconds=60)
    assert await led.complete(c, {"id": "re_1"}, now=T0) == "recorded"
    replay = await led.claim(key, "refund", {"order": 1.0}, now=T0)
    assert (replay.outcome, replay.result) == ("replay", {"id": "re_1"})
    action = await led.get(key)
    assert action is not None and action.state == "succeeded"
    assert [a.outcome for a in await led.attempts(key)] == ["succeeded"]
    with pytest.raises(FingerprintConflict):
        await led.claim(key, "refund", {"order": 2})
    with pytest.raises(LeaseLost):
        await led.heartbeat(c)
    with pytest.raises(InvalidTransition):
        await led.resolve(key, "failed")
    with pytest.raises(InvalidArgument):
        await led.claim("other", "refund", {}, lease=-1)
    with pytest.raises(InvalidArgument):
        await led.claim("", "refund", {})
    other = await led.claim(f"{key}-2", "op", {}, on_expired="reclaim", now=T0)
    assert await led.fail(other, {"e": 1}, retryable=True, now=T0) == "recorded"
    c3 = await led.claim(f"{key}-3", "op", {}, now=T0)
    assert await led.mark_unknown(c3, {"t": 1}, now=T0) == "recorded"
    assert await led.resolve(f"{key}-3", "succeeded", result={"ok": 1}, now=T0) == "succeeded"
    assert await led.sweep(now=T0) == 0
    assert await led.purge(timedelta(0), now=T0 + timedelta(seconds=1)) == 2
    batch = await led.claim_many([("b1", "op", {}), ("b2", "op", {})], now=T0)
    assert [b.outcome for b in batch] == ["claimed", "claimed"]


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


def test_async_ledger_with_a_dsn(dsn: str) -> None:
    async def main() -> None:
        async with AsyncLedger(dsn, tenant_id="t1", worker_id="w") as led:
            await exercise_async(led)
    run(main)


def test_async_ledger_with_an_autocommit_connection(dsn: str) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await exercise_async(AsyncLedger(conn, tenant_id="t1", worker_id="w"))
            assert not conn.closed  # a given connection stays the caller's
    run(main)


def test_async_ledger_joins_and_rolls_back_with_the_callers_transaction(dsn: str) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            led = AsyncLedger(conn, tenant_id="t1", worker_id="w")
            await led.claim("alone", "op", {})  # idle connection: its own transaction
            assert exists(dsn, "alone")
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await led.claim("joined", "op", {})
                    raise RuntimeError("the caller's work failed")
            assert not exists(dsn, "joined")
    run(main)


def test_async_ledger_with_a_pool(dsn: str) -> None:
    async def main() -> None:
        async with AsyncConnectionPool(dsn, min_size=2, max_size=4, open=False) as pool:
            await pool.open(wait=True)
            led = AsyncLedger(pool, tenant_id="t1", worker_id="w")
            await exercise_async(led)
            # Concurrent claims of one new key through the pool: one winner.
            outcomes = await asyncio.gather(*[led.claim("race", "op", {}, now=T0)
                                              for _ in range(8)])
            assert sorted(o.outcome for o in outcomes) == ["claimed"] + ["running"] * 7
    run(main)


def test_async_ledger_rejects_what_it_cannot_use() -> None:
    with pytest.raises(TypeError):
        AsyncLedger(42)  # type: ignore[arg-type]


# --- the sync Ledger on a given connection or pool ---------------------------------------------

def exercise_sync(led: Ledger, key: str = "k") -> None:
    c = led.claim(key, "refund", {"order": 1}, now=T0)
    assert (c.outcome, c.attempt) == ("claimed", 1)
    assert led.complete(c, {"id": 1}, now=T0) == "recorded"
    assert led.claim(key, "refund", {"order": 1}, now=T0).outcome == "replay"
    with pytest.raises(FingerprintConflict):
        led.claim(key, "refund", {"order": 2})
    with pytest.raises(InvalidTransition):
        led.complete(AttemptToken("missing", 1, "rsat_" + "0" * 64), {})


@pytest.fixture
def plain_conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn) as c:  # not autocommit
        yield c


def test_ledger_with_an_autocommit_connection(conn: psycopg.Connection[Any], dsn: str) -> None:
    exercise_sync(Ledger(conn, tenant_id="t1", worker_id="w"))
    assert exists(dsn, "k")
    assert not conn.closed


def test_ledger_on_an_idle_plain_connection_commits_each_call(
        plain_conn: psycopg.Connection[Any], dsn: str) -> None:
    led = Ledger(plain_conn, tenant_id="t1", worker_id="w")
    exercise_sync(led)
    assert exists(dsn, "k")
    assert plain_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # An error inside its own transaction leaves the connection usable.
    with pytest.raises(FingerprintConflict):
        led.claim("k", "other", {})
    assert led.claim("k2", "op", {}).outcome == "claimed"


def test_ledger_joins_the_callers_transaction_and_rolls_back_with_it(
        plain_conn: psycopg.Connection[Any], dsn: str) -> None:
    led = Ledger(plain_conn, tenant_id="t1", worker_id="w")
    plain_conn.execute("SELECT 1")  # the caller's transaction is open
    assert led.claim("joined", "op", {}).outcome == "claimed"
    assert not exists(dsn, "joined")  # not committed yet: it is part of the caller's work
    plain_conn.rollback()
    assert not exists(dsn, "joined")

    with pytest.raises(RuntimeError), plain_conn.transaction():
        led.claim("block", "op", {})
        raise RuntimeError("the caller's work failed")
    assert not exists(dsn, "block")

    with plain_conn.transaction():
        led.claim("kept", "op", {})
    assert exists(dsn, "kept")


def test_ledger_with_a_pool(dsn: str) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        led = Ledger(pool, tenant_id="t1", worker_id="w")
        exercise_sync(led)
        assert exists(dsn, "k")


def test_ledger_with_a_dsn_reconnects_after_the_connection_is_lost(dsn: str,
                                                                  admin_dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1", worker_id="w") as led:
        led.claim("a", "op", {})
        pid = led._source._own.info.backend_pid  # type: ignore[union-attr]
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        # The server closed it while idle: the next call reconnects, it never raises.
        assert led.claim("b", "op", {}).outcome == "claimed"
        assert led._source._own.info.backend_pid != pid  # type: ignore[union-attr]


# --- run never joins the caller's transaction (docs/run.md) ------------------------------------------

class Tool:
    """Counts its calls: the effect that must not happen twice."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, order: int) -> dict[str, int]:
        self.calls += 1
        return {"refund": order}


def test_run_refuses_a_connection_inside_the_callers_transaction(
        plain_conn: psycopg.Connection[Any], dsn: str) -> None:
    """Joined, the claim would vanish with the caller's rollback and the next run would call
    the tool again. Refused: nothing ran, nothing was written, the transaction is untouched."""
    tool = Tool()
    led = Ledger(plain_conn, tenant_id="t1", worker_id="w")
    plain_conn.execute("SELECT 1")  # the caller's transaction is open
    with pytest.raises(InvalidArgument, match="transaction"):
        led.run("refund", tool, {"order": 1}, key="k")
    with pytest.raises(InvalidArgument, match="transaction"):
        led.run_many([("refund", tool, {"order": 2}, "k2")])
    assert tool.calls == 0
    assert plain_conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert not exists(dsn, "k") and not exists(dsn, "k2")
    plain_conn.rollback()
    with pytest.raises(InvalidArgument, match="transaction"), plain_conn.transaction():
        led.run("refund", tool, {"order": 1}, key="k")
    assert tool.calls == 0 and not exists(dsn, "k")
    # Outside a transaction run commits its claim and record: the tool runs once.
    first = led.run("refund", tool, {"order": 1}, key="k")
    again = led.run("refund", tool, {"order": 1}, key="k")
    assert (first.replay, again.replay, tool.calls) == (False, True, 1)
    assert exists(dsn, "k")


def test_run_refuses_an_explicit_transaction_on_an_autocommit_connection(
        conn: psycopg.Connection[Any], dsn: str) -> None:
    tool = Tool()
    led = Ledger(conn, tenant_id="t1", worker_id="w")
    with pytest.raises(InvalidArgument, match="transaction"), conn.transaction():
        led.run("refund", tool, {"order": 1}, key="k")
    assert tool.calls == 0 and not exists(dsn, "k")


def test_async_run_refuses_a_connection_inside_the_callers_transaction(dsn: str) -> None:
    tool = Tool()

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            led = AsyncLedger(conn, tenant_id="t1", worker_id="w")
            await conn.execute("SELECT 1")
            with pytest.raises(InvalidArgument, match="transaction"):
                await led.run("refund", tool, {"order": 1}, key="k")
            with pytest.raises(InvalidArgument, match="transaction"):
                await led.run_many([("refund", tool, {"order": 2}, "k2")])
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            assert not exists(dsn, "k") and not exists(dsn, "k2")
            await conn.rollback()
            assert (await led.run("refund", tool, {"order": 1}, key="k")).replay is False
            assert (await led.run("refund", tool, {"order": 1}, key="k")).replay is True
    run(main)
    assert tool.calls == 1
