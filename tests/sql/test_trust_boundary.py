"""docs/isolation.md, the trust boundary, tried as an attacker holding a worker's credentials.

Each test reproduces one finding of the security review (docs/isolation.md, threat model):
it fails on the 0002 schema and passes on the current one. Roles are real LOGIN roles.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as, owner_rows, plan_counts, require_maintain_privilege, sqlstate
from psycopg import sql

Conn = psycopg.Connection[Any]
ROOT = Path(__file__).resolve().parents[2]
MakeRole = Callable[..., str]

TABLES = ("actions", "action_attempts", "role_bindings", "installation", "threads",
          "thread_versions", "alembic_version")
VIEWS = ("actions_v", "action_attempts_v", "unresolved_actions", "multi_effect_actions",
         "threads_v")


# The attempt tokens of the seeded claims, by (tenant, action key): every world seeds anew.
TOKENS: dict[tuple[str, str], str] = {}


def token_of(row: tuple[Any, ...] | None) -> str:
    """The attempt token of a claim's answer (``... attempt_token FROM claim_action(...)``)."""
    assert row is not None and row[-1] is not None, row
    token: str = row[-1]
    return token


def seed(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for tenant in ("A", "B"):
            done = token_of(c.execute(
                "SELECT attempt_token FROM replaysafe.claim_action(p_tenant_id => %s, "
                "p_action_key => 'done', p_operation => 'refund', p_request => '{}', "
                "p_worker_id => 'w')", (tenant,)).fetchone())
            c.execute("SELECT replaysafe.complete_action(p_tenant_id => %s, p_action_key => 'done', "
                      "p_attempt => 1, p_attempt_token => %s, p_result => '{\"ok\": true}')",
                      (tenant, done))
            TOKENS[tenant, "live"] = token_of(c.execute(
                "SELECT attempt_token FROM replaysafe.claim_action(p_tenant_id => %s, "
                "p_action_key => 'live', p_operation => 'refund', p_request => '{}', "
                "p_worker_id => 'w', p_lease => '1 hour')", (tenant,)).fetchone())
            c.execute("SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => 'mine', "
                      "p_expected_version => 0, p_state => '{\"n\": 1}', p_user_id => 'alice')",
                      (tenant,))


@pytest.fixture
def world(dsn: str) -> str:
    seed(dsn)
    return dsn


# --- finding 1: function hijack through search_path -------------------------------------------

# Concrete stand-ins for polymorphic argument types, so an overload is an exact match.
POLY = {"anyelement": ["text", "integer", "jsonb"], "anycompatible": ["text", "integer", "jsonb"],
        "anynonarray": ["text", "integer"], "any": ["text", "integer", "jsonb", "timestamptz"],
        "anyarray": ["text[]", "jsonb[]", "integer[]"],
        "anycompatiblearray": ["text[]", "jsonb[]", "integer[]"]}
SKIP_TYPES = {"internal", "cstring", "trigger", "event_trigger", "anyrange", "anymultirange",
              "anycompatiblerange", "anycompatiblemultirange", "record", "language_handler"}
# Type names the schema's bodies use that resolve through search_path (integer, bigint,
# boolean and interval are keywords that always mean pg_catalog's): a pg_temp domain of each
# shadows it on an unpinned path.
DOMAIN_TYPES = ("text", "jsonb", "timestamptz", "int4", "int8", "bool", "regrole", "bytea")


def called_names(conn: Conn) -> set[str]:
    """Every function name called in the body of a function or view of the schema, minus
    the schema's own (schema-qualified) ones."""
    bodies = [r[0] for r in conn.execute(
        "SELECT prosrc FROM pg_proc WHERE pronamespace = 'replaysafe'::regnamespace").fetchall()]
    bodies += [r[0] for r in conn.execute(
        "SELECT pg_get_viewdef(c.oid) FROM pg_class c "
        "WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind = 'v'").fetchall()]
    names: set[str] = set()
    for body in bodies:
        for m in re.finditer(r"(?<![\w.])([a-z_][a-z0-9_]*)\s*\(", body, re.IGNORECASE):
            names.add(m.group(1).lower())
        for m in re.finditer(r"\bpg_catalog\.([a-z_][a-z0-9_]*)\s*\(", body):
            names.add(m.group(1))
    return names


def overload_signatures(conn: Conn, name: str) -> list[tuple[list[str], str, bool]]:
    """Exact-typed signatures (args, return type, returns set) that shadow the built-ins."""
    rows = conn.execute("""
        SELECT p.proargtypes::regtype[]::text[], p.prorettype::regtype::text, p.proretset,
               p.provariadic <> 0, p.prokind
        FROM pg_proc p WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = %s
          AND p.prokind IN ('f', 'a')""", (name,)).fetchall()
    out: list[tuple[list[str], str, bool]] = []
    for args, ret, retset, variadic, _kind in rows:
        args = [a.strip('"') for a in args]
        if variadic and args and args[-1] in ("any", '"any"'):
            extra = ("text", "integer", "bigint", "timestamptz")
            expansions = [[*args[:-1], *combo] for n in range(4)
                          for combo in itertools.product(extra, repeat=n)]
        else:
            expansions = [list(combo) for combo in itertools.product(*(POLY.get(a, [a]) for a in args))]
        for sig in expansions:
            if any(t in SKIP_TYPES or (t.endswith("[]") and t[:-2] in SKIP_TYPES) for t in sig):
                continue
            r = ret.strip('"')
            if r in POLY:
                r = next((t for t in sig if t not in ("integer",)), "text")
                if ret in ("anyarray", "anycompatiblearray") and not r.endswith("[]"):
                    r = r + "[]"
            if r in SKIP_TYPES or (r == "void" and retset):
                continue
            out.append((sig, r, retset))
    return out


def plant_overloads(attacker: Conn, names: set[str]) -> int:
    attacker.execute("CREATE TABLE public.hijacked (name text, by_role text)")
    attacker.execute("GRANT INSERT, SELECT ON public.hijacked TO PUBLIC")
    planted: set[tuple[str, tuple[str, ...]]] = set()
    for name in sorted(names):
        for args, ret, retset in overload_signatures(attacker, name):
            key = (name, tuple(args))
            if key in planted:
                continue
            planted.add(key)
            result = "RETURN;" if retset or ret == "void" else "RETURN NULL;"
            stmt = (f"CREATE FUNCTION public.{name}({', '.join(args)}) "
                    f"RETURNS {'SETOF ' if retset else ''}{ret} LANGUAGE plpgsql AS $f$ BEGIN "
                    f"INSERT INTO public.hijacked VALUES ('{name}', current_user); {result} END $f$")
            try:
                attacker.execute(stmt)
            except psycopg.Error:
                continue  # e.g. a signature Postgres will not take as written
            attacker.execute(f"GRANT EXECUTE ON FUNCTION public.{name}({', '.join(args)}) TO PUBLIC")
    # Operators the bodies use, exact-typed.
    for typ in ("text", "jsonb", "integer", "bigint", "timestamptz", "bytea"):
        attacker.execute(f"CREATE FUNCTION public.hijack_op(a {typ}, b {typ}) RETURNS boolean "
                         "LANGUAGE plpgsql AS $f$ BEGIN INSERT INTO public.hijacked "
                         "VALUES ('operator', current_user); RETURN true; END $f$")
    for op, typ in (("=", "text"), ("<>", "text"), ("<>", "jsonb"), ("=", "integer"),
                    ("<=", "timestamptz"), (">", "timestamptz"), ("<", "integer"),
                    ("=", "bigint"), ("<>", "bigint"), ("=", "bytea"), ("<>", "bytea")):
        attacker.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {typ}, RIGHTARG = {typ}, "
                         "FUNCTION = public.hijack_op)")
    return len(planted)


