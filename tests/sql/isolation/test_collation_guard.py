"""A COLLATE clause on any argument is refused before anything is read: PL/pgSQL gives every
collatable argument the collation of the call, and it wins over the columns' in every
comparison inside the function. A worker's own nondeterministic collation (a case-insensitive
ICU one created in pg_temp) made its tenant id equal another's: it completed another
tenant's attempt with a forged result and read its threads.

The guard is tested with the built-in collations everywhere; the real attack needs a server
built with ICU (nondeterministic collations): the embedded Postgres of the test session has
none, so test_a_callers_collation_cannot_widen_the_tenant runs against the session's server
when it has ICU, else against ``REPLAYSAFE_ICU_TEST_DSN`` (a superuser DSN of a server with
ICU, e.g. a distribution's Postgres), else it is skipped. The LangGraph functions' guard:
tests/langgraph/test_saver_isolation.py."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.claim_tokens import TOK1, claim
from helpers.db import bind, connect_as, owner_rows, sqlstate
from psycopg import conninfo as pg_conninfo

import replaysafe_pg

# The test's database holds no action: any well-formed token will do (no attempt has it).
TOKEN = "'rsat_0123456789abcdef0123456789abcdef'"


CALLS = {
    "claim_action": "SELECT replaysafe.claim_action(p_tenant_id => %(t)s, p_action_key => 'k', "
                    "p_operation => 'pay', p_request => '{}', p_worker_id => 'w')",
    "claim_action (key)": "SELECT replaysafe.claim_action(p_tenant_id => 'A', p_action_key => %(t)s, "
                          "p_operation => 'pay', p_request => '{}', p_worker_id => 'w')",
    "claim_actions": "SELECT replaysafe.claim_actions(p_tenant_id => %(t)s, p_action_keys => '{k}', "
                     "p_operations => '{pay}', p_requests => ARRAY['{}'::jsonb], p_worker_id => 'w')",
    "heartbeat_action": "SELECT replaysafe.heartbeat_action(p_tenant_id => %(t)s, p_action_key => 'k', "
                        f"p_attempt => 1, p_attempt_token => {TOKEN})",
    "complete_action": "SELECT replaysafe.complete_action(p_tenant_id => %(t)s, p_action_key => 'k', "
                       f"p_attempt => 1, p_attempt_token => {TOKEN}, p_result => '{{}}')",
    "fail_action": "SELECT replaysafe.fail_action(p_tenant_id => %(t)s, p_action_key => 'k', "
                   f"p_attempt => 1, p_attempt_token => {TOKEN}, p_error => '{{}}')",
    "mark_action_unknown": "SELECT replaysafe.mark_action_unknown(p_tenant_id => %(t)s, "
                           f"p_action_key => 'k', p_attempt => 1, p_attempt_token => {TOKEN}, "
                           "p_error => '{}')",
    "read_thread": "SELECT * FROM replaysafe.read_thread(p_tenant_id => %(t)s, p_thread_id => 't')",
    "write_thread": "SELECT replaysafe.write_thread(p_tenant_id => %(t)s, p_thread_id => 't', "
                    "p_expected_version => 0, p_state => '{}')",
    "thread_history": "SELECT * FROM replaysafe.thread_history(p_tenant_id => %(t)s, p_thread_id => 't')",
    "delete_thread": "SELECT replaysafe.delete_thread(p_tenant_id => %(t)s, p_thread_id => 't')",
}


@pytest.mark.parametrize("collation", ['"C"', '"POSIX"'])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_collate_clause_on_any_argument_is_refused(
        dsn: str, make_role: Callable[..., str], call: str, collation: str) -> None:
    """The caller's collation never reaches inside the definer functions: with the built-in
    collations."""
    role = make_role("replaysafe_worker")
    bind(dsn, role, "A")
    sql = CALLS[call].replace("%(t)s", f"'A' COLLATE {collation}")
    with connect_as(dsn, role) as worker:
        with pytest.raises(psycopg.Error) as caught:
            worker.execute(sql)
        assert caught.value.sqlstate == "RS005", (call, caught.value)
        assert "COLLATE" in str(caught.value)
        worker.rollback()
    with psycopg.connect(dsn) as owner:
        assert owner.execute("SELECT (SELECT count(*) FROM replaysafe.actions) "
                             "+ (SELECT count(*) FROM replaysafe.threads)").fetchone() == (0,)
    with connect_as(dsn, role) as worker:  # without the clause, no RS005
        try:
            worker.execute(CALLS[call].replace("%(t)s", "'A'"))
        except psycopg.Error as e:
            assert e.sqlstate != "RS005", e


def test_operator_duties_refuse_a_collate_clause(dsn: str, make_role: Callable[..., str]) -> None:
    """The caller's collation never reaches inside the definer functions: with the built-in
    collations."""
    role = make_role("replaysafe_operator")
    bind(dsn, role, "A")
    with connect_as(dsn, role) as operator:
        for sql in ("SELECT replaysafe.resolve_action(p_tenant_id => 'A' COLLATE \"C\", "
                    "p_action_key => 'k', p_state => 'failed')",
                    "SELECT replaysafe.reopen_action(p_tenant_id => 'A', p_action_key => 'k' COLLATE \"C\", "
                    "p_note => 'n')"):
            with pytest.raises(psycopg.Error) as caught:
                operator.execute(sql)
            assert caught.value.sqlstate == "RS005", caught.value
            operator.rollback()


Conn = psycopg.Connection[Any]


def test_a_collate_clause_on_the_token_is_refused(worker_a: Conn) -> None:
    """A caller's own collation would decide which tokens are equal (as for every argument).

    The caller's collation never reaches inside the definer functions: with the built-in
    collations."""
    assert claim(worker_a, "k", TOK1)[0] == "claimed"
    assert sqlstate(worker_a, "SELECT replaysafe.claim_action(p_tenant_id => 'A', "
                    "p_action_key => 'k', p_operation => 'refund', p_request => '{}', "
                    "p_worker_id => 'w1', p_claim_token => %s COLLATE \"C\")",
                    (TOK1.upper(),)) == "RS005"


CLAIM_WITH_TOKEN = ("SELECT outcome, attempt, attempt_token FROM replaysafe.claim_action("
                    "p_tenant_id => %(tenant)s, "
                    "p_action_key => %(key)s, p_operation => 'refund', p_request => '{}', "
                    "p_worker_id => %(worker)s, p_lease => %(lease)s::interval, "
                    "p_claim_token => %(token)s::text)")


def claim_with_token(c: Conn, key: str, token: str | None, *, tenant: str = "A", worker: str = "w",
                     lease: str = "1 hour") -> tuple[Any, ...]:
    row = c.execute(CLAIM_WITH_TOKEN.encode(), {"tenant": tenant, "key": key, "worker": worker,
                                                "lease": lease, "token": token}).fetchone()
    assert row is not None
    return tuple(row)


ICU_PROBE = ("CREATE COLLATION pg_temp.rs_probe (provider = icu, locale = 'und-u-ks-level2', "
             "deterministic = false)")


def _has_icu(admin: str) -> bool:
    try:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(ICU_PROBE)
    except psycopg.Error:
        return False
    return True


@pytest.fixture
def icu_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh migrated database on a server with ICU (see the module's docstring)."""
    admin = admin_dsn if _has_icu(admin_dsn) else os.environ.get("REPLAYSAFE_ICU_TEST_DSN", "")
    if not admin or not _has_icu(admin):
        pytest.skip("needs a Postgres built with ICU: set REPLAYSAFE_ICU_TEST_DSN")
    name = f"rs_icu_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    dsn = pg_conninfo.make_conninfo(admin, dbname=name)
    try:
        replaysafe_pg.migrate(dsn)
        yield dsn
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def icu_roles(icu_dsn: str) -> Iterator[tuple[str, str]]:
    """Roles on the ICU server (which may not be the session's: make_role cannot serve)."""
    names = [f"rs_role_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with psycopg.connect(icu_dsn, autocommit=True) as c:
        for n in names:
            c.execute(f'CREATE ROLE "{n}" LOGIN IN ROLE replaysafe_worker')
    try:
        yield names[0], names[1]
    finally:
        with psycopg.connect(icu_dsn, autocommit=True) as c:
            for n in names:
                c.execute(f'DROP OWNED BY "{n}"')
        # The database is dropped by icu_dsn; the roles are cluster-wide.
        admin = pg_conninfo.make_conninfo(icu_dsn, dbname="postgres")
        with psycopg.connect(admin, autocommit=True) as c:
            for n in names:
                c.execute(f'DROP ROLE IF EXISTS "{n}"')


# How the attacker makes its collation, and how it names it in a call.
COLLATIONS = {
    # No CREATE anywhere: TEMP is enough.
    "case-insensitive in pg_temp": (
        ["CREATE COLLATION pg_temp.ci (provider = icu, locale = 'und-u-ks-level2', "
         "deterministic = false)"], "pg_temp.ci"),
    # A collation that also ignores punctuation, named "default" in a
    # schema of the attacker's: pg_collation_for() gives _."default", which that collation
    # itself found equal to '"default"' — the guard passed, and 'acme' equalled 'ACME'.
    "named _.\"default\", ignoring punctuation": (
        ['CREATE SCHEMA "_"', 'CREATE COLLATION "_"."default" (provider = icu, '
         "locale = 'und-u-ka-shifted-ks-level2', deterministic = false)"], '"_"."default"'),
}


@pytest.mark.parametrize("how", sorted(COLLATIONS))
def test_a_callers_collation_cannot_widen_the_tenant(icu_dsn: str, icu_roles: tuple[str, str],
                                                     how: str) -> None:
    """PL/pgSQL gives every collatable parameter the collation of the call's arguments, and a
    non-default implicit collation wins over the columns' default in every comparison inside
    the function. A worker of tenant 'acme' makes a nondeterministic collation and passes its
    tenant id with it: `_acts_for` ('acme' = 'ACME'), the row lookups and the UPDATEs then
    matched tenant 'ACME' too.

    The caller's
    collation reaches inside the definer functions."""
    setup, collation = COLLATIONS[how]
    attacker, victim = icu_roles
    with psycopg.connect(icu_dsn, autocommit=True) as owner:
        owner.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => 'acme')",
                      (attacker,))
        owner.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => 'ACME')",
                      (victim,))
    with connect_as(icu_dsn, victim) as v:  # tenant ACME's honest work
        honest = claim_with_token(v, "refund-1", "claim-token-of-the-victim", tenant="ACME")
        assert honest[0] == "claimed"
        v.execute("SELECT replaysafe.write_thread(p_tenant_id => 'ACME', p_thread_id => 't1', "
                  "p_expected_version => 0, p_state => '{\"card\": \"4111\"}', p_user_id => 'bob')")
    with psycopg.connect(icu_dsn, autocommit=True) as owner:
        # The second way needs a schema of its own (CREATE on the database).
        owner.execute(f'GRANT CREATE ON DATABASE "{owner.info.dbname}" TO "{attacker}"')
    with connect_as(icu_dsn, attacker) as a:
        for statement in setup:
            a.execute(statement)  # type: ignore[arg-type]
        # Its own tenant id, with its own collation: it completes ACME's running attempt
        # (with that attempt's token, as if it had it: the refusal must be the tenant's).
        forged = sqlstate(a, f"SELECT replaysafe.complete_action(p_tenant_id => 'acme' COLLATE "
                             f"{collation}, p_action_key => 'refund-1', p_attempt => 1, "
                             "p_attempt_token => %s, p_result => '{\"forged\": true}')",
                          (honest[2],))
        # ... reads ACME's thread state ...
        try:
            stolen = a.execute(f"SELECT state FROM replaysafe.read_thread(p_tenant_id => 'ACME' "
                               f"COLLATE {collation}, p_thread_id => 't1', p_user_id => 'bob')"
                               ).fetchall()  # type: ignore[arg-type]
        except psycopg.Error:
            stolen = []
        # ... and plants an action in ACME.
        planted = sqlstate(a, f"SELECT replaysafe.claim_action(p_tenant_id => 'ACME' COLLATE "
                              f"{collation}, p_action_key => 'planted', p_operation => 'refund', "
                              "p_request => '{}', p_worker_id => 'w')")
    rows = owner_rows(icu_dsn, "SELECT action_key, state::text, result FROM replaysafe.actions "
                               "WHERE tenant_id = 'ACME' ORDER BY 1")
    assert rows == [("refund-1", "running", None)], (forged, planted, rows)
    assert stolen in ([], [(None,)]), stolen
