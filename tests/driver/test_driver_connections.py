"""The driver over a caller's own connection: any row factory, shared by threads, and long
waits/heartbeats kept off it."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from replaysafe_pg import (
    AsyncLedger,
    DatabaseUnavailable,
    InvalidArgument,
    Ledger,
    StaleStateError,
    Threads,
)
from replaysafe_pg._conn import AsyncSource, SyncSource


def test_dict_row_connection_still_gets_typed_values(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        led = Ledger(conn, tenant_id="t1")
        c = led.claim("k", "op", {"a": 1})
        assert (c.outcome, c.attempt) == ("claimed", 1)
        assert led.complete(c, {"ok": 1}) == "recorded"
        assert led.get("k") is not None
        threads = Threads(conn, tenant_id="t1")
        assert threads.write("th", {"n": 1}, expected_version=0) == 1
        state = threads.read("th")
        assert (state.version, state.state) == (1, {"n": 1})


def test_async_dict_row_connection(dsn: str) -> None:
    async def body() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                         row_factory=dict_row) as conn:
            led = AsyncLedger(conn, tenant_id="t1")
            c = await led.claim("k", "op", {})
            assert c.outcome == "claimed"

    asyncio.run(body())


def test_shared_non_autocommit_connection_across_threads_loses_nothing(dsn: str) -> None:
    """Two threads on one idle, non-autocommit connection: each call is its own committed
    transaction, none joins or strands the other's."""
    errors: list[BaseException] = []
    with psycopg.connect(dsn) as conn:
        threads = Threads(conn, tenant_id="t1")

        def writer(thread_id: str) -> None:
            version = 0
            try:
                for i in range(100):
                    version = threads.write(thread_id, {"i": i}, expected_version=version)
            except BaseException as exc:
                errors.append(exc)

        def stale(thread_id: str) -> None:
            for _ in range(100):
                try:
                    threads.write(thread_id, {"x": 1}, expected_version=0)
                except StaleStateError:
                    pass
                except BaseException as exc:
                    errors.append(exc)

        workers = [threading.Thread(target=writer, args=("a",)),
                   threading.Thread(target=stale, args=("a",))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert errors == []
    with psycopg.connect(dsn, autocommit=True) as check:
        version = check.execute("SELECT version FROM replaysafe.read_thread('t1', 'a')").fetchone()
    assert version == (100,)


@pytest.mark.parametrize("autocommit", [True, False])
def test_long_tasks_get_a_connection_of_their_own(dsn: str, autocommit: bool) -> None:
    with psycopg.connect(dsn, autocommit=autocommit) as conn:
        source = SyncSource(conn)
        with source.connect() as other, psycopg.connect(source._place(), autocommit=True) as listening:
            for own in (other, listening):
                assert own is not conn
                assert own.autocommit
                assert own.info.backend_pid != conn.info.backend_pid


def test_async_long_tasks_get_a_connection_of_their_own(dsn: str) -> None:
    async def body() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            source = AsyncSource(conn)
            async with source.dedicated() as other:
                assert other is not conn
                assert other.info.backend_pid != conn.info.backend_pid

    asyncio.run(body())


def test_a_waiting_call_does_not_stall_a_sibling_heartbeat(dsn: str) -> None:
    """run_many on one given connection: one call waits for another worker's lease while a
    slow sibling runs past its own lease. The sibling's heartbeats must keep it alive."""
    with Ledger(dsn, tenant_id="t1", worker_id="other") as holder:
        holder.claim("busy", "op", {}, lease=timedelta(seconds=4))
    with psycopg.connect(dsn, autocommit=True) as conn:
        led = Ledger(conn, tenant_id="t1", worker_id="me")

        def slow() -> dict[str, Any]:
            time.sleep(2.5)
            return {"ok": True}

        def never() -> None:  # "busy" is held by another worker: this never runs
            raise AssertionError("ran a held action")

        swept: list[int] = []
        sweeper = threading.Timer(2.0, lambda: swept.append(Ledger(dsn).sweep()))
        sweeper.start()
        try:
            busy, mine = led.run_many([("op", never, {}, "busy"), ("op", slow, {}, "mine")],
                                      lease=1.5, wait_timeout=3.0)
        finally:
            sweeper.join()
        led.close()
    assert swept == [0]  # nothing expired: "mine" was kept alive by its heartbeats
    assert (mine.status, mine.lease_lost, mine.replay) == ("succeeded", False, False)
    assert busy.status == "running"


def _cursors(conn: Any) -> dict[str, Any]:
    cursors: dict[str, Any] = conn._replaysafe_cursors
    return cursors


def test_a_statement_keeps_its_cursor_and_lets_go_of_its_result(dsn: str) -> None:
    """Each statement runs on a cursor of its own, kept on the connection: psycopg keeps the
    cursor's adaptation state (its transformer) while the same query runs on it again. The
    cursor lets go of the result once the rows are read (a checkpoint may be megabytes)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        led = Ledger(conn, tenant_id="t1")
        led.claim("k1", "op", {"a": 1})
        cursors = dict(_cursors(conn))
        transformers = {query: cur._tx for query, cur in cursors.items()}
        c2 = led.claim("k2", "op", {"a": 2})
        led.complete(c2, {"ok": True})
        assert len(_cursors(conn)) == len(cursors) + 1  # complete's own cursor
        for query, cur in cursors.items():
            assert _cursors(conn)[query] is cur and cur._tx is transformers[query]
        assert all(cur.pgresult is None and cur._tx.pgresult is None
                   for cur in _cursors(conn).values())
        assert led.claim("k2", "op", {"a": 2}).outcome == "replay"
        # A closed cursor is replaced, not reused.
        for cur in _cursors(conn).values():
            cur.close()
        assert led.claim("k2", "op", {"a": 2}).outcome == "replay"


def test_async_statements_keep_their_cursors(dsn: str) -> None:
    async def body() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            led = AsyncLedger(conn, tenant_id="t1")
            await led.claim("k1", "op", {})
            (cur,) = _cursors(conn).values()
            tx = cur._tx
            assert (await led.claim("k2", "op", {})).outcome == "claimed"
            assert list(_cursors(conn).values()) == [cur] and cur._tx is tx
            assert cur.pgresult is None
    asyncio.run(body())


def test_two_ledgers_sharing_one_connection_across_threads_get_their_own_rows(dsn: str) -> None:
    """docs/python.md: one driver object per tenant, "making another is cheap"; a caller's
    connection may be shared by the caller's threads. Four Ledgers on one connection have a
    lock each: a statement takes its cursor out of the connection's cache while it runs, so
    no other thread runs the same query on it meanwhile (with the cursor left in the cache,
    threads read each other's results or none)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            ledgers = {t: Ledger(conn, tenant_id=t) for t in ("t1", "t2", "t3", "t4")}
            for t, led in ledgers.items():
                led.claim(f"key-{t}", "op", {"tenant": t})
            wrong: list[Any] = []
            errors: list[BaseException] = []
            start = threading.Barrier(len(ledgers))

            def reader(t: str) -> None:
                led = ledgers[t]
                start.wait()
                try:
                    for _ in range(1500):
                        action = led.get(f"key-{t}")
                        if action is None or (action.tenant_id, action.action_key) != (
                                t, f"key-{t}"):
                            wrong.append((t, action))
                except BaseException as exc:
                    errors.append(exc)

            workers = [threading.Thread(target=reader, args=(t,)) for t in ledgers]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == [] and wrong == [], (len(errors), errors[:3], len(wrong), wrong[:3])


def test_the_cursor_cache_lets_go_of_the_result(dsn: str) -> None:
    """Neither the cursor nor its transformer (the state the cache keeps) holds the last
    result: a large thread state is not kept in memory between calls."""
    big = {"blob": "x" * 4_000_000}
    with psycopg.connect(dsn, autocommit=True) as conn:
        threads = Threads(conn, tenant_id="t1")
        threads.write("th", big, expected_version=0)
        assert threads.read("th").state == big
        cursors = conn._replaysafe_cursors  # type: ignore[attr-defined]
        held = [q for q, cur in cursors.items()
                if cur._tx.pgresult is not None and "read_thread" in q]
        assert held == [], "the transformer still holds read_thread's 4 MB result"


def test_a_connection_in_pipeline_mode_is_refused_before_anything_is_sent(dsn: str) -> None:
    """Inside ``with conn.pipeline()`` a statement's answer comes at the pipeline's end: a
    claim sent there would run with nobody to act on it, a read would answer "nothing".
    Every call is refused with InvalidArgument, the tool is not called, nothing is written,
    and the connection works again after the block."""
    calls: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        led = Ledger(conn, tenant_id="t1")
        threads = Threads(conn, tenant_id="t1")
        with conn.pipeline():
            with pytest.raises(InvalidArgument, match="pipeline mode"):
                led.claim("k", "op", {})
            with pytest.raises(InvalidArgument, match="pipeline mode"):
                led.run("op", lambda: calls.append(1), {}, key="r")
            with pytest.raises(InvalidArgument, match="pipeline mode"):
                led.get("k")
            with pytest.raises(InvalidArgument, match="pipeline mode"):
                threads.write("th", {"n": 1}, expected_version=0)
            with pytest.raises(InvalidArgument, match="pipeline mode"):
                threads.read("th")
        assert calls == []
        assert led.get("k") is None and led.get("r") is None
        assert threads.read("th").version == 0
        assert led.claim("k", "op", {}).outcome == "claimed"


def test_async_a_connection_in_pipeline_mode_is_refused(dsn: str) -> None:
    async def body() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            led = AsyncLedger(conn, tenant_id="t1")
            async with conn.pipeline():
                with pytest.raises(InvalidArgument, match="pipeline mode"):
                    await led.claim("k", "op", {})
            assert await led.get("k") is None

    asyncio.run(body())


def test_a_neighbours_executemany_on_a_shared_connection_is_waited_for(dsn: str) -> None:
    """psycopg's executemany runs in a pipeline of its own, holding the connection's lock: a
    ledger call from another thread on the same connection waits for it, it is not refused."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE many (i integer)")
        led = Ledger(conn, tenant_id="t1")
        led.claim("k", "op", {})
        done = threading.Event()
        errors: list[BaseException] = []

        def neighbour() -> None:
            try:
                with conn.cursor() as cur:
                    for _ in range(10):
                        cur.executemany("INSERT INTO many VALUES (%s)", [(i,) for i in range(500)])
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        worker = threading.Thread(target=neighbour, daemon=True)
        worker.start()
        answers = 0
        while not done.is_set():
            assert led.get("k") is not None
            answers += 1
        worker.join(30)
        assert errors == [] and answers > 0


def test_a_connection_broken_inside_a_pipeline_raises_database_unavailable(dsn: str) -> None:
    """A connection that broke inside a pipeline block still says "pipeline on" after it:
    the call is the same DatabaseUnavailable as on any broken connection."""
    with psycopg.connect(dsn, autocommit=True) as conn, \
            psycopg.connect(dsn, autocommit=True) as other:
        led = Ledger(conn, tenant_id="t1")
        with pytest.raises(psycopg.OperationalError), conn.pipeline():
            other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            conn.execute("SELECT 1")
        assert conn.broken or conn.closed
        with pytest.raises(DatabaseUnavailable):
            led.get("k")


def test_the_drivers_own_connections_keep_no_notifications(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as ledger:
        ledger.get("k")
        own = ledger._source._own
        assert own is not None
        own.execute("LISTEN somewhere")
        with psycopg.connect(dsn, autocommit=True) as other:
            for i in range(50):
                other.execute("SELECT pg_notify('somewhere', %s)", (str(i),))
        ledger.get("k")
        assert not own._notifies_backlog


def test_a_given_connection_keeps_at_most_a_thousand_notifications_the_driver_saw(
        dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN mine")
        ledger = Ledger(conn, tenant_id="t1")
        with psycopg.connect(dsn, autocommit=True) as other:
            for i in range(1500):
                other.execute("SELECT pg_notify('mine', %s)", (str(i),))
        ledger.get("k")
        ledger.get("k")
        backlog = conn._notifies_backlog
        assert backlog is not None and len(backlog) == 1000
        assert backlog[-1].payload == "1499", "the newest are kept"


def test_a_read_only_session_is_database_unavailable_not_a_raw_error(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = on")
        ledger = Ledger(conn, tenant_id="t1")
        with pytest.raises(DatabaseUnavailable, match="cannot write"):
            ledger.claim("k", "op", {})