def plant_temp_domains(victim: Conn) -> None:
    """The victim's own session shadows the base types with pg_temp domains whose check logs."""
    victim.execute("CREATE FUNCTION pg_temp.hijack_check(v text) RETURNS boolean LANGUAGE sql "
                   "AS $f$ INSERT INTO public.hijacked VALUES ('pg_temp domain', current_user) "
                   "RETURNING true $f$")
    for t in DOMAIN_TYPES:
        victim.execute(f"CREATE DOMAIN pg_temp.{t} AS pg_catalog.{t} "
                       f"CHECK (pg_temp.hijack_check(VALUE::pg_catalog.text))")


def exercise_every_function(c: Conn, tenant: str, *, operator: bool) -> int:
    """Call every public function down as many paths as possible (errors are expected);
    how many calls succeeded. The caller's own statements name only literals: what they
    would resolve through its hostile search_path is the caller's own business.

    A claim's entry is a tuple naming the keys its answer is for (in order): the attempt
    token of each claimed one is kept under that name, and <name> in a later call stands
    for it (for a token no attempt has when nothing was claimed under the name)."""
    t = f"p_tenant_id => '{tenant}'"
    calls: list[str | tuple[str, ...]] = [
        (f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h1', p_operation => 'op', "
         "p_request => '{}', p_worker_id => 'w', p_lease => '1 second')", "h1"),
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h1', p_operation => 'op', "
        "p_request => '{}', p_worker_id => 'w')",  # running: registers a waiter
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h1', p_operation => 'op2', "
        "p_request => '{}', p_worker_id => 'w')",  # RS001
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => '', p_operation => 'op', "
        "p_request => '[]', p_worker_id => 'w', p_lease => '8 days')",  # RS005
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h9', p_operation => 'op', "
        "p_request => '{}', p_worker_id => 'w', p_now => 'infinity')",  # RS005
        (f"SELECT * FROM replaysafe.claim_actions({t}, p_action_keys => '{{h2,h3}}', "
         "p_operations => '{op,op}', p_requests => '{\"{}\",\"{}\"}', p_worker_id => 'w', "
         "p_on_expired => 'reclaim', p_lease => '1 second')", "h2", "h3"),
        f"SELECT * FROM replaysafe.claim_actions({t}, p_action_keys => '{{h2,h2}}', "
        "p_operations => '{op,op}', p_requests => '{\"{}\",\"{}\"}', p_worker_id => 'w')",
        # A claim token: the attempt token is derived from it, and a retry answers it again.
        (f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h4', p_operation => 'op', "
         "p_request => '{}', p_worker_id => 'w', p_claim_token => 'a-claim-token-of-22-chars-or-more')",
         "h4"),
        (f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h4', p_operation => 'op', "
         "p_request => '{}', p_worker_id => 'w', p_claim_token => 'a-claim-token-of-22-chars-or-more')",
         "h4"),
        f"SELECT replaysafe.complete_action({t}, p_action_key => 'h4', p_attempt => 1, "
        "p_attempt_token => '<h4>', p_result => '{}')",
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => '<h1>')",
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h1', p_attempt => 7, "
        "p_attempt_token => '<h1>')",  # RS002
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => '<none>')",  # RS004
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => NULL)",  # RS005
        f"SELECT replaysafe.complete_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => '<h1>', p_result => '{\"r\": 1}', p_provider_reference => 'ref')",
        f"SELECT replaysafe.complete_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => '<h1>', p_result => '{}')",  # superseded
        f"SELECT replaysafe.fail_action({t}, p_action_key => 'h2', p_attempt => 1, "
        "p_attempt_token => '<h2>', p_error => '{}', p_retryable => true)",
        (f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h2', p_operation => 'op', "
         "p_request => '{}', p_worker_id => 'w', p_on_expired => 'reclaim')", "h2b"),  # attempt 2
        f"SELECT replaysafe.complete_action({t}, p_action_key => 'h2', p_attempt => 1, "
        "p_attempt_token => '<h2>', p_result => '{}')",  # superseded: attempt 1 reported
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h2', p_attempt => 2, "
        "p_attempt_token => '<h2b>')",
        f"SELECT replaysafe.mark_action_unknown({t}, p_action_key => 'h3', p_attempt => 1, "
        "p_attempt_token => '<h3>', p_error => '{}')",
        f"SELECT replaysafe.fail_action({t}, p_action_key => 'h3', p_attempt => 1, "
        "p_attempt_token => '<h3>', p_error => '{}')",  # late
        f"SELECT replaysafe.fail_action({t}, p_action_key => 'nope', p_attempt => 1, "
        "p_attempt_token => '<nope>', p_error => '{}')",  # RS006
        f"SELECT replaysafe.write_thread({t}, p_thread_id => 'ht', p_expected_version => 0, "
        "p_state => '{}', p_history_limit => 1)",
        f"SELECT replaysafe.write_thread({t}, p_thread_id => 'ht', p_expected_version => 1, "
        "p_state => '{\"a\": 1}')",
        f"SELECT replaysafe.write_thread({t}, p_thread_id => 'ht', p_expected_version => 1, "
        "p_state => '{}')",  # RS003
        f"SELECT replaysafe.write_thread({t}, p_thread_id => 'mine', p_expected_version => 1, "
        "p_state => '{}')",  # RS004
        f"SELECT * FROM replaysafe.read_thread({t}, p_thread_id => 'ht')",
        f"SELECT * FROM replaysafe.read_thread({t}, p_thread_id => 'absent')",
        f"SELECT * FROM replaysafe.thread_history({t}, p_thread_id => 'ht')",
        f"SELECT replaysafe.delete_thread({t}, p_thread_id => 'ht')",
        f"SELECT * FROM replaysafe.read_thread({t}, p_thread_id => 'ht')",
        f"SELECT * FROM replaysafe.read_thread({t}, p_thread_id => '')",  # RS005
        "SELECT pg_catalog.pg_sleep(1.1)",
        "SELECT replaysafe.sweep_expired_actions()",
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h1', p_operation => 'op', "
        "p_request => '{}', p_worker_id => 'w')",
        "SELECT * FROM replaysafe.claim_action(p_tenant_id => 'someone-else', p_action_key => 'x', "
        "p_operation => 'op', p_request => '{}', p_worker_id => 'w')",  # RS004 (but the owner)
    ]
    if operator:
        calls += [
            f"SELECT replaysafe.resolve_action({t}, p_action_key => 'h3', p_state => 'succeeded', "
            "p_result => '{}', p_note => 'n', p_expected_attempt => 1)",
            f"SELECT replaysafe.resolve_action({t}, p_action_key => 'h3', p_state => 'failed')",
            f"SELECT replaysafe.reopen_action({t}, p_action_key => 'h3', p_note => 'fixed')",
            "SELECT replaysafe.purge_actions(p_older_than => '0 seconds')",
            f"SELECT replaysafe.sweep_expired_actions(p_now => '{datetime.now(UTC) + timedelta(days=1)}')",
        ]
    calls += [f"SELECT * FROM replaysafe.{v}" for v in VIEWS]
    tokens: dict[str, str] = {}
    succeeded = 0
    for entry in calls:
        query, *keys = (entry,) if isinstance(entry, str) else entry
        query = re.sub(r"<(\w+)>", lambda m: tokens.get(m.group(1), "rsat_no-attempt-has-this"), query)
        try:
            cur = c.execute(query.encode())
        except psycopg.Error:
            continue
        succeeded += 1
        for key, row in zip(keys, cur.fetchall() if keys else [], strict=True):
            if row[0] == "claimed":  # outcome, ..., attempt_token
                tokens[key] = row[-1]
    return succeeded


