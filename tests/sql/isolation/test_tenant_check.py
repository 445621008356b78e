"""docs/isolation.md: tenant isolation by role binding, for every function and for direct SQL on every
table and view of the schema. The functions are the only way in (SECURITY DEFINER); no group
role holds a privilege on a table; the views show the caller's tenant. Roles are real LOGIN
roles. The attacks on the boundary are in the other files of tests/sql/isolation."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as, owner_rows, sqlstate
from helpers.fixed_clock import at
from helpers.seeded_tenants import TOKENS, b_rows
from psycopg import conninfo as pg_conninfo
from psycopg import sql

from replaysafe_pg import AccessDenied, Ledger, Threads

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


# The attempt token of each tenant's live lease (every world seeds anew).
LIVE_TOKENS: dict[str, str] = {}


def seed(dsn: str, tenant: str) -> None:
    """Per tenant: a finished old action, an expired lease, a live lease, two threads."""
    with Ledger(dsn, tenant_id=tenant, worker_id="w") as led:
        done = led.claim("done", "refund", {"n": 1}, lease=30, now=at(0))
        led.complete(done, {"ok": tenant}, now=at(1))
        led.claim("expired", "refund", {"n": 2}, lease=30, now=at(0))
        live = led.claim("live", "refund", {"n": 3}, lease=3600, now=at(0))
        assert live.attempt_token is not None
        LIVE_TOKENS[tenant] = live.attempt_token
    with Threads(dsn, tenant_id=tenant) as th:
        th.write("shared", {"tenant": tenant}, 0)
        th.write("shared", {"tenant": tenant, "v": 2}, 1)
    with Threads(dsn, tenant_id=tenant, user_id="u1") as th:
        th.write("owned", {"tenant": tenant}, 0)


@pytest.fixture
def world(dsn: str) -> str:
    seed(dsn, "A")
    seed(dsn, "B")
    return dsn


def relations(dsn: str) -> list[tuple[str, str, bool]]:
    """Every table and view of the schema: (name, relkind, has a tenant_id column)."""
    with psycopg.connect(dsn) as c:
        return c.execute("""
            SELECT k.relname, k.relkind::text,
                   EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                           WHERE a.attrelid = k.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)
            FROM pg_catalog.pg_class k JOIN pg_catalog.pg_namespace n ON n.oid = k.relnamespace
            WHERE n.nspname = 'replaysafe' AND k.relkind IN ('r', 'v', 'p', 'm')
            ORDER BY 1""").fetchall()


def tenant_rows(c: Conn, relation: str) -> list[str] | None:
    """tenant_id of every visible row, or None when the role may not read the relation."""
    try:
        rows = c.execute(sql.SQL("SELECT tenant_id FROM replaysafe.{}").format(
            sql.Identifier(relation))).fetchall()
    except psycopg.errors.InsufficientPrivilege:
        return None
    return [r[0] for r in rows]


def snapshot(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, as the owner sees it."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with psycopg.connect(dsn) as c:
        for name, kind, _ in relations(dsn):
            if kind == "r":
                q = sql.SQL("SELECT * FROM replaysafe.{} ORDER BY 1").format(sql.Identifier(name))
                out[name] = sorted(tuple(map(str, r)) for r in c.execute(q).fetchall())
    return out


def thread_and_ledger_calls(tenant: str) -> list[str]:
    """One call of every function that takes a tenant, for ``tenant`` (the reports and the
    heartbeat with the token of its live attempt: what is refused is the tenant)."""
    t = f"p_tenant_id => '{tenant}'"
    tok = f"p_attempt_token => '{LIVE_TOKENS[tenant]}'"
    return [
        f"replaysafe.claim_action({t}, p_action_key => 'new', p_operation => 'refund', "
        "p_request => '{}', p_worker_id => 'w')",
        f"replaysafe.claim_action({t}, p_action_key => 'done', p_operation => 'refund', "
        "p_request => '{\"n\": 1}', p_worker_id => 'w')",
        f"replaysafe.claim_actions({t}, p_action_keys => '{{new2}}', p_operations => '{{refund}}', "
        "p_requests => ARRAY['{}'::jsonb], p_worker_id => 'w')",
        f"replaysafe.heartbeat_action({t}, p_action_key => 'live', p_attempt => 1, {tok})",
        f"replaysafe.complete_action({t}, p_action_key => 'live', p_attempt => 1, {tok}, "
        "p_result => '{}')",
        f"replaysafe.fail_action({t}, p_action_key => 'live', p_attempt => 1, {tok}, "
        "p_error => '{}')",
        f"replaysafe.mark_action_unknown({t}, p_action_key => 'live', p_attempt => 1, {tok}, "
        "p_error => '{}')",
        f"replaysafe.read_thread({t}, p_thread_id => 'shared')",
        f"replaysafe.write_thread({t}, p_thread_id => 'shared', p_expected_version => 2, "
        "p_state => '{}')",
        f"replaysafe.write_thread({t}, p_thread_id => 'brand_new', p_expected_version => 0, "
        "p_state => '{}')",
        f"replaysafe.thread_history({t}, p_thread_id => 'shared')",
        f"replaysafe.delete_thread({t}, p_thread_id => 'shared')",
    ]


def assert_every_call_denied(c: Conn, tenant: str) -> None:
    for call in thread_and_ledger_calls(tenant):
        with pytest.raises(psycopg.Error) as err:
            c.execute(f"SELECT * FROM {call}")
        assert err.value.sqlstate == "RS004", (call, err.value)


# --- through the functions -------------------------------------------------------------

def test_bound_role_gets_rs004_for_every_function_of_another_tenant(world: str,
                                                                    worker_a: Conn) -> None:
    before = snapshot(world)
    assert_every_call_denied(worker_a, "B")
    assert snapshot(world) == before
    # The same role acts for its own tenant (so the denials above are about the tenant).
    assert worker_a.execute("SELECT version FROM replaysafe.read_thread(p_tenant_id => 'A', "
                            "p_thread_id => 'shared')").fetchone() == (2,)
    for call in thread_and_ledger_calls("A"):
        try:
            worker_a.execute(f"SELECT * FROM {call}")
        except psycopg.Error as exc:  # e.g. RS006 once the action is finished
            assert exc.sqlstate not in ("RS004", "42501"), (call, exc)
    assert worker_a.execute("SELECT version FROM replaysafe.read_thread(p_tenant_id => 'A', "
                            "p_thread_id => 'shared')").fetchone() == (4,)  # write + delete


def test_bound_role_through_the_driver(world: str, make_role: MakeRole) -> None:
    role = make_role("replaysafe_worker")
    bind(world, role, "A")
    role_dsn = pg_conninfo.make_conninfo(world, user=role)
    with Threads(role_dsn, tenant_id="B") as b, Ledger(role_dsn, tenant_id="B") as led:
        with pytest.raises(AccessDenied):
            b.read("shared")
        with pytest.raises(AccessDenied):
            b.write("shared", {"x": 1}, 2)
        with pytest.raises(AccessDenied):
            led.claim("k", "op", {})
    with Threads(role_dsn, tenant_id="A") as a:
        assert a.write("shared", {"x": 1}, 2) == 3
    # Ownership still applies inside the tenant.
    with Threads(role_dsn, tenant_id="A", user_id="u2") as a, pytest.raises(AccessDenied):
        a.read("owned")


def test_sweep_and_purge_as_bound_role_touch_only_its_tenant(world: str, worker_a: Conn,
                                                            make_role: MakeRole) -> None:
    # The seeded leases are of 2026-01-01; only an operator may sweep at a time of its choice.
    with pytest.raises(psycopg.Error) as err:
        worker_a.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)", (at(60),))
    assert err.value.sqlstate == "RS005"
    operator = make_role("replaysafe_operator")  # purging is an operator's duty
    bind(world, operator, "A")
    with connect_as(world, operator) as c:
        swept = c.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)",
                          (at(60),)).fetchone()
        assert swept == (1,)
        purged = c.execute("SELECT replaysafe.purge_actions(p_older_than => '10 seconds', "
                           "p_now => %s)", (at(60),)).fetchone()
    assert purged == (1,)
    with psycopg.connect(world) as owner:
        states = owner.execute("SELECT tenant_id, action_key, state::text FROM replaysafe.actions "
                               "ORDER BY 1, 2").fetchall()
    assert states == [("A", "expired", "unknown"), ("A", "live", "running"),
                      ("B", "done", "succeeded"), ("B", "expired", "running"),
                      ("B", "live", "running")]


# --- through direct SQL ----------------------------------------------------------------

def test_bound_role_direct_sql_sees_its_tenant_through_the_views_only(
        world: str, worker_a: Conn) -> None:
    before = snapshot(world)
    rels = relations(world)
    seen_a = set()
    for name, kind, _has_tenant in rels:
        if kind != "v" or name.startswith("_"):  # tables and the private view: no privilege
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker_a.execute(sql.SQL("SELECT 1 FROM replaysafe.{}").format(sql.Identifier(name)))
            continue
        visible = tenant_rows(worker_a, name)
        assert visible is not None, name
        assert "B" not in visible, name
        if "A" in visible:
            seen_a.add(name)
    assert seen_a >= {"actions_v", "action_attempts_v", "threads_v", "unresolved_actions"}

    not_writable = (psycopg.errors.InsufficientPrivilege,
                    psycopg.errors.ObjectNotInPrerequisiteState, psycopg.errors.FeatureNotSupported)
    for name, _kind, has_tenant in rels:
        if not has_tenant:
            continue
        for stmt in ("UPDATE replaysafe.{} SET tenant_id = tenant_id WHERE tenant_id = 'B'",
                     "UPDATE replaysafe.{} SET tenant_id = 'A' WHERE tenant_id = 'A'",
                     "DELETE FROM replaysafe.{} WHERE tenant_id = 'B'",
                     "DELETE FROM replaysafe.{}"):
            with pytest.raises(not_writable):
                worker_a.execute(sql.SQL(stmt).format(sql.Identifier(name)))
    assert snapshot(world) == before


def test_bound_role_cannot_insert_rows_of_another_tenant(world: str, worker_a: Conn) -> None:
    inserts = [
        "INSERT INTO replaysafe.threads (tenant_id, thread_id, version, history_limit, oldest_kept, "
        "created_at, updated_at) VALUES ('B', 'x', 1, 20, 1, now(), now())",
        "INSERT INTO replaysafe.thread_versions (tenant_id, thread_id, version, state, created_at) "
        "VALUES ('B', 'shared', 3, '{}', now())",
        "INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, "
        "claimed_at) VALUES ('B', 'live', 2, 'w', now())",
        "INSERT INTO replaysafe.role_bindings (role_name, tenant_id) VALUES (current_user, 'B')",
    ]
    for stmt in inserts:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker_a.execute(stmt)


def test_unbound_role_sees_and_changes_nothing(world: str, make_role: MakeRole) -> None:
    role = make_role("replaysafe_worker")
    before = snapshot(world)
    with connect_as(world, role) as c:
        for tenant in ("A", "B"):
            assert_every_call_denied(c, tenant)
        for name, _kind, has_tenant in relations(world):
            if has_tenant:
                assert tenant_rows(c, name) in ([], None), name
        assert c.execute("SELECT replaysafe.sweep_expired_actions()").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # an operator's duty
            c.execute("SELECT replaysafe.purge_actions(p_older_than => '0 seconds')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("DELETE FROM replaysafe.thread_versions")
    assert snapshot(world) == before


def test_auditor_bound_to_all_tenants_reads_every_tenant_and_cannot_write(
        world: str, make_role: MakeRole) -> None:
    role = make_role("replaysafe_auditor")
    with connect_as(world, role) as c:  # unbound: nothing, whatever its group
        for name in ("actions_v", "action_attempts_v", "threads_v", "unresolved_actions"):
            assert set(tenant_rows(c, name) or []) == set(), name
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute("SELECT replaysafe.bind_role_to_all_tenants(p_role => %s)", (role,))
    before = snapshot(world)
    with connect_as(world, role) as c:
        for name in ("actions_v", "action_attempts_v", "threads_v", "unresolved_actions"):
            assert set(tenant_rows(c, name) or []) == {"A", "B"}, name
        for name in ("actions", "action_attempts", "threads", "thread_versions", "role_bindings"):
            assert tenant_rows(c, name) is None, name
        for stmt in ("DELETE FROM replaysafe.thread_versions",
                     "UPDATE replaysafe.threads SET version = version + 1",
                     "UPDATE replaysafe.actions SET state = 'failed'",
                     "INSERT INTO replaysafe.role_bindings (role_name, tenant_id) VALUES ('x', 'A')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(stmt)
        with pytest.raises((psycopg.errors.InsufficientPrivilege,  # a view not even updatable
                            psycopg.errors.ObjectNotInPrerequisiteState)):
            c.execute("UPDATE replaysafe.actions_v SET state = 'failed'")
        for call in ("replaysafe.write_thread(p_tenant_id => 'A', p_thread_id => 'shared', "
                     "p_expected_version => 2, p_state => '{}')",
                     "replaysafe.sweep_expired_actions()"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(f"SELECT {call}")
    assert snapshot(world) == before

    bind(world, role, "A")  # a bound auditor reads its tenant only
    with connect_as(world, role) as c:
        assert set(tenant_rows(c, "threads_v") or []) == {"A"}
        assert set(tenant_rows(c, "actions_v") or []) == {"A"}


# --- bindings --------------------------------------------------------------------------

def test_rebinding_moves_the_role_and_unbinding_removes_it(world: str, make_role: MakeRole) -> None:
    role = make_role("replaysafe_worker")
    bind(world, role, "A")
    with connect_as(world, role) as c:
        assert set(tenant_rows(c, "threads_v") or []) == {"A"}
    bind(world, role, "B")
    with connect_as(world, role) as c:
        assert set(tenant_rows(c, "threads_v") or []) == {"B"}
        assert_every_call_denied(c, "A")
        assert c.execute("SELECT version FROM replaysafe.read_thread(p_tenant_id => 'B', "
                         "p_thread_id => 'shared')").fetchone() == (2,)
    with psycopg.connect(world, autocommit=True) as owner:
        assert owner.execute("SELECT replaysafe.unbind_role(p_role => %s)", (role,)).fetchone() == (True,)
        assert owner.execute("SELECT replaysafe.unbind_role(p_role => %s)", (role,)).fetchone() == (False,)
    with connect_as(world, role) as c:
        assert tenant_rows(c, "threads_v") == []
        assert_every_call_denied(c, "B")


def test_bound_role_sees_no_binding_and_cannot_change_bindings(
        world: str, make_role: MakeRole) -> None:
    role_a, role_b = make_role("replaysafe_worker"), make_role("replaysafe_worker")
    bind(world, role_a, "A")
    bind(world, role_b, "B")
    with connect_as(world, role_a) as c:
        assert tenant_rows(c, "role_bindings") is None
        for call in (f"replaysafe.bind_role_to_tenant(p_role => '{role_a}', p_tenant_id => 'B')",
                     f"replaysafe.unbind_role(p_role => '{role_b}')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(f"SELECT {call}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("UPDATE replaysafe.role_bindings SET tenant_id = 'B'")
    with psycopg.connect(world) as owner:
        assert owner.execute("SELECT role_name, tenant_id FROM replaysafe.role_bindings "
                             "ORDER BY tenant_id").fetchall() == [(role_a, "A"), (role_b, "B")]


def test_bind_role_to_tenant_checks_its_arguments(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for args in ("p_role => 'no_such_role_x', p_tenant_id => 'A'",
                     "p_role => NULL, p_tenant_id => 'A'",
                     "p_role => current_user, p_tenant_id => ''"):
            with pytest.raises(psycopg.Error) as err:
                c.execute(f"SELECT replaysafe.bind_role_to_tenant({args})")
            assert err.value.sqlstate == "RS005"
        assert c.execute("SELECT count(*) FROM replaysafe.role_bindings").fetchone() == (0,)


def test_bound_sweep_and_purge_touch_only_their_tenant(claimed_world: str, make_role: MakeRole) -> None:
    """Bound sweep and purge touch only their tenant."""
    before = b_rows(claimed_world)
    worker = make_role("replaysafe_worker")
    operator = make_role("replaysafe_operator")
    for role in (worker, operator):
        bind(claimed_world, role, "A")
    with connect_as(claimed_world, worker) as c:
        assert c.execute(b"SELECT replaysafe.sweep_expired_actions()").fetchone() == (1,)
        assert sqlstate(c, "SELECT replaysafe.purge_actions(p_older_than => '0 seconds')") == "42501"
    with connect_as(claimed_world, operator) as c:
        # SET ROLE to the group never widens; a far future p_now is an operator's right, in
        # its own tenant only.
        c.execute(b"SET ROLE replaysafe_operator")
        far = datetime.now(UTC) + timedelta(days=3650)
        assert c.execute(b"SELECT replaysafe.sweep_expired_actions(p_limit => 2147483647, "
                         b"p_now => %s)", (far,)).fetchone() == (1,)  # A's live lease
        assert c.execute(b"SELECT replaysafe.purge_actions(p_older_than => '0 seconds', "
                         b"p_limit => 2147483647, p_now => %s)", (far,)).fetchone() == (3,)
    assert b_rows(claimed_world) == before
    assert owner_rows(claimed_world, "SELECT action_key, state::text FROM replaysafe.actions "
                             "WHERE tenant_id = 'A' ORDER BY 1") == [("expired", "unknown"),
                                                                     ("live", "unknown")]


def test_operator_settles_reopens_and_purges_its_tenant_only(seeded_world: str,
                                                             make_role: MakeRole) -> None:
    """Operator settles reopens and purges its tenant only."""
    operator = make_role("replaysafe_operator")
    bind(seeded_world, operator, "A")
    with psycopg.connect(seeded_world, autocommit=True) as owner:
        for tenant in ("A", "B"):
            owner.execute("SELECT replaysafe.mark_action_unknown(p_tenant_id => %s, "
                          "p_action_key => 'live', p_attempt => 1, p_attempt_token => %s, "
                          "p_error => '{}')", (tenant, TOKENS[tenant, "live"]))
    with connect_as(seeded_world, operator) as c:
        assert c.execute("SELECT replaysafe.resolve_action(p_tenant_id => 'A', p_action_key => 'live', "
                         "p_state => 'failed', p_error => '{}', p_expected_attempt => 1)"
                         ).fetchone() == ("failed",)
        assert c.execute("SELECT replaysafe.reopen_action(p_tenant_id => 'A', p_action_key => 'live', "
                         "p_note => 'the bug is fixed')").fetchone() == ("retryable",)
        assert sqlstate(c, "SELECT replaysafe.resolve_action(p_tenant_id => 'B', "
                           "p_action_key => 'live', p_state => 'failed')") == "RS004"
        # an operator may move time (reconciliation of old actions), a worker may not
        assert c.execute("SELECT replaysafe.purge_actions(p_older_than => '0 seconds', "
                         "p_now => now() + interval '1 day')").fetchone() == (1,)
        # claiming is a worker's duty
        assert sqlstate(c, "SELECT replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'x', "
                           "p_operation => 'op', p_request => '{}', p_worker_id => 'w')") == "42501"
    assert owner_rows(seeded_world, "SELECT tenant_id, action_key, state::text, resolution_note "
                             "FROM replaysafe.actions ORDER BY 1, 2") == [
        ("A", "live", "retryable", "the bug is fixed"),
        ("B", "done", "succeeded", None), ("B", "live", "unknown", None)]
