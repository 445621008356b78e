"""docs/threads.md, concurrent writers: interleaved CAS writes, a writer waiting on an uncommitted
write, and 8 writers as connections and as processes that lose no increment."""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from helpers.threads import increment

from replaysafe_pg import (
    StaleStateError,
    Threads,
)


def test_interleaved_read_read_write_write_second_writer_is_stale(dsn: str) -> None:
    with Threads(dsn, tenant_id="t1") as a, Threads(dsn, tenant_id="t1") as b:
        a.write("th", {"n": 0}, 0)
        seen_a, seen_b = a.read("th"), b.read("th")
        assert b.write("th", {"n": 1, "by": "b"}, seen_b.version) == 2
        with pytest.raises(StaleStateError):
            a.write("th", {"n": 1, "by": "a"}, seen_a.version)
        assert a.read("th").state == {"n": 1, "by": "b"}


def test_a_writer_waiting_on_an_uncommitted_write_gets_rs003_after_commit(dsn: str) -> None:
    with Threads(dsn, tenant_id="t1") as th:
        th.write("th", {"n": 0}, 0)
    holder = psycopg.connect(dsn)
    waiter = psycopg.connect(dsn, autocommit=True)
    try:
        holder.execute("SELECT 1")  # open a transaction: the write below joins it
        Threads(holder, tenant_id="t1").write("th", {"n": 1}, 1)
        waiter_pid = waiter.info.backend_pid
        outcome: list[BaseException | int] = []

        def write_from_waiter() -> None:
            try:
                outcome.append(Threads(waiter, tenant_id="t1").write("th", {"n": 99}, 1))
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=write_from_waiter)
        t.start()
        with psycopg.connect(dsn, autocommit=True) as probe:
            deadline = time.monotonic() + 10
            while probe.execute("SELECT pg_blocking_pids(%s)", (waiter_pid,)).fetchone() == ([],):
                assert t.is_alive() and time.monotonic() < deadline, f"never blocked: {outcome}"
        assert not outcome  # still blocked on the row lock
        holder.commit()
        t.join(10)
        assert isinstance(outcome[0], StaleStateError)
        assert outcome[0].current_version == 2
    finally:
        holder.close()
        waiter.close()


# --- 8 concurrent writers --------------------------------------------------------------

WRITERS, INCREMENTS = 8, 200


def check_unbroken_chain(dsn: str, results: list[tuple[list[int], int]], how: str) -> None:
    written = sorted(v for vs, _ in results for v in vs)
    assert written == list(range(1, WRITERS * INCREMENTS + 1))
    with Threads(dsn, tenant_id="t1") as th:
        final = th.read("counter")
        assert final.version == WRITERS * INCREMENTS
        assert final.state is not None
        assert final.state["n"] == WRITERS * INCREMENTS
        assert final.state["by"] == {f"w{i}": INCREMENTS for i in range(WRITERS)}
        history = th.history("counter", limit=10_000)
    # Every kept version holds exactly its own count: no write was lost or applied twice.
    assert [(h.version, h.state["n"]) for h in history] == [
        (v, v) for v in range(WRITERS * INCREMENTS, 0, -1)]
    stale = sum(s for _, s in results)
    print(f"\n{how}: {WRITERS} writers x {INCREMENTS} increments, {stale} StaleStateErrors")


def test_8_writers_on_separate_connections_lose_no_increment(dsn: str) -> None:
    with ThreadPoolExecutor(WRITERS) as pool:
        futures = [pool.submit(increment, dsn, "t1", "counter", f"w{i}", INCREMENTS)
                   for i in range(WRITERS)]
        results = [f.result(timeout=120) for f in futures]
    check_unbroken_chain(dsn, results, "connections")


def test_8_writer_processes_lose_no_increment(dsn: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(WRITERS) as pool:
        pending = [pool.apply_async(increment, (dsn, "t1", "counter", f"w{i}", INCREMENTS))
                   for i in range(WRITERS)]
        results = [p.get(timeout=120) for p in pending]
    check_unbroken_chain(dsn, results, "processes")