def test_hostile_overloads_in_public_and_pg_temp_never_run(
        world: str, make_role: MakeRole) -> None:
    with psycopg.connect(world, autocommit=True) as owner:
        names = called_names(owner)
        assert {"length", "format", "jsonb_build_object", "pg_notify", "count"} <= names
        attacker = make_role("replaysafe_worker")
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')  # the pre-15 default
    bind(world, attacker, "A")
    operator = make_role("replaysafe_operator")
    bind(world, operator, "A")
    try:
        with connect_as(world, attacker) as c:
            planted = plant_overloads(c, names)
            assert planted > 100
            # The trap works: an unpinned function of the attacker's own falls into it.
            c.execute("CREATE FUNCTION public.control() RETURNS int LANGUAGE plpgsql AS "
                      "$f$ BEGIN RETURN length('x'::text); END $f$")
            c.execute("SET search_path = public, pg_catalog")
            c.execute("SELECT public.control()")
            assert c.execute("SELECT pg_catalog.count(*) FROM public.hijacked").fetchone() == (1,)
            c.execute("DELETE FROM public.hijacked")
        succeeded = []
        for role, is_operator in ((attacker, False), (operator, True)):
            with connect_as(world, role) as victim:
                plant_temp_domains(victim)
                victim.execute("SET search_path = public, pg_catalog")
                succeeded.append(exercise_every_function(victim, "A", operator=is_operator))
        with psycopg.connect(world, autocommit=True) as owner:  # the schema owner, a superuser
            plant_temp_domains(owner)
            owner.execute("SET search_path = public, pg_catalog")
            succeeded.append(exercise_every_function(owner, "B", operator=True))
            assert owner.execute("SELECT DISTINCT name FROM public.hijacked").fetchall() == []
            # Enough ran for the test to mean something (the operator may only settle).
            assert succeeded[0] >= 20 and succeeded[1] >= 8 and succeeded[2] >= 25, succeeded
    finally:
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute("DROP TABLE IF EXISTS public.hijacked CASCADE")
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


