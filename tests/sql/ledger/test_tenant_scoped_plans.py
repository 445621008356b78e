"""Per-tenant reads stay bounded by the tenant: with many other tenants' rows in the tables,
a bound worker's audit views read its own rows through the primary keys, never a scan of
every tenant's (bench/scale_bench.py measures the same at 10 k to 10 M actions)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from helpers.db import bind, connect_as

OTHERS = 40_000


@pytest.fixture
def world(dsn: str) -> str:
    """Tenant A with a few actions, one of them multi-effect; 40 k actions of other tenants."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("""
            INSERT INTO replaysafe.actions (tenant_id, action_key, operation, request, state,
                attempt, on_expired, idempotency_key, worker_id, lease_expires_at, result,
                created_at, updated_at, completed_at)
            SELECT CASE WHEN i < 100 THEN 'A' ELSE 't' || (i %% 300) END, 'k' || i, 'pay', '{}',
                   'succeeded', CASE WHEN i %% 50 = 1 THEN 2 ELSE 1 END, 'unknown', 'rs1_' || md5(i::text),
                   'w', now(), '{}', now(), now(), now()
            FROM generate_series(0, %s) AS i""", (OTHERS + 100,))
        c.execute("""
            INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id,
                claimed_at, ended_at, outcome)
            SELECT a.tenant_id, a.action_key, n, 'w', now(), now(), 'succeeded'
            FROM replaysafe.actions a, generate_series(1, a.attempt) AS n""")
        c.execute("ANALYZE replaysafe.actions, replaysafe.action_attempts")
    return dsn


def plan(conn: psycopg.Connection[tuple[object, ...]], sql: str) -> str:
    return "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + sql).fetchall())


def test_multi_effect_actions_reads_only_the_tenants_rows(
        world: str, make_role: Callable[..., str]) -> None:
    role = make_role("replaysafe_worker")
    bind(world, role, "A")
    with connect_as(world, role) as worker:
        rows = worker.execute("SELECT tenant_id, action_key, operation, successful_attempts "
                              "FROM replaysafe.multi_effect_actions ORDER BY action_key").fetchall()
        assert rows == [("A", "k1", "pay", 2), ("A", "k51", "pay", 2)]
        text = plan(worker, "SELECT * FROM replaysafe.multi_effect_actions")
        assert "Seq Scan on actions" not in text, text
        assert "Seq Scan on action_attempts t_1" not in text, text  # the tenant's branch


def index_scans(dsn: str, index: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute("SELECT idx_scan FROM pg_stat_user_indexes WHERE schemaname = 'replaysafe' "
                        "AND indexrelname = %s", (index,)).fetchone()
        assert row is not None, f"no index {index}"
        return int(row[0])


def test_a_tenants_sweep_reads_its_own_expired_leases_only(
        world: str, make_role: Callable[..., str]) -> None:
    """Other tenants' expired leases are many; tenant A's sweep goes through the
    (tenant_id, lease_expires_at) index, not the one every tenant's sweep walks."""
    with psycopg.connect(world, autocommit=True) as c:
        c.execute("UPDATE replaysafe.actions SET state = 'running', "
                  "lease_expires_at = now() - interval '1 hour' WHERE action_key LIKE 'k1%%'")
        c.execute("ANALYZE replaysafe.actions")
    role = make_role("replaysafe_worker")
    bind(world, role, "A")
    tenant_idx, global_idx = "actions_tenant_running_lease_idx", "actions_running_lease_idx"
    before = index_scans(world, tenant_idx), index_scans(world, global_idx)
    with connect_as(world, role) as worker:
        swept = worker.execute("SELECT replaysafe.sweep_expired_actions(p_limit => 5)").fetchone()
        worker.execute("SELECT pg_stat_force_next_flush()")
    assert swept == (5,)
    after = index_scans(world, tenant_idx), index_scans(world, global_idx)
    assert after[0] > before[0] and after[1] == before[1], (before, after)
    with psycopg.connect(world) as c:
        left = c.execute("SELECT tenant_id, count(*) FROM replaysafe.actions WHERE state = 'unknown' "
                         "GROUP BY tenant_id").fetchall()
    assert left == [("A", 5)]


def test_a_tenants_purge_reads_its_own_old_actions_only(
        world: str, make_role: Callable[..., str]) -> None:
    """Every tenant's old actions are many; tenant A's purge goes through the
    (tenant_id, completed_at) index, not the one every tenant's purge walks."""
    with psycopg.connect(world, autocommit=True) as c:
        c.execute("UPDATE replaysafe.actions SET completed_at = now() - interval '40 days'")
        c.execute("ANALYZE replaysafe.actions")
    role = make_role("replaysafe_operator")
    bind(world, role, "A")
    tenant_idx, global_idx = "actions_tenant_terminal_completed_idx", "actions_terminal_completed_idx"
    before = index_scans(world, tenant_idx), index_scans(world, global_idx)
    with connect_as(world, role) as operator:
        purged = operator.execute("SELECT replaysafe.purge_actions(p_older_than => interval '30 days', "
                                  "p_limit => 7)").fetchone()
        operator.execute("SELECT pg_stat_force_next_flush()")
    assert purged == (7,)
    after = index_scans(world, tenant_idx), index_scans(world, global_idx)
    assert after[0] > before[0] and after[1] == before[1], (before, after)
    with psycopg.connect(world) as c:
        counts = dict(c.execute("SELECT tenant_id = 'A', count(*) FROM replaysafe.actions "
                                "GROUP BY 1").fetchall())
    assert counts == {True: 100 - 7, False: OTHERS + 1}


@pytest.mark.parametrize("view", ["multi_effect_actions", "unresolved_actions", "actions_v",
                                  "action_attempts_v", "threads_v"])
def test_no_query_through_the_views_starts_parallel_workers(
        world: str, make_role: Callable[..., str], view: str) -> None:
    """Parallel workers cost ~15 ms of start-up at 10 M actions, against ~2 ms for a tenant's
    rows; the planner, seeing every tenant's rows in the readers-of-everything branch, chose
    them for a tenant's aggregates. Here it is made to like them as much as it can."""
    role = make_role("replaysafe_worker")
    bind(world, role, "A")
    with connect_as(world, role) as worker:
        worker.execute("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
                       "SET min_parallel_table_scan_size = 0; SET min_parallel_index_scan_size = 0")
        text = plan(worker, f"SELECT count(*) FROM replaysafe.{view}")
        assert "Gather" not in text and "Parallel" not in text, text
