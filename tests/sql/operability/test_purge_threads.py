"""replaysafe.purge_threads() (docs/operability.md): age-based retention of threads and LangGraph
threads, batched, per tenant, an operator's duty; a purged thread's version counter goes on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind, bind_to_all_tenants, connect_as, sqlstate
from helpers.grants import issue

Conn = psycopg.Connection[Any]
MakeRole = Callable[..., str]

PURGE = "SELECT replaysafe.purge_threads(p_older_than => %s::interval, p_limit => %s)"


def write(c: Conn, tenant: str, thread: str, expected: int, state: str = '{"n": 1}') -> int:
    row = c.execute("SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => %s, "
                    "p_expected_version => %s, p_state => %s::jsonb)",
                    (tenant, thread, expected, state)).fetchone()
    assert row is not None
    version: int = row[0]
    return version


def age(c: Conn, tenant: str, thread: str, days: int) -> None:
    """Backdate a thread's last write (as the schema owner: the test's superuser)."""
    c.execute("UPDATE replaysafe.threads SET updated_at = now() - make_interval(days => %s) "
              "WHERE tenant_id = %s AND thread_id = %s", (days, tenant, thread))


def head(c: Conn, tenant: str, thread: str) -> tuple[Any, ...] | None:
    return c.execute("SELECT version, deleted, (SELECT count(*) FROM replaysafe.thread_versions v "
                     "WHERE v.tenant_id = t.tenant_id AND v.thread_id = t.thread_id) "
                     "FROM replaysafe.threads t WHERE tenant_id = %s AND thread_id = %s",
                     (tenant, thread)).fetchone()


@pytest.fixture
def threads_world(dsn: str) -> str:
    """Tenants A and B, each with a thread of three versions last written 40 days ago
    ("old") and one written now ("fresh")."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for tenant in ("A", "B"):
            for thread in ("old", "fresh"):
                for v in range(3):
                    write(c, tenant, thread, v)
            age(c, tenant, "old", 40)
    return dsn


def test_an_old_thread_is_purged_to_a_tombstone_and_its_versions_go_on(threads_world: str) -> None:
    with psycopg.connect(threads_world, autocommit=True) as c:
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (2,)
        assert head(c, "A", "old") == (4, True, 0)  # the tombstone: version 3 moved on to 4
        assert head(c, "A", "fresh") == (3, False, 3)
        read = c.execute("SELECT version, state FROM replaysafe.read_thread(p_tenant_id => 'A', "
                         "p_thread_id => 'old')").fetchone()
        assert read == (4, None)
        # A writer that knew version 3 is stale; one that read the tombstone goes on at 5.
        assert sqlstate(c, "SELECT replaysafe.write_thread(p_tenant_id => 'A', p_thread_id => 'old', "
                           "p_expected_version => 3, p_state => '{}')") == "RS003"
        assert write(c, "A", "old", 4) == 5
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (0,)  # nothing old is left