def test_every_function_is_definer_or_private_and_pins_its_search_path(dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        rows = c.execute("""
            SELECT p.proname, p.prosecdef, p.proconfig
            FROM pg_proc p WHERE p.pronamespace = 'replaysafe'::regnamespace""").fetchall()
    assert rows
    for name, secdef, config in rows:
        assert config == ["search_path=pg_catalog, pg_temp"], name
        assert secdef == (not name.startswith("_") and name != "idempotency_key"), name


# --- finding 2: a bound auditor reads every tenant --------------------------------------------

def test_set_role_never_widens_a_bound_login(world: str, make_role: MakeRole) -> None:
    auditor = make_role("replaysafe_auditor")
    worker = make_role("replaysafe_worker")
    bind(world, auditor, "A")
    bind(world, worker, "A")
    with connect_as(world, auditor) as c:
        c.execute("SET ROLE replaysafe_auditor")  # the group itself is unbound
        for view in VIEWS:
            tenants = {r[0] for r in c.execute(f"SELECT tenant_id FROM replaysafe.{view}")}
            assert tenants <= {"A"}, view
        assert {r[0] for r in c.execute("SELECT tenant_id FROM replaysafe.actions_v")} == {"A"}
    with connect_as(world, worker) as c:
        c.execute("SET ROLE replaysafe_worker")
        assert sqlstate(c, "SELECT * FROM replaysafe.read_thread(p_tenant_id => 'B', "
                           "p_thread_id => 'mine', p_user_id => 'alice')") == "RS004"
        assert c.execute("SELECT version FROM replaysafe.read_thread(p_tenant_id => 'A', "
                         "p_thread_id => 'mine', p_user_id => 'alice')").fetchone() == (1,)
        assert c.execute("SELECT replaysafe.sweep_expired_actions()").fetchone() == (0,)


def test_per_request_set_role_from_an_unbound_login(world: str, make_role: MakeRole) -> None:
    """PostgREST style: an unbound authenticator login SETs ROLE to a bound role per request."""
    authenticator = make_role()
    tenant_role = make_role("replaysafe_worker")
    bind(world, tenant_role, "B")
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute(f'GRANT "{tenant_role}" TO "{authenticator}"')
    with connect_as(world, authenticator) as c:
        # unbound: it inherits the worker's privileges, but sees and may do nothing
        assert c.execute("SELECT * FROM replaysafe.actions_v").fetchall() == []
        c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(tenant_role)))
        assert {r[0] for r in c.execute("SELECT tenant_id FROM replaysafe.actions_v")} == {"B"}
        assert c.execute("SELECT outcome FROM replaysafe.claim_action(p_tenant_id => 'B', "
                         "p_action_key => 'done', p_operation => 'refund', p_request => '{}', "
                         "p_worker_id => 'w')").fetchone() == ("replay",)
        assert sqlstate(c, "SELECT replaysafe.claim_action(p_tenant_id => 'A', "
                           "p_action_key => 'done', p_operation => 'refund', p_request => '{}', "
                           "p_worker_id => 'w')") == "RS004"
        c.execute("RESET ROLE")
        assert c.execute("SELECT * FROM replaysafe.actions_v").fetchall() == []
        assert sqlstate(c, "SELECT replaysafe.claim_action(p_tenant_id => 'B', "
                           "p_action_key => 'done', p_operation => 'refund', p_request => '{}', "
                           "p_worker_id => 'w')") == "RS004"


def test_views_defeat_a_leaky_function_in_the_callers_where_clause(world: str,
                                                                   worker_a: Conn) -> None:
    worker_a.execute("CREATE FUNCTION pg_temp.leak(t text) RETURNS boolean LANGUAGE plpgsql "
                     "COST 0.0000001 AS $f$ BEGIN RAISE NOTICE 'saw %', t; RETURN true; END $f$")
    seen: list[str] = []
    worker_a.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
    worker_a.execute("SELECT * FROM replaysafe.actions_v WHERE pg_temp.leak(tenant_id)")
    assert seen and all(s == "saw A" for s in seen)


# --- finding 3: one worker stalls every tenant ------------------------------------------------

def test_worker_cannot_lock_a_table_or_a_view(world: str, worker_a: Conn) -> None:
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


# --- finding 4: integrity inside a tenant ------------------------------------------------------

def test_worker_holds_no_privilege_on_any_table(world: str, worker_a: Conn) -> None:
    before = owner_rows(world, "SELECT * FROM replaysafe.actions ORDER BY 1, 2")
    attempts = [
        "SELECT * FROM replaysafe.{t}",
        "UPDATE replaysafe.{t} SET {c} = {c}",
        "DELETE FROM replaysafe.{t}",
        "TRUNCATE replaysafe.{t}",
        "INSERT INTO replaysafe.{t} DEFAULT VALUES",
    ]
    for table in TABLES:
        column = owner_rows(world, "SELECT attname FROM pg_attribute WHERE attnum = 1 AND "
                                   f"attrelid = 'replaysafe.{table}'::regclass")[0][0]
        for stmt in attempts:
            assert sqlstate(worker_a, stmt.format(t=table, c=column)) == "42501", (table, stmt)
    # The forgeries of the review: an outcome without an attempt, a rewritten thread history.
    for stmt in ("UPDATE replaysafe.actions SET state = 'succeeded' WHERE action_key = 'live'",
                 "DELETE FROM replaysafe.action_attempts WHERE tenant_id = 'A'",
                 "UPDATE replaysafe.thread_versions SET state = '{}' WHERE tenant_id = 'A'",
                 "UPDATE replaysafe.threads SET user_id = 'mallory', version = 1"):
        assert sqlstate(worker_a, stmt) == "42501", stmt
    assert owner_rows(world, "SELECT * FROM replaysafe.actions ORDER BY 1, 2") == before


