"""docs/isolation.md: what a worker holds is EXECUTE on its own duties, nothing else: no privilege
on any table (no lock either, so it cannot stall every tenant), no private helper, no
operator duty even when granted by mistake; and default privileges set before a migration
open nothing of the schema. Roles are real LOGIN roles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from helpers.db import connect_as, owner_rows, sqlstate
from helpers.seeded_tenants import TOKENS, VIEWS

import replaysafe_pg

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


TABLES = ("actions", "action_attempts", "role_bindings", "installation", "threads",
          "thread_versions", "alembic_version")


def test_worker_cannot_lock_a_table_or_a_view(seeded_world: str, worker_a: Conn) -> None:
    """Worker cannot lock a table or a view."""
    for table in TABLES:
        for mode in ("ACCESS EXCLUSIVE", "EXCLUSIVE", "SHARE", "ROW EXCLUSIVE", "ACCESS SHARE"):
            with worker_a.transaction():
                state = sqlstate(worker_a, f"LOCK TABLE replaysafe.{table} IN {mode} MODE NOWAIT")
                assert state == "42501", (table, mode, state)
    for view in VIEWS:
        for mode in ("ACCESS EXCLUSIVE", "EXCLUSIVE", "ROW EXCLUSIVE"):
            with worker_a.transaction():
                state = sqlstate(worker_a, f"LOCK TABLE replaysafe.{view} IN {mode} MODE NOWAIT")
                assert state == "42501", (view, mode, state)
        with worker_a.transaction():
            state = sqlstate(worker_a, f"SELECT 1 FROM replaysafe.{view} FOR UPDATE")
            assert state in ("42501", "0A000"), (view, state)


def test_worker_holds_no_privilege_on_any_table(seeded_world: str, worker_a: Conn) -> None:
    """Worker holds no privilege on any table."""
    before = owner_rows(seeded_world, "SELECT * FROM replaysafe.actions ORDER BY 1, 2")
    attempts = [
        "SELECT * FROM replaysafe.{t}",
        "UPDATE replaysafe.{t} SET {c} = {c}",
        "DELETE FROM replaysafe.{t}",
        "TRUNCATE replaysafe.{t}",
        "INSERT INTO replaysafe.{t} DEFAULT VALUES",
    ]
    for table in TABLES:
        column = owner_rows(seeded_world, "SELECT attname FROM pg_attribute WHERE attnum = 1 AND "
                                          f"attrelid = 'replaysafe.{table}'::regclass")[0][0]
        for stmt in attempts:
            assert sqlstate(worker_a, stmt.format(t=table, c=column)) == "42501", (table, stmt)
    # The forgeries a worker would try: an outcome without an attempt, a rewritten thread history.
    for stmt in ("UPDATE replaysafe.actions SET state = 'succeeded' WHERE action_key = 'live'",
                 "DELETE FROM replaysafe.action_attempts WHERE tenant_id = 'A'",
                 "UPDATE replaysafe.thread_versions SET state = '{}' WHERE tenant_id = 'A'",
                 "UPDATE replaysafe.threads SET user_id = 'mallory', version = 1"):
        assert sqlstate(worker_a, stmt) == "42501", stmt
    assert owner_rows(seeded_world, "SELECT * FROM replaysafe.actions ORDER BY 1, 2") == before


def test_private_helpers_and_operator_duties_are_not_a_workers(seeded_world: str, worker_a: Conn) -> None:
    """Private helpers and operator duties are not a workers."""
    with psycopg.connect(seeded_world) as owner:
        private = [r[0] for r in owner.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = 'replaysafe'::regnamespace AND p.proname LIKE '\\_%'")]
    assert "replaysafe._report(text,text,integer,text,replaysafe.action_state,jsonb,jsonb,text," \
           "timestamp with time zone,text)" in private
    for fn in private:
        assert worker_a.execute("SELECT has_function_privilege(%s, 'EXECUTE')",
                                (fn,)).fetchone() == (False,), fn
    # success with a NULL result through the private report helper (a forgery),
    # even with the attempt's own token
    assert sqlstate(worker_a, "SELECT replaysafe._report('A', 'live', 1, %s, 'succeeded', NULL, "
                              "NULL, NULL, now(), NULL)", (TOKENS["A", "live"],)) == "42501"
    for call in (
            "replaysafe.resolve_action(p_tenant_id => 'A', p_action_key => 'live', "
            "p_state => 'succeeded')",
            "replaysafe.reopen_action(p_tenant_id => 'A', p_action_key => 'done', p_note => 'x')",
            "replaysafe.purge_actions(p_older_than => '0 seconds')",
            "replaysafe.bind_role_to_tenant(p_role => current_user, p_tenant_id => 'B')",
            "replaysafe.unbind_role(p_role => current_user)",
            "replaysafe.idempotency_key(p_tenant_id => 'B', p_action_key => 'done')"):
        assert sqlstate(worker_a, f"SELECT {call}") == "42501", call
    assert owner_rows(seeded_world, "SELECT action_key, state::text FROM replaysafe.actions "
                                    "WHERE tenant_id = 'A' ORDER BY 1") == [("done", "succeeded"),
                                                                           ("live", "running")]


def test_default_privileges_open_nothing(empty_dsn: str, make_role: MakeRole) -> None:
    """Default privileges open nothing."""
    app = make_role()
    with psycopg.connect(empty_dsn, autocommit=True) as owner:
        for grant in ("EXECUTE ON FUNCTIONS", "SELECT, INSERT, UPDATE, DELETE ON TABLES"):
            owner.execute(f'ALTER DEFAULT PRIVILEGES GRANT {grant} TO "{app}"')
            owner.execute(f'ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT {grant} TO "{app}"')
    try:
        import replaysafe_pg

        replaysafe_pg.migrate(empty_dsn)
        with psycopg.connect(empty_dsn) as owner:
            granted = owner.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p "
                "WHERE p.pronamespace = 'replaysafe'::regnamespace "
                "AND has_function_privilege(%s, p.oid, 'EXECUTE')", (app,)).fetchall()
            tables = owner.execute(
                "SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = "
                "'replaysafe'::regnamespace AND c.relkind = 'r' "
                "AND has_table_privilege(%s, c.oid, 'SELECT')", (app,)).fetchall()
        assert granted == [] and tables == []
        with connect_as(empty_dsn, app) as c:
            assert sqlstate(c, "SELECT replaysafe.bind_role_to_tenant(p_role => current_user, "
                               "p_tenant_id => 'victim')") == "42501"
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as owner:
            for grant in ("EXECUTE ON FUNCTIONS", "SELECT, INSERT, UPDATE, DELETE ON TABLES"):
                owner.execute(f'ALTER DEFAULT PRIVILEGES REVOKE {grant} FROM "{app}"')
                owner.execute(f'ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE {grant} FROM "{app}"')


def test_default_privileges_on_schemas_open_nothing(empty_dsn: str, make_role: MakeRole) -> None:
    """Default privileges on schemas open nothing."""
    app = make_role()
    with psycopg.connect(empty_dsn, autocommit=True) as owner:
        owner.execute(f'ALTER DEFAULT PRIVILEGES GRANT CREATE, USAGE ON SCHEMAS TO "{app}"')
    try:
        import replaysafe_pg

        replaysafe_pg.migrate(empty_dsn)
        with connect_as(empty_dsn, app) as c:
            assert sqlstate(c, "CREATE FUNCTION replaysafe.complete_action(text, text, integer, "
                               "text, jsonb, text) RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$") == "42501"
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as owner:
            owner.execute(f'ALTER DEFAULT PRIVILEGES REVOKE CREATE, USAGE ON SCHEMAS FROM "{app}"')


def test_operator_duties_check_the_role_themselves(seeded_world: str, worker_a: Conn) -> None:
    """Operator duties check the role themselves."""
    with psycopg.connect(seeded_world, autocommit=True) as owner:  # a grant by mistake
        owner.execute("GRANT EXECUTE ON FUNCTION replaysafe.resolve_action(text, text, text, jsonb, "
                      "jsonb, text, text, timestamptz, integer, text), replaysafe.reopen_action(text, "
                      "text, text, timestamptz, text), replaysafe.purge_actions(interval, integer, "
                      "timestamptz, text, text) TO replaysafe_worker")
        owner.execute("SELECT replaysafe.mark_action_unknown(p_tenant_id => 'A', p_action_key => 'live', "
                      "p_attempt => 1, p_attempt_token => %s, p_error => '{}')", (TOKENS["A", "live"],))
    for call in ("replaysafe.resolve_action(p_tenant_id => 'A', p_action_key => 'live', "
                 "p_state => 'succeeded', p_result => '{\"forged\": 1}')",
                 "replaysafe.reopen_action(p_tenant_id => 'A', p_action_key => 'done', p_note => 'x')",
                 "replaysafe.purge_actions(p_older_than => '0 seconds')"):
        assert sqlstate(worker_a, f"SELECT {call}") == "RS004", call
    assert owner_rows(seeded_world, "SELECT action_key, state::text FROM replaysafe.actions "
                                    "WHERE tenant_id = 'A' ORDER BY 1") == [("done", "succeeded"),
                                                                           ("live", "unknown")]


def test_an_upgrade_to_0005_under_default_privileges_opens_nothing(empty_dsn: str,
                                                                   make_role: MakeRole) -> None:
    """Default privileges set after 0004, before 0005: the new claim functions, the private
    _claim_locked and the replaced view get none of them, and PUBLIC keeps no EXECUTE."""
    app = make_role()
    replaysafe_pg.migrate(empty_dsn, "0004")
    with psycopg.connect(empty_dsn, autocommit=True) as owner:
        owner.execute(f'ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO "{app}"')
        owner.execute(f'ALTER DEFAULT PRIVILEGES GRANT ALL ON TABLES TO "{app}"')
    try:
        replaysafe_pg.migrate(empty_dsn)
        open_to = owner_rows(empty_dsn, """
            SELECT p.oid::regprocedure::text, a.grantee::regrole::text FROM pg_proc p,
                   aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
            WHERE p.pronamespace = 'replaysafe'::regnamespace AND a.grantee <> p.proowner
              AND (a.grantee = 0 OR a.grantee = %s::regrole)""", (app,))
        assert open_to == [], open_to
        views = owner_rows(empty_dsn, """
            SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = 'replaysafe'::regnamespace
              AND (has_table_privilege(%s, c.oid, 'SELECT')
                   OR has_any_column_privilege(%s, c.oid, 'SELECT'))""", (app, app))
        assert views == [], views
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as owner:
            owner.execute(f'ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM "{app}"')
            owner.execute(f'ALTER DEFAULT PRIVILEGES REVOKE ALL ON TABLES FROM "{app}"')
