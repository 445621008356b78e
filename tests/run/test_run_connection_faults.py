"""``run`` rides out its database (docs/run.md, "When the database goes away"), one fault at a
time, through a TCP proxy (tests/helpers/proxy.py): a claim whose answer was lost is claimed
again with its token, an idle connection the server closed is replaced without an error, a
waiter's LISTEN connection is opened again, and what cannot be ridden out reaches the caller
as DatabaseUnavailable with the driver's error chained. The storms are in tests/faults/.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers.proxy import Proxy
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from replaysafe_pg import AsyncLedger, DatabaseUnavailable, Ledger


@pytest.fixture
def proxy(dsn: str) -> Iterator[Proxy]:
    p = Proxy(dsn)
    yield p
    p.close()


class Tool:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, n: int) -> dict[str, int]:
        self.calls += 1
        return {"n": n}


def terminate(dsn: str, pids: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for pid in pids:
            c.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


# --- a claim whose answer was lost ------------------------------------------------------------

def test_a_claim_whose_answer_was_lost_is_claimed_again_with_its_token(proxy: Proxy,
                                                                       dsn: str) -> None:
    tool = Tool()
    with Ledger(proxy.dsn, tenant_id="t1", worker_id="w") as led:
        assert led.get("warm") is None  # connected: the next answer is the claim's
        proxy.drop_next_answer()
        execution = led.run("op", tool, {"n": 1}, key="k", wait_timeout=5)
        assert proxy.dropped_answers == 1
        assert (execution.status, execution.attempt, execution.replay) == ("succeeded", 1, False)
        assert tool.calls == 1
        assert [a.attempt for a in led.attempts("k")] == [1]


def test_async_a_claim_whose_answer_was_lost_is_claimed_again(proxy: Proxy) -> None:
    tool = Tool()

    async def main() -> None:
        async with AsyncLedger(proxy.dsn, tenant_id="t1", worker_id="w") as led:
            assert await led.get("warm") is None
            proxy.drop_next_answer()
            execution = await led.run("op", tool, {"n": 1}, key="k", wait_timeout=5)
            assert proxy.dropped_answers == 1
            assert (execution.status, execution.attempt) == ("succeeded", 1)
            assert tool.calls == 1

    asyncio.run(main())


def test_a_record_whose_answer_was_lost_is_not_sent_twice(proxy: Proxy) -> None:
    with Ledger(proxy.dsn, tenant_id="t1", worker_id="w") as led:
        def tool(n: int) -> int:
            proxy.drop_next_answer()  # the record's answer
            return n

        execution = led.run("op", tool, {"n": 7}, key="k")
        assert (execution.status, execution.result, execution.outcome) == ("succeeded", 7,
                                                                          "recorded")
        assert led.get("k").state == "succeeded"  # type: ignore[union-attr]


# --- idle connections the server closed ---------------------------------------------------------

def test_a_ledger_from_a_dsn_reconnects_after_its_idle_connection_was_closed(
        proxy: Proxy) -> None:
    with Ledger(proxy.dsn, tenant_id="t1", worker_id="w") as led:
        led.claim("a", "op", {})
        assert proxy.cut() >= 1
        time.sleep(0.05)  # the end of file reaches the client's socket
        assert led.claim("b", "op", {}).outcome == "claimed"  # no error
        assert led.run("op", Tool(), {"n": 1}, key="c").status == "succeeded"


def test_a_ledger_from_a_pool_skips_the_connections_the_server_closed(proxy: Proxy) -> None:
    with ConnectionPool(proxy.dsn, min_size=3, max_size=3, open=True,
                        kwargs={"autocommit": True}) as pool:
        pool.wait()
        led = Ledger(pool, tenant_id="t1", worker_id="w")
        assert proxy.cut() == 3
        time.sleep(0.05)
        assert led.claim("b", "op", {}).outcome == "claimed"
        assert led.run("op", Tool(), {"n": 1}, key="c").status == "succeeded"


def test_async_ledgers_reconnect_after_idle_connections_were_closed(proxy: Proxy) -> None:
    async def main() -> None:
        async with AsyncLedger(proxy.dsn, tenant_id="t1", worker_id="w") as led:
            await led.claim("a", "op", {})
            assert proxy.cut() >= 1
            await asyncio.sleep(0.05)
            assert (await led.claim("b", "op", {})).outcome == "claimed"
        async with AsyncConnectionPool(proxy.dsn, min_size=2, max_size=2, open=False,
                                       kwargs={"autocommit": True}) as pool:
            await pool.wait()
            led2 = AsyncLedger(pool, tenant_id="t1", worker_id="w")
            assert proxy.cut() == 2
            await asyncio.sleep(0.05)
            assert (await led2.run("op", Tool(), {"n": 1}, key="d")).status == "succeeded"

    asyncio.run(main())


# --- a waiter whose LISTEN connection dies -------------------------------------------------------

def test_a_waiter_opens_its_listen_connection_again(proxy: Proxy, dsn: str) -> None:
    release = threading.Event()
    owner_out: list[Any] = []

    def slow(n: int) -> int:
        release.wait(10)
        return n

    waiter_dsn = proxy.dsn + " application_name=waiter"
    with Ledger(dsn, tenant_id="t1", worker_id="owner") as owner, \
            Ledger(waiter_dsn, tenant_id="t1", worker_id="waiter") as waiter:
        t = threading.Thread(target=lambda: owner_out.append(
            owner.run("op", slow, {"n": 3}, key="k")))
        t.start()
        while owner.get("k") is None:
            time.sleep(0.01)
        waited: list[Any] = []
        w = threading.Thread(target=lambda: waited.append(
            waiter.run("op", slow, {"n": 3}, key="k", wait_timeout=15)))
        w.start()
        # The waiter's first claim, then its LISTEN connection and its claim there.
        deadline = time.monotonic() + 5
        while len(waiter_pids(dsn)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(waiter_pids(dsn)) == 2
        terminate(dsn, waiter_pids(dsn))
        time.sleep(0.3)  # the waiter noticed and opened another LISTEN connection
        release.set()
        t.join(10)
        w.join(15)
    assert owner_out[0].status == "succeeded"
    assert (waited[0].status, waited[0].replay, waited[0].result) == ("succeeded", True, 3)


def waiter_pids(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return [r[0] for r in c.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'waiter'")]


# --- what cannot be ridden out ------------------------------------------------------------------

def test_an_outage_longer_than_the_lease_is_database_unavailable(proxy: Proxy) -> None:
    tool = Tool()
    with Ledger(proxy.dsn, tenant_id="t1", worker_id="w") as led:
        led.get("warm")
        proxy.refuse(4)
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable) as caught:
            led.run("op", tool, {"n": 1}, key="k", lease=1)
        assert 0.9 <= time.monotonic() - started < 3.5  # retried for the lease, not longer
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        assert tool.calls == 0


def test_async_an_outage_longer_than_the_lease_is_database_unavailable(proxy: Proxy) -> None:
    async def main() -> None:
        async with AsyncLedger(proxy.dsn, tenant_id="t1", worker_id="w") as led:
            await led.get("warm")
            proxy.refuse(4)
            with pytest.raises(DatabaseUnavailable) as caught:
                await led.run("op", Tool(), {"n": 1}, key="k", lease=1)
            assert isinstance(caught.value.__cause__, psycopg.OperationalError)

    asyncio.run(main())


def test_an_outage_shorter_than_the_lease_costs_time_only(proxy: Proxy) -> None:
    tool = Tool()
    with Ledger(proxy.dsn, tenant_id="t1", worker_id="w") as led:
        led.get("warm")
        proxy.refuse(1.5)
        execution = led.run("op", tool, {"n": 1}, key="k", lease=10)
        assert (execution.status, tool.calls) == ("succeeded", 1)


def test_a_given_connection_is_not_replaced(proxy: Proxy) -> None:
    """docs/run.md: a Ledger on the caller's own connection cannot reconnect: the error
    reaches the caller at once, as DatabaseUnavailable."""
    conn = psycopg.connect(proxy.dsn, autocommit=True)
    with Ledger(conn, tenant_id="t1", worker_id="w") as led:
        led.get("warm")
        proxy.cut()
        time.sleep(0.05)
        with pytest.raises(DatabaseUnavailable):
            led.run("op", Tool(), {"n": 1}, key="k")
    conn.close()


def test_a_claim_cancelled_by_statement_timeout_is_sent_again(dsn: str) -> None:
    """A claim that waits for a row lock longer than the session's statement_timeout is
    cancelled (57014); run sends it again, and claims once the lock is gone."""
    low = psycopg.conninfo.make_conninfo(dsn, options="-c statement_timeout=100")
    tool = Tool()
    with Ledger(low, tenant_id="t1", worker_id="w") as led:
        first = led.claim("k", "op", {"n": 1})
        led.fail(first, {"why": "flaky"}, retryable=True)
        with psycopg.connect(dsn) as locker:  # holds the action's row lock for 0.6 s
            locker.execute("SELECT 1 FROM replaysafe.actions WHERE action_key = 'k' FOR UPDATE")
            released = threading.Timer(0.6, locker.commit)
            released.start()
            started = time.monotonic()
            execution = led.run("op", tool, {"n": 1}, key="k")
            released.join()
        assert time.monotonic() - started >= 0.5
        assert (execution.status, execution.attempt, tool.calls) == ("succeeded", 2, 1)