def test_private_helpers_and_operator_duties_are_not_a_workers(world: str, worker_a: Conn) -> None:
    with psycopg.connect(world) as owner:
        private = [r[0] for r in owner.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = 'replaysafe'::regnamespace AND p.proname LIKE '\\_%'")]
    assert "replaysafe._report(text,text,integer,text,replaysafe.action_state,jsonb,jsonb,text," \
           "timestamp with time zone,text)" in private
    for fn in private:
        assert worker_a.execute("SELECT has_function_privilege(%s, 'EXECUTE')",
                                (fn,)).fetchone() == (False,), fn
    # success with a NULL result through the private report helper (the review's forgery),
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
    assert owner_rows(world, "SELECT action_key, state::text FROM replaysafe.actions "
                             "WHERE tenant_id = 'A' ORDER BY 1") == [("done", "succeeded"),
                                                                    ("live", "running")]


def test_operator_settles_reopens_and_purges_its_tenant_only(world: str,
                                                             make_role: MakeRole) -> None:
    operator = make_role("replaysafe_operator")
    bind(world, operator, "A")
    with psycopg.connect(world, autocommit=True) as owner:
        for tenant in ("A", "B"):
            owner.execute("SELECT replaysafe.mark_action_unknown(p_tenant_id => %s, "
                          "p_action_key => 'live', p_attempt => 1, p_attempt_token => %s, "
                          "p_error => '{}')", (tenant, TOKENS[tenant, "live"]))
    with connect_as(world, operator) as c:
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
    assert owner_rows(world, "SELECT tenant_id, action_key, state::text, resolution_note "
                             "FROM replaysafe.actions ORDER BY 1, 2") == [
        ("A", "live", "retryable", "the bug is fixed"),
        ("B", "done", "succeeded", None), ("B", "live", "unknown", None)]


# --- finding 5: times out of range --------------------------------------------------------------

@pytest.mark.parametrize("args", [
    "p_lease => 'infinity'", "p_lease => '100000 years'", "p_lease => '8 days'",
    "p_lease => '1 month -23 days'",
    "p_lease => '-1 second'", "p_now => 'infinity'", "p_now => '-infinity'",
    "p_now => '4713-01-01 BC'", "p_now => NULL",
])
def test_times_out_of_range_are_refused_even_for_the_owner(dsn: str, args: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        # An infinite interval exists from Postgres 17; before, the literal itself is refused.
        old = "infinity'" in args and "p_lease" in args and c.info.server_version < 170000
        assert sqlstate(c, "SELECT replaysafe.claim_action(p_tenant_id => 't', p_action_key => 'k', "
                           f"p_operation => 'op', p_request => '{{}}', p_worker_id => 'w', {args})"
                        ) == ("22007" if old else "RS005")
        assert c.execute("SELECT count(*) FROM replaysafe.actions").fetchone() == (0,)


def test_a_worker_cannot_move_time(world: str, worker_a: Conn) -> None:
    far = datetime.now(UTC) + timedelta(hours=2)
    # The attempt's own token: the refusal is the time's.
    params = {"now": far, "token": TOKENS["A", "live"]}
    for call in (
            "replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'live', "
            "p_operation => 'refund', p_request => '{}', p_worker_id => 'w', p_now => %(now)s)",
            "replaysafe.sweep_expired_actions(p_now => %(now)s)",
            "replaysafe.heartbeat_action(p_tenant_id => 'A', p_action_key => 'live', "
            "p_attempt => 1, p_attempt_token => %(token)s, p_now => %(now)s)",
            "replaysafe.complete_action(p_tenant_id => 'A', p_action_key => 'live', "
            "p_attempt => 1, p_attempt_token => %(token)s, p_result => '{}', p_now => %(now)s)"):
        assert sqlstate(worker_a, f"SELECT {call}", params) == "RS005", call
    # The live lease is untouched; within 5 minutes of the clock is fine.
    assert owner_rows(world, "SELECT state::text FROM replaysafe.actions "
                             "WHERE tenant_id = 'A' AND action_key = 'live'") == [("running",)]
    near = datetime.now(UTC) + timedelta(minutes=1)
    assert worker_a.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)",
                            (near,)).fetchone() == (0,)


def test_a_lease_starts_at_the_call_not_at_the_transaction_start(dsn: str) -> None:
    with psycopg.connect(dsn) as c:  # a transaction, opened before the claim
        c.execute("SELECT pg_sleep(1.5)")
        row = c.execute("SELECT lease_expires_at, lease_expires_at > clock_timestamp() "
                        "FROM replaysafe.claim_action(p_tenant_id => 't', p_action_key => 'k', "
                        "p_operation => 'op', p_request => '{}', p_worker_id => 'w', "
                        "p_lease => '1 second')").fetchone()
        assert row is not None and row[1] is True  # not expired at birth
        c.commit()


# --- finding 8: ids, keys, payloads -----------------------------------------------------------

