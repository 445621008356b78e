"""docs/threads.md (thread state) against a real Postgres: the contract's names, CAS writes,
tombstones, bounded history, the driver's connection sources. Ownership, bad input and
concurrent writers: the other files of tests/sql/threads."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import psycopg
import pytest
from helpers.threads import table_counts
from psycopg_pool import ConnectionPool

from replaysafe_pg import (
    AccessDenied,
    AsyncThreads,
    StaleStateError,
    Threads,
    downgrade,
    migrate,
)

Conn = psycopg.Connection[Any]


def versions(th: Threads, thread_id: str = "th") -> list[int]:
    return [v.version for v in th.history(thread_id, limit=10_000)]


# --- the contract's names --------------------------------------------------------------

def test_functions_have_the_spec_signatures(conn: Conn) -> None:
    for sig in ("replaysafe.read_thread(text,text,text,text)",
                "replaysafe.write_thread(text,text,bigint,jsonb,text,integer,text)",
                "replaysafe.thread_history(text,text,text,integer,text)",
                "replaysafe.delete_thread(text,text,text,text)"):
        assert conn.execute("SELECT to_regprocedure(%s)", (sig,)).fetchone() == (sig,)
    # Named arguments with their defaults, as outside callers use them.
    conn.execute("SELECT replaysafe.write_thread(p_tenant_id => 't', p_thread_id => 'x', "
                 "p_expected_version => 0, p_state => '{\"a\": 1}')")
    assert conn.execute("SELECT version, state FROM replaysafe.read_thread("
                        "p_tenant_id => 't', p_thread_id => 'x')").fetchone() == (1, {"a": 1})
    assert conn.execute("SELECT version FROM replaysafe.thread_history("
                        "p_tenant_id => 't', p_thread_id => 'x')").fetchall() == [(1,)]
    assert conn.execute("SELECT replaysafe.delete_thread(p_tenant_id => 't', p_thread_id => 'x', "
                        "p_user_id => NULL)").fetchone() == (True,)


def test_revision_0002_downgrades_to_the_ledger_and_back(empty_dsn: str) -> None:
    migrate(empty_dsn)
    downgrade(empty_dsn, "0001")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        left = c.execute("SELECT count(*) FROM pg_catalog.pg_class k JOIN pg_catalog.pg_namespace n "
                         "ON n.oid = k.relnamespace WHERE n.nspname = 'replaysafe' "
                         "AND k.relname LIKE 'thread%'").fetchone()
        assert left == (0,)
        assert c.execute("SELECT to_regproc('replaysafe.write_thread')").fetchone() == (None,)
        assert c.execute("SELECT to_regproc('replaysafe.claim_action')").fetchone() is not None
    migrate(empty_dsn)
    with Threads(empty_dsn) as th:
        assert th.write("th", {"ok": True}, 0) == 1


# --- CAS writes ------------------------------------------------------------------------

def test_absent_thread_reads_version_0(threads: Threads) -> None:
    absent = threads.read("nope")
    assert (absent.version, absent.state, absent.updated_at) == (0, None, None)
    assert threads.history("nope") == []


def test_writes_chain_versions_and_read_returns_the_latest(threads: Threads) -> None:
    assert threads.write("th", {"step": 1}, 0) == 1
    assert threads.write("th", {"step": 2}, 1) == 2
    assert threads.write("th", {"step": 3}, 2) == 3
    latest = threads.read("th")
    assert (latest.version, latest.state) == (3, {"step": 3})
    assert latest.updated_at is not None
    assert [(v.version, v.state) for v in threads.history("th")] == [
        (3, {"step": 3}), (2, {"step": 2}), (1, {"step": 1})]
    assert [v.version for v in threads.history("th", limit=2)] == [3, 2]


def test_stale_write_raises_rs003_with_detail_and_changes_nothing(threads: Threads,
                                                                  conn: Conn) -> None:
    threads.write("th", {"secret": "s3cr3t"}, 0)
    threads.write("th", {"secret": "s3cr3t"}, 1)
    before = table_counts(conn)
    with pytest.raises(StaleStateError) as err:
        threads.write("th", {"x": 1}, 1)
    exc = err.value
    assert (exc.thread_id, exc.expected_version, exc.current_version) == ("th", 1, 2)
    assert exc.__cause__.sqlstate == "RS003"  # type: ignore[union-attr]
    assert "s3cr3t" not in exc.message and "s3cr3t" not in (exc.detail or "")
    assert table_counts(conn) == before
    assert threads.read("th").state == {"secret": "s3cr3t"}

    with pytest.raises(StaleStateError) as err:
        threads.write("never", {"x": 1}, 4)
    assert (err.value.expected_version, err.value.current_version) == (4, 0)


def test_expected_version_0_on_an_existing_thread_raises_rs003(threads: Threads) -> None:
    threads.write("th", {"a": 1}, 0)
    with pytest.raises(StaleStateError) as err:
        threads.write("th", {"a": 2}, 0)
    assert (err.value.expected_version, err.value.current_version) == (0, 1)
    assert threads.read("th").state == {"a": 1}


def test_read_assigns_no_transaction_id(threads: Threads, dsn: str) -> None:
    threads.write("th", {"a": 1}, 0)
    with psycopg.connect(dsn) as c:
        Threads(c, tenant_id="t1").read("th")
        Threads(c, tenant_id="t1").history("th")
        assert c.execute("SELECT pg_current_xact_id_if_assigned()").fetchone() == (None,)


# --- tombstones ------------------------------------------------------------------------

def test_delete_leaves_a_tombstone_and_the_counter_continues(threads: Threads, conn: Conn) -> None:
    for v in range(3):
        threads.write("th", {"v": v + 1}, v)
    assert threads.delete("th") is True
    gone = threads.read("th")
    assert (gone.version, gone.state) == (4, None)
    assert gone.updated_at is not None
    assert threads.history("th") == []
    assert conn.execute("SELECT count(*) FROM replaysafe.thread_versions").fetchone() == (0,)

    with pytest.raises(StaleStateError) as err:  # a writer still holding version 3
        threads.write("th", {"v": "late"}, 3)
    assert err.value.current_version == 4
    with pytest.raises(StaleStateError):
        threads.write("th", {"v": "new"}, 0)

    assert threads.write("th", {"v": "again"}, 4) == 5
    assert versions(threads) == [5]  # nothing older than the tombstone
    assert threads.read("th").state == {"v": "again"}


def test_delete_of_absent_or_deleted_thread_returns_false(threads: Threads) -> None:
    assert threads.delete("nope") is False
    threads.write("th", {"a": 1}, 0)
    assert threads.delete("th") is True
    assert threads.delete("th") is False
    assert threads.read("th").version == 2


# --- history limit and pruning ---------------------------------------------------------

XACT_STATS = ("SELECT n_tup_del, pg_stat_force_next_flush() FROM pg_stat_xact_user_tables "
              "WHERE relid = 'replaysafe.thread_versions'::regclass")


def test_1000_writes_with_limit_5_keep_996_to_1000_pruning_one_row_per_write(dsn: str) -> None:
    pruned: list[int] = []
    with psycopg.connect(dsn) as c:
        th = Threads(c, tenant_id="t1")
        for v in range(1000):
            with c.transaction():
                th.write("th", {"v": v + 1}, v, history_limit=5 if v == 0 else None)
                row = c.execute(XACT_STATS).fetchone()
                assert row is not None
                pruned.append(row[0])  # rows this write's transaction deleted
        assert versions(th) == [1000, 999, 998, 997, 996]
        assert th.history("th", limit=1)[0].state == {"v": 1000}
    assert pruned[:5] == [0] * 5
    assert set(pruned[5:]) == {1}, Counter(pruned)
    print(f"\npruned rows per write (1000 writes, limit 5): {dict(Counter(pruned))}")


def test_lowering_the_limit_prunes_the_difference_once(dsn: str) -> None:
    pruned: list[int] = []
    with psycopg.connect(dsn) as c:
        th = Threads(c, tenant_id="t1")
        for v in range(30):
            limit = 20 if v == 0 else (5 if v == 25 else None)
            with c.transaction():
                th.write("th", {"v": v + 1}, v, history_limit=limit)
                row = c.execute(XACT_STATS).fetchone()
                assert row is not None
                pruned.append(row[0])
        assert versions(th) == [30, 29, 28, 27, 26]
    # Versions 1..20 kept up to v20, then one per write; v26 with limit 5 drops 6..21.
    assert pruned == [0] * 20 + [1] * 5 + [16] + [1] * 4


def test_default_history_limit_is_20_and_a_later_write_changes_it(threads: Threads) -> None:
    for v in range(25):
        threads.write("th", {"v": v + 1}, v)
    assert versions(threads) == list(range(25, 5, -1))
    threads.write("th", {"v": 26}, 25, history_limit=30)
    for v in range(26, 40):
        threads.write("th", {"v": v + 1}, v)
    assert len(versions(threads)) == 30


# --- the driver's connection sources ---------------------------------------------------

def test_threads_on_a_pool_and_on_a_connection(dsn: str) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        assert Threads(pool, tenant_id="t1").write("th", {"a": 1}, 0) == 1
    with psycopg.connect(dsn, autocommit=True) as c:
        assert Threads(c, tenant_id="t1").read("th").state == {"a": 1}


def test_async_threads(dsn: str) -> None:
    async def scenario() -> None:
        async with AsyncThreads(dsn, tenant_id="t1", user_id="u") as th:
            assert (await th.read("th")).version == 0
            assert await th.write("th", {"a": 1}, 0) == 1
            assert await th.write("th", {"a": 2}, 1, history_limit=1) == 2
            with pytest.raises(StaleStateError):
                await th.write("th", {"a": 3}, 1)
            assert [v.version for v in await th.history("th")] == [2]
            assert (await th.read("th")).state == {"a": 2}
            assert await th.delete("th") is True
            assert (await th.read("th")).version == 3
        async with AsyncThreads(dsn, tenant_id="t1", user_id="other") as other:
            with pytest.raises(AccessDenied):
                await other.read("th")

    asyncio.run(scenario())