def test_a_batch_purges_at_most_p_limit_threads_oldest_first(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(5):
            write(c, "A", f"t{i}", 0)
            age(c, "A", f"t{i}", 40 + i)
        assert c.execute(PURGE, ("30 days", 2)).fetchone() == (2,)
        gone = [t for (t,) in c.execute("SELECT thread_id FROM replaysafe.threads WHERE deleted "
                                        "ORDER BY thread_id")]
        assert gone == ["t3", "t4"]
        assert c.execute(PURGE, ("30 days", 2)).fetchone() == (2,)
        assert c.execute(PURGE, ("30 days", 2)).fetchone() == (1,)
        assert c.execute(PURGE, ("30 days", 2)).fetchone() == (0,)


def test_a_bound_operator_purges_its_tenant_only(threads_world: str, make_role: MakeRole) -> None:
    operator = make_role("replaysafe_operator")
    bind(threads_world, operator, "A")
    with connect_as(threads_world, operator) as c:
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (1,)
        # Naming another tenant is refused.
        assert sqlstate(c, "SELECT replaysafe.purge_threads(p_older_than => '30 days', "
                           "p_tenant_id => 'B')") == "RS004"
    with psycopg.connect(threads_world, autocommit=True) as owner:
        assert head(owner, "A", "old") == (4, True, 0)
        assert head(owner, "B", "old") == (3, False, 3)


def test_an_all_tenant_operator_purges_every_tenant(threads_world: str, make_role: MakeRole) -> None:
    operator = make_role("replaysafe_operator")
    bind_to_all_tenants(threads_world, operator)
    with connect_as(threads_world, operator) as c:
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (2,)


def test_only_an_operator_purges(threads_world: str, make_role: MakeRole) -> None:
    for group in ("replaysafe_worker", "replaysafe_auditor"):
        role = make_role(group)
        bind(threads_world, role, "A")
        with connect_as(threads_world, role) as c:
            assert sqlstate(c, "SELECT replaysafe.purge_threads(p_older_than => '1 day')") == "42501"
    with psycopg.connect(threads_world, autocommit=True) as owner:
        assert head(owner, "A", "old") == (3, False, 3)


def test_under_a_grant_the_grants_tenant_and_never_a_users_grant(threads_world: str,
                                                                 make_role: MakeRole) -> None:
    pooled = make_role("replaysafe_operator")
    with psycopg.connect(threads_world, autocommit=True) as owner:
        tenant_grant = issue(owner, "B", duties=["operator"])
        user_grant = issue(owner, "B", user="alice", duties=["operator"])
    with connect_as(threads_world, pooled) as c:
        assert sqlstate(c, "SELECT replaysafe.purge_threads(p_older_than => '30 days', "
                           "p_grant => %s)", (user_grant,)) == "RS004"
        assert c.execute("SELECT replaysafe.purge_threads(p_older_than => '30 days', "
                         "p_grant => %s)", (tenant_grant,)).fetchone() == (1,)
    with psycopg.connect(threads_world, autocommit=True) as owner:
        assert head(owner, "B", "old") == (4, True, 0)
        assert head(owner, "A", "old") == (3, False, 3)


def test_bad_arguments_are_refused_and_purge_nothing(threads_world: str) -> None:
    with psycopg.connect(threads_world, autocommit=True) as c:
        for args in ("p_older_than => NULL", "p_older_than => '-1 day'",
                     "p_older_than => '1 day', p_limit => 0"):
            assert sqlstate(c, f"SELECT replaysafe.purge_threads({args})") == "RS005", args
        assert head(c, "A", "old") == (3, False, 3)


def test_a_thread_a_writer_holds_is_skipped_not_waited_for(threads_world: str) -> None:
    with psycopg.connect(threads_world) as writer, psycopg.connect(threads_world,
                                                                   autocommit=True) as c:
        writer.execute("SELECT 1 FROM replaysafe.threads WHERE tenant_id = 'A' "
                       "AND thread_id = 'old' FOR UPDATE")
        c.execute("SET lock_timeout = '2s'")
        started = time.monotonic()
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (1,)  # B's only
        assert time.monotonic() - started < 1
        writer.rollback()
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (1,)  # now A's


def test_a_concurrent_write_keeps_its_thread(threads_world: str) -> None:
    """A write that commits while the purge waits to run is never undone by it: the purge
    takes what it has locked, and a thread written meanwhile is no longer old."""
    with psycopg.connect(threads_world) as writer:
        write(writer, "A", "old", 3)  # uncommitted: holds the head row
        result: list[Any] = []

        def purge() -> None:
            with psycopg.connect(threads_world, autocommit=True) as c:
                result.append(c.execute(PURGE, ("30 days", 100)).fetchone())

        t = threading.Thread(target=purge)
        t.start()
        t.join(10)
        writer.commit()
    assert result == [(1,)]  # B's; A's was held (skipped) and is now fresh
    with psycopg.connect(threads_world, autocommit=True) as c:
        assert head(c, "A", "old") == (4, False, 4)
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (0,)


lg = pytest.importorskip("helpers.langgraph_rows")


def put(c: Conn, thread: str, ns: str = "", tenant: str = "A") -> dict[str, Any]:
    params: dict[str, Any] = lg.put_params(tenant, thread, ns=ns)
    c.execute(lg.PUT, params)
    return params


def age_langgraph(c: Conn, thread: str, days: int) -> None:
    c.execute("UPDATE replaysafe.langgraph_namespaces SET written_at = now() - make_interval(days => %s) "
              "WHERE thread_id = %s", (days, thread))


def langgraph_rows(c: Conn) -> dict[str, int]:
    return dict(c.execute(
        "SELECT thread_id, count(*) FROM ((SELECT thread_id FROM replaysafe.langgraph_checkpoints) "
        "UNION ALL (SELECT thread_id FROM replaysafe.langgraph_writes) UNION ALL "
        "(SELECT thread_id FROM replaysafe.langgraph_namespaces)) r GROUP BY 1").fetchall())


def test_an_old_langgraph_thread_is_deleted_and_a_fresh_one_kept(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for thread in ("lg-old", "lg-fresh"):
            params = put(c, thread)
            c.execute(lg.PUT_WRITES, {"tenant": "A", "thread": thread, "ns": "", "id": params["id"],
                                      "task": "task", "path": "", "idx": [0], "channels": ["c"],
                                      "types": ["json"], "blobs": [b"{}"], "replace": False})
        age_langgraph(c, "lg-old", 40)
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (1,)
        assert langgraph_rows(c) == {"lg-fresh": 3}


def test_a_langgraph_thread_with_one_fresh_namespace_is_kept(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        put(c, "lg", "")
        put(c, "lg", "child:1")
        c.execute("UPDATE replaysafe.langgraph_namespaces SET written_at = now() - interval '40 days' "
                  "WHERE checkpoint_ns = ''")
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (0,)


def test_a_put_in_flight_into_a_new_namespace_keeps_its_thread(dsn: str) -> None:
    """A put not yet committed, into a namespace no snapshot shows, holds its thread's lock:
    the purge skips the thread, and the put's checkpoint is never left behind ownerless."""
    with psycopg.connect(dsn, autocommit=True) as c:
        put(c, "lg")
        age_langgraph(c, "lg", 40)
        with psycopg.connect(dsn) as writer:
            put(writer, "lg", "child:1")  # uncommitted
            assert c.execute(PURGE, ("30 days", 100)).fetchone() == (0,)
            writer.commit()
        assert langgraph_rows(c) == {"lg": 4}
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (0,)  # written just now


def test_a_put_waits_for_a_purge_that_holds_its_thread(dsn: str) -> None:
    """Once the purge holds the thread, a put waits for it and then writes a new thread: it
    never lands half in a thread that is being deleted."""
    with psycopg.connect(dsn, autocommit=True) as c:
        put(c, "lg")
        age_langgraph(c, "lg", 40)
    with psycopg.connect(dsn) as purger:
        assert purger.execute(PURGE, ("30 days", 100)).fetchone() == (1,)  # uncommitted
        done: list[float] = []

        def writer() -> None:
            with psycopg.connect(dsn, autocommit=True) as w:
                put(w, "lg", "child:1")
                done.append(time.monotonic())

        t = threading.Thread(target=writer)
        t.start()
        time.sleep(0.3)
        assert not done  # waiting for the purge's lock
        committed = time.monotonic()
        purger.commit()
        t.join(10)
    assert done and done[0] >= committed
    with psycopg.connect(dsn, autocommit=True) as c:
        assert langgraph_rows(c) == {"lg": 2}  # the new namespace's checkpoint and row only


def test_one_busy_thread_never_starves_the_others(dsn: str) -> None:
    """A thread with many old checkpoints and a new one is no candidate; the idle threads
    after it are purged in the same call."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO replaysafe.langgraph_checkpoints (tenant_id, thread_id, checkpoint_ns, "
                  "checkpoint_id, checkpoint, metadata, created_at) SELECT 'B', 'busy', '', "
                  "lpad(g::text, 8, '0'), '{}', '{}', now() - interval '60 days' "
                  "FROM generate_series(1, 5000) g")
        put(c, "busy", tenant="B")
        for i in range(3):
            put(c, f"idle{i}")
            age_langgraph(c, f"idle{i}", 40)
        assert c.execute(PURGE, ("30 days", 2)).fetchone() == (2,)
        assert c.execute(PURGE, ("30 days", 2)).fetchone() == (1,)
        assert set(langgraph_rows(c)) == {"busy"}


def test_a_copy_is_written_now(dsn: str) -> None:
    """A thread copied from an old one was written by the copy: the purge keeps it."""
    with psycopg.connect(dsn, autocommit=True) as c:
        put(c, "source")
        age_langgraph(c, "source", 40)
        c.execute("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => 'A', "
                  "p_source_thread_id => 'source', p_target_thread_id => 'copy')")
        assert c.execute(PURGE, ("30 days", 100)).fetchone() == (1,)
        assert set(langgraph_rows(c)) == {"copy"}


def test_threads_writers_hold_never_stop_a_batch(dsn: str) -> None:
    """Threads held by writers are skipped and the batch fills with the next old ones: a
    purge run (until a batch returns 0) never ends early behind them."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(4):
            put(c, f"lg{i}")
            age_langgraph(c, f"lg{i}", 40)
        with psycopg.connect(dsn) as w1, psycopg.connect(dsn) as w2:
            put(w1, "lg0", "child:1")
            put(w2, "lg1", "child:1")
            assert c.execute(PURGE, ("30 days", 2)).fetchone() == (2,)
            assert c.execute(PURGE, ("30 days", 2)).fetchone() == (0,)
        assert set(langgraph_rows(c)) == {"lg0", "lg1"}


def test_no_role_but_the_functions_reaches_a_threads_lock(threads_world: str,
                                                          make_role: MakeRole) -> None:
    """The lock rows live in a table no group role may read or lock."""
    worker = make_role("replaysafe_worker")
    bind(threads_world, worker, "A")
    with connect_as(threads_world, worker) as c:
        for stmt in ("SELECT * FROM replaysafe.langgraph_threads",
                     "SELECT 1 FROM replaysafe.langgraph_threads FOR UPDATE"):
            assert sqlstate(c, stmt) == "42501", stmt


PUT_AS = lg.PUT.replace("p_history_limit => %(limit)s::integer)",
                        "p_history_limit => %(limit)s::integer, p_grant => %(grant)s)")


def test_a_users_put_racing_a_purge_keeps_its_owner(dsn: str, make_role: MakeRole) -> None:
    """Alice's put waits for a purge that took her thread, then writes it anew as hers: Bob,
    another user of the tenant, can neither take the thread over nor read her checkpoint."""
    pooled = make_role("replaysafe_worker")
    with psycopg.connect(dsn, autocommit=True) as owner:
        alice, bob = issue(owner, "A", user="alice"), issue(owner, "A", user="bob")
    with connect_as(dsn, pooled) as c:
        c.execute(PUT_AS, lg.put_params("A", "lg") | {"grant": alice})
    with psycopg.connect(dsn, autocommit=True) as c:
        age_langgraph(c, "lg", 40)
    with psycopg.connect(dsn) as purger:
        assert purger.execute(PURGE, ("30 days", 100)).fetchone() == (1,)  # uncommitted
        done: list[bool] = []

        def alice_writes() -> None:
            with connect_as(dsn, pooled) as w:
                w.execute(PUT_AS, lg.put_params("A", "lg", ns="child:1") | {"grant": alice})
                done.append(True)

        t = threading.Thread(target=alice_writes)
        t.start()
        time.sleep(0.3)
        assert not done
        purger.commit()
        t.join(10)
    assert done
    with psycopg.connect(dsn, autocommit=True) as c:
        assert c.execute("SELECT user_id FROM replaysafe.langgraph_thread_users "
                         "WHERE thread_id = 'lg'").fetchall() == [("alice",)]
    with connect_as(dsn, pooled) as c:
        assert sqlstate(c, PUT_AS, lg.put_params("A", "lg", ns="b") | {"grant": bob}) == "RS004"


def test_prune_delete_takes_the_threads_lock_rows_too(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        put(c, "lg")
        c.execute("SELECT replaysafe.langgraph_prune(p_tenant_id => 'A', p_thread_ids => ARRAY['lg'], "
                  "p_strategy => 'delete')")
        assert c.execute("SELECT count(*) FROM replaysafe.langgraph_threads").fetchone() == (0,)
        # A copy onto itself makes no lock row; every lock row is a thread with a namespace.
        c.execute("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => 'A', "
                  "p_source_thread_id => 'ghost', p_target_thread_id => 'ghost')")
        assert c.execute("SELECT count(*) FROM replaysafe.langgraph_threads").fetchone() == (0,)
        c.execute("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => 'A', "
                  "p_source_thread_id => 'ghost', p_target_thread_id => 'ghost2')")
        assert c.execute("SELECT array_agg(t.thread_id) FROM replaysafe.langgraph_threads t "
                         "WHERE NOT EXISTS (SELECT 1 FROM replaysafe.langgraph_namespaces n "
                         "WHERE n.tenant_id = t.tenant_id AND n.thread_id = t.thread_id)"
                         ).fetchone() == (None,)