def test_ids_are_bounded_in_bytes_too(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for key in ("界" * 512, "界" * 342):  # 1,536 and 1,026 bytes
            assert sqlstate(c, "SELECT replaysafe.claim_action(p_tenant_id => 't', p_action_key => %s, "
                               "p_operation => 'op', p_request => '{}', p_worker_id => 'w')",
                            (key,)) == "RS005"
        ok = "界" * 341  # 1,023 bytes
        c.execute("SELECT replaysafe.claim_action(p_tenant_id => 't', p_action_key => %s, "
                  "p_operation => 'op', p_request => '{}', p_worker_id => 'w')", (ok,))
        assert c.execute("SELECT count(*) FROM replaysafe.actions").fetchone() == (1,)


def unsalted_key(tenant: str, key: str) -> str:
    """The 0002 derivation, computable by anyone."""
    return "rs1_" + hashlib.sha256(f"{len(tenant)}:{tenant}{key}".encode()).hexdigest()


def test_a_guessed_pair_cannot_be_confirmed_from_keys_or_payloads(world: str,
                                                                  make_role: MakeRole) -> None:
    # Any connected role can LISTEN; the payload must not be computable from a guess.
    stranger = make_role()
    with connect_as(world, stranger) as listener:
        listener.execute("LISTEN replaysafe_actions")
        with psycopg.connect(world, autocommit=True) as owner:
            claimed = owner.execute("SELECT idempotency_key, attempt_token FROM replaysafe.claim_action("
                                    "p_tenant_id => 'A', p_action_key => 'guess', p_operation => 'op', "
                                    "p_request => '{}', p_worker_id => 'w')").fetchone()
            assert claimed is not None
            first = (claimed[0],)
            owner.execute("SELECT replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'guess', "
                          "p_operation => 'op', p_request => '{}', p_worker_id => 'w2')")  # waits
            owner.execute("SELECT replaysafe.complete_action(p_tenant_id => 'A', "
                          "p_action_key => 'guess', p_attempt => 1, p_attempt_token => %s, "
                          "p_result => '{}')", (claimed[1],))
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == [first[0]]
    assert payloads[0] != unsalted_key("A", "guess")
    assert first[0].startswith("rs2_") and len(first[0]) == 68
    with psycopg.connect(world) as owner:  # the owner's function derives the same key
        assert owner.execute("SELECT replaysafe.idempotency_key('A', 'guess')").fetchone() == first


# --- found by the attacker's review of revision 0003 -------------------------------------------

SRO_BAIT = """
CREATE TABLE public.loot (what text, got text);
GRANT INSERT ON public.loot TO PUBLIC;
CREATE FUNCTION public.steal() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.loot SELECT 'read', pg_catalog.string_agg(DISTINCT tenant_id, ',')
                            FROM replaysafe.actions_v;
    BEGIN
        INSERT INTO public.loot SELECT 'complete', replaysafe.complete_action(
            p_tenant_id => 'B', p_action_key => 'live', p_attempt => 1,
            p_attempt_token => 'B_LIVE_TOKEN', p_result => '{"forged": 1}');
    EXCEPTION WHEN OTHERS THEN
        INSERT INTO public.loot VALUES ('complete', 'refused ' || SQLSTATE);
    END;
    RETURN 1;
END $f$;
CREATE FUNCTION public.idx_f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
    $f$ BEGIN IF $1 = 0 THEN PERFORM public.steal(); END IF; RETURN $1; END $f$;
CREATE TABLE public.bait (i int);
INSERT INTO public.bait VALUES (1), (0);
"""


def sro_bait() -> str:
    """SRO_BAIT holding B's real attempt token (as if the attacker had it): what refuses the
    forged report must be the tenant check, not the token."""
    return SRO_BAIT.replace("B_LIVE_TOKEN", TOKENS["B", "live"])


def test_a_workers_index_expression_run_by_a_superuser_acts_as_the_worker(
        world: str, make_role: MakeRole) -> None:
    """Autovacuum (or a superuser's ANALYZE / REINDEX) runs a table owner's index expression
    in the superuser's session: the functions must not act with that session's rights."""
    attacker = make_role("replaysafe_worker")
    bind(world, attacker, "A")
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    try:
        with connect_as(world, attacker) as c:
            c.execute(sro_bait())
            c.execute("CREATE INDEX bait_idx ON public.bait (public.idx_f(i))")  # its own run
        with psycopg.connect(world, autocommit=True) as owner:  # the superuser's maintenance
            owner.execute("DELETE FROM public.loot")
            owner.execute("ANALYZE public.bait")
            owner.execute("REINDEX TABLE public.bait")
            loot = owner.execute("SELECT what, got FROM public.loot ORDER BY 1, 2").fetchall()
        assert ("read", "A") in loot and ("complete", "refused RS004") in loot, loot
        assert {got for what, got in loot if what == "read"} == {"A"}
        assert {got for what, got in loot if what == "complete"} == {"refused RS004"}
        assert owner_rows(world, "SELECT state::text, result FROM replaysafe.actions "
                                 "WHERE tenant_id = 'B' AND action_key = 'live'") == [("running", None)]
    finally:
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


def test_a_workers_future_time_cannot_take_a_live_lease(world: str, worker_a: Conn) -> None:
    honest = worker_a.execute(
        "SELECT outcome, attempt, attempt_token FROM replaysafe.claim_action(p_tenant_id => 'A', "
        "p_action_key => 'pay', p_operation => 'pay', p_request => '{}', p_worker_id => 'honest', "
        "p_on_expired => 'reclaim')").fetchone()
    assert honest is not None and honest[:2] == ("claimed", 1)
    soon = datetime.now(UTC) + timedelta(minutes=4, seconds=59)  # inside the 5-minute window
    hostile = worker_a.execute(
        "SELECT outcome, attempt FROM replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'pay', "
        "p_operation => 'pay', p_request => '{}', p_worker_id => 'hostile', "
        "p_on_expired => 'reclaim', p_now => %s)", (soon,)).fetchone()
    assert hostile == ("running", 1)
    assert worker_a.execute("SELECT replaysafe.sweep_expired_actions(p_now => %s)",
                            (soon,)).fetchone() == (0,)
    # the honest worker still holds it
    worker_a.execute("SELECT replaysafe.heartbeat_action(p_tenant_id => 'A', p_action_key => 'pay', "
                     "p_attempt => 1, p_attempt_token => %s)", (honest[2],))


def test_default_privileges_open_nothing(empty_dsn: str, make_role: MakeRole) -> None:
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


def test_binding_is_the_owners_even_with_execute_granted_by_mistake(world: str,
                                                                   worker_a: Conn) -> None:
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute("GRANT EXECUTE ON FUNCTION replaysafe.bind_role_to_tenant(text, text), "
                      "replaysafe.unbind_role(text) TO replaysafe_worker")
    assert sqlstate(worker_a, "SELECT replaysafe.bind_role_to_tenant(p_role => current_user, "
                              "p_tenant_id => 'B')") == "RS004"
    assert sqlstate(worker_a, "SELECT replaysafe.unbind_role(p_role => current_user)") == "RS004"


def test_the_cli_and_the_driver_never_resolve_through_a_hostile_search_path(
        world: str, make_role: MakeRole) -> None:
    from helpers.cli import run

    from replaysafe_pg import Ledger, Threads

    attacker = make_role("replaysafe_worker")
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
        owner.execute(f'GRANT USAGE ON TYPE replaysafe.action_state TO "{attacker}"')
    text = "\n".join((ROOT / "sql" / f).read_text() for f in ("cli.sql", "queries.sql"))
    names = {m.group(1).lower() for m in re.finditer(r"([a-z_][a-z0-9_]*)\s*\(", text, re.IGNORECASE)}
    try:
        assert {"cardinality", "unnest", "count", "now"} <= names
        with connect_as(world, attacker) as c:
            plant_overloads(c, names)
            c.execute("CREATE FUNCTION public.state_eq(a replaysafe.action_state, "
                      "b replaysafe.action_state) RETURNS boolean LANGUAGE plpgsql AS $f$ BEGIN "
                      "INSERT INTO public.hijacked VALUES ('enum =', current_user); RETURN true; "
                      "END $f$")
            c.execute("CREATE OPERATOR public.= (LEFTARG = replaysafe.action_state, "
                      "RIGHTARG = replaysafe.action_state, FUNCTION = public.state_eq)")
        # The owner's own session would fall into the trap (its search_path puts public first).
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute("SELECT count(*) FROM pg_catalog.unnest(ARRAY['a']) WHERE "
                          "public.cardinality(ARRAY['x']) IS NULL")
            assert owner.execute("SELECT pg_catalog.count(*) FROM public.hijacked").fetchone() == (1,)
            owner.execute("DELETE FROM public.hijacked")
        for args in (("doctor",), ("actions", "list", "--state", "running"), ("audit",),
                     ("actions", "show", "done", "--tenant", "A"),
                     ("threads", "show", "mine", "--tenant", "A", "--user", "alice"),
                     ("purge", "--older-than", "1000d"), ("sweep",)):
            run(*args, dsn=world)
        with Ledger(world, tenant_id="A") as led, Threads(world, tenant_id="A", user_id="alice") as th:
            claim = led.claim("k", "op", {})
            led.heartbeat(claim)
            led.complete(claim, {})
            assert led.get("done") is not None and led.attempts("done")
            th.read("mine")
        with psycopg.connect(world, autocommit=True) as owner:
            assert owner.execute("SELECT name FROM public.hijacked").fetchall() == []
    finally:
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute("DROP TABLE IF EXISTS public.hijacked CASCADE")
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


def test_a_binding_follows_the_role_not_its_name(world: str, admin_dsn: str,
                                                  make_role: MakeRole) -> None:
    renamed, recreated = make_role("replaysafe_auditor"), make_role("replaysafe_worker")
    bind(world, renamed, "A")
    bind(world, recreated, "B")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'ALTER ROLE "{renamed}" RENAME TO "{renamed}_x"')
        admin.execute(f'ALTER ROLE "{renamed}_x" RENAME TO "{renamed}"')  # the fixture drops it
        admin.execute(f'ALTER ROLE "{renamed}" RENAME TO "{renamed}_y"')
    try:
        with connect_as(world, f"{renamed}_y") as c:  # renamed: still bound, not every tenant
            assert {r[0] for r in c.execute("SELECT tenant_id FROM replaysafe.actions_v")} == {"A"}
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER ROLE "{renamed}_y" RENAME TO "{renamed}"')
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP OWNED BY "{recreated}"')
        admin.execute(f'DROP ROLE "{recreated}"')
        admin.execute(f'CREATE ROLE "{recreated}" LOGIN IN ROLE replaysafe_worker')
    with connect_as(world, recreated) as c:  # same name, new role: no tenant
        assert sqlstate(c, "SELECT * FROM replaysafe.read_thread(p_tenant_id => 'B', "
                           "p_thread_id => 'mine', p_user_id => 'alice')") == "RS004"
    with psycopg.connect(world, autocommit=True) as owner:  # the orphan can be unbound by name
        assert owner.execute("SELECT replaysafe.unbind_role(p_role => %s)",
                             (recreated,)).fetchone() == (True,)


# --- found by the second review ------------------------------------------------------------------

def test_a_workers_index_expression_run_in_another_tenants_session_acts_for_nobody(
        world: str, make_role: MakeRole) -> None:
    """Tenant B's operator runs a database-wide ANALYZE; A's index expression runs in B's
    session (a security-restricted operation): it must not act for B."""
    require_maintain_privilege(world)
    attacker = make_role("replaysafe_worker")
    victim = make_role("replaysafe_operator")
    bind(world, attacker, "A")
    bind(world, victim, "B")
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    try:
        with connect_as(world, attacker) as c:
            c.execute(sro_bait())
            c.execute("CREATE INDEX bait_idx ON public.bait (public.idx_f(i))")
            c.execute("GRANT MAINTAIN ON public.bait TO PUBLIC")
        with connect_as(world, victim) as c:
            c.execute("ANALYZE public.bait")
        with psycopg.connect(world, autocommit=True) as owner:
            loot = owner.execute("SELECT what, got FROM public.loot").fetchall()
        assert ("complete", "refused RS004") in loot and ("complete", "recorded") not in loot, loot
        assert {got for what, got in loot if what == "read"} <= {"A"}
        assert owner_rows(world, "SELECT state::text, result FROM replaysafe.actions "
                                 "WHERE tenant_id = 'B' AND action_key = 'live'") == [("running", None)]
    finally:
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


def test_explain_analyze_cannot_confirm_another_tenants_key(world: str, worker_a: Conn) -> None:
    for view, column, key in (("actions_v", "action_key", "done"),
                              ("action_attempts_v", "action_key", "done"),
                              ("threads_v", "thread_id", "mine")):
        there = plan_counts(worker_a, f"SELECT * FROM replaysafe.{view} "
                                      f"WHERE tenant_id = 'B' AND {column} = '{key}'")
        absent = plan_counts(worker_a, f"SELECT * FROM replaysafe.{view} "
                                       f"WHERE tenant_id = 'B' AND {column} = 'no-such-{key}'")
        ranged = plan_counts(worker_a, f"SELECT * FROM replaysafe.{view} "
                                       f"WHERE {column} >= 'a' AND {column} < 'z'")
        assert there == absent, (view, there, absent)
        # A range over every tenant finds only A's rows, and reads no other.
        assert ranged and all(n == 0 for k, n in ranged if "Rows Removed" in k), (view, ranged)


def test_default_privileges_on_schemas_open_nothing(empty_dsn: str, make_role: MakeRole) -> None:
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


def test_group_roles_cannot_be_bound(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for role in ("replaysafe_worker", "replaysafe_operator", "replaysafe_auditor"):
            assert sqlstate(c, "SELECT replaysafe.bind_role_to_tenant(p_role => %s, "
                               "p_tenant_id => 'B')", (role,)) == "RS005"
        assert c.execute("SELECT count(*) FROM replaysafe.role_bindings").fetchone() == (0,)


def test_operator_duties_check_the_role_themselves(world: str, worker_a: Conn) -> None:
    with psycopg.connect(world, autocommit=True) as owner:  # a grant by mistake
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
    assert owner_rows(world, "SELECT action_key, state::text FROM replaysafe.actions "
                             "WHERE tenant_id = 'A' ORDER BY 1") == [("done", "succeeded"),
                                                                    ("live", "unknown")]


# --- found by the fourth review ------------------------------------------------------------------

VIEW_BAIT = """
CREATE TABLE {schema}.loot (reader text, tenant_id text, action_key text);
CREATE FUNCTION {schema}.grab() RETURNS void LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
    INSERT INTO {schema}.loot SELECT current_user, tenant_id, action_key FROM replaysafe.actions_v;
END $f$;
CREATE FUNCTION {schema}.f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
    $f$ BEGIN PERFORM {schema}.grab(); RETURN $1; END $f$;
CREATE TABLE {schema}.bait (i int);
INSERT INTO {schema}.bait VALUES (1);
"""


@pytest.mark.parametrize("group", ["replaysafe_worker", "replaysafe_auditor"])
def test_code_a_group_role_owns_reads_no_tenant_in_someone_elses_session(
        world: str, make_role: MakeRole, group: str) -> None:
    """A's login (a member of `group`) builds an index expression as the unbound group role;
    B's bound session (or a superuser's) runs it with ANALYZE: through the views it must see
    neither B's tenant (the session's) nor every tenant (the group's)."""
    require_maintain_privilege(world)
    attacker = make_role("replaysafe_worker", "replaysafe_auditor")
    victim = make_role("replaysafe_operator")
    bind(world, attacker, "A")
    bind(world, victim, "B")
    schema = f"s_{attacker}"
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute(f'CREATE SCHEMA "{schema}" AUTHORIZATION "{attacker}"')
    try:
        with connect_as(world, attacker) as c:
            c.execute(f'GRANT CREATE, USAGE ON SCHEMA "{schema}" TO {group}')
            c.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO PUBLIC')
            c.execute(f"SET ROLE {group}")  # from here on, objects belong to the group role
            c.execute(VIEW_BAIT.format(schema=f'"{schema}"'))
            c.execute(f'CREATE INDEX ON "{schema}".bait (("{schema}".f(i)))')
            c.execute(f'GRANT MAINTAIN ON "{schema}".bait TO PUBLIC')
            c.execute(f'GRANT INSERT ON "{schema}".loot TO PUBLIC')
            c.execute(f'TRUNCATE "{schema}".loot')
        with connect_as(world, victim) as c:
            c.execute(f'ANALYZE "{schema}".bait')
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute(f'ANALYZE "{schema}".bait')
            loot = owner.execute(f'SELECT reader, tenant_id FROM "{schema}".loot').fetchall()
        assert loot == [], loot
    finally:
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')
            owner.execute(f"REVOKE ALL ON SCHEMA public FROM {group}")


def test_set_role_to_a_group_role_still_reads_the_logins_tenant(world: str,
                                                                make_role: MakeRole) -> None:
    login = make_role("replaysafe_worker", "replaysafe_auditor")
    bind(world, login, "A")
    with connect_as(world, login) as c:
        for group in ("replaysafe_worker", "replaysafe_auditor"):
            c.execute(f"SET ROLE {group}")
            assert {r[0] for r in c.execute("SELECT tenant_id FROM replaysafe.actions_v")} == {"A"}
            c.execute("RESET ROLE")
