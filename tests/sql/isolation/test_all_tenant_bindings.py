"""SPEC §4, "reading or acting for every tenant is never implicit": a role acts for every tenant
only when the schema owner named it (bind_role_to_all_tenants), in this database and no
other, never through a group or a role it may SET; a tenant binding wins over an all-tenant
one; acting_for() tells a caller what it acts for. Real LOGIN roles on real connections.
The all-tenant sweep and purge: test_shared_sweep_and_purge.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind, bind_to_all_tenants, owner_rows, sqlstate
from helpers.grants import table_state
from helpers.seeded_tenants import VIEWS
from helpers.shared_batches import (
    CLAIM,
    PURGE,
    SWEEP,
    claim,
    complete,
    expired_leases,
    finished_actions,
    one,
    state_of,
    states,
)
from psycopg import sql

import replaysafe_pg

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


Login = Callable[..., Conn]


# --- writing as the schema owner (who may pass any p_now) ----------------------------------


def seed_views(dsn: str, *tenants: str) -> None:
    """Per tenant, a row for every audit view: a succeeded action ('done'), an unknown one
    ('lost'), one with two successful attempts ('twice': the first one's report superseded)
    and a thread ('th')."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for t in tenants:
            attempt, token = claim(c, t, "done")
            assert complete(c, t, "done", attempt, token) == "recorded"
            attempt, token = claim(c, t, "lost")
            c.execute("SELECT replaysafe.mark_action_unknown(p_tenant_id => %s, "
                      "p_action_key => 'lost', p_attempt => %s, p_attempt_token => %s, "
                      "p_error => '{}')", (t, attempt, token))
            first, first_token = claim(c, t, "twice", lease="1 second", ago="1 hour",
                                       on_expired="reclaim")
            second, second_token = claim(c, t, "twice", on_expired="reclaim")
            assert (first, second) == (1, 2)
            assert complete(c, t, "twice", second, second_token) == "recorded"
            assert complete(c, t, "twice", first, first_token) == "superseded"
            c.execute("SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => 'th', "
                      "p_expected_version => 0, p_state => '{}')", (t,))


def seen(c: Conn) -> dict[str, set[str]]:
    """The tenants whose rows each audit view shows on ``c``."""
    return {v: {r[0] for r in c.execute(sql.SQL("SELECT DISTINCT tenant_id FROM replaysafe.{}")
                                        .format(sql.Identifier(v))).fetchall()}
            for v in VIEWS}


def everywhere(*tenants: str) -> dict[str, set[str]]:
    return {v: set(tenants) for v in VIEWS}


def all_tenant_roles(dsn: str) -> list[str]:
    return [r[0] for r in owner_rows(dsn, "SELECT role_name FROM replaysafe.all_tenant_roles "
                                          "ORDER BY 1")]


def schema_owner(dsn: str) -> str:
    return str(owner_rows(dsn, "SELECT nspowner::regrole::text FROM pg_catalog.pg_namespace "
                               "WHERE nspname = 'replaysafe'")[0][0])


RESOLVE = ("SELECT replaysafe.resolve_action(p_tenant_id => %s, p_action_key => %s, "
           "p_state => 'succeeded', p_result => '{}')")


BIND_ALL = "SELECT replaysafe.bind_role_to_all_tenants(p_role => %s)"


# --- bind_role_to_all_tenants, unbind_role, bind_role_to_tenant --------------------------

def test_only_the_schema_owner_binds_a_role_to_all_tenants(dsn: str, make_role: MakeRole,
                                                          login_as: Login,
                                                          admin_dsn: str) -> None:
    target = make_role("replaysafe_auditor")
    operator = make_role("replaysafe_operator")
    bind_to_all_tenants(dsn, operator)  # even a role that acts for every tenant
    # EXECUTE is the owner's alone.
    assert sqlstate(login_as(operator), BIND_ALL, (target,)) == "42501"
    # A privilege granted by mistake opens nothing, nor does superuser power without
    # membership in the schema owner.
    mistake = sql.SQL("{} EXECUTE ON FUNCTION replaysafe.bind_role_to_all_tenants(text) {} {}")
    superuser = make_role()
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER ROLE {} SUPERUSER").format(sql.Identifier(superuser)))
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute(mistake.format(sql.SQL("GRANT"), sql.SQL("TO"), sql.Identifier(operator)))
        try:
            for caller in (operator, superuser):
                assert sqlstate(login_as(caller), BIND_ALL, (target,)) == "RS004", caller
        finally:  # the role is dropped after the test: nothing of it may stay behind
            owner.execute(mistake.format(sql.SQL("REVOKE"), sql.SQL("FROM"),
                                         sql.Identifier(operator)))
    assert all_tenant_roles(dsn) == [operator]
    # The owner's own call is what works.
    bind_to_all_tenants(dsn, target)
    assert all_tenant_roles(dsn) == sorted([operator, target])


def test_bind_role_to_all_tenants_refuses_group_roles_issuers_and_the_owner(
        dsn: str, make_role: MakeRole, admin_dsn: str) -> None:
    issuer = make_role("replaysafe_issuer", "replaysafe_auditor")
    nested_issuer = make_role(make_role("replaysafe_issuer"), "replaysafe_auditor")
    owner = schema_owner(dsn)
    owner_member = make_role("replaysafe_auditor")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner),
                                                       sql.Identifier(owner_member)))
    refused = ["replaysafe_worker", "replaysafe_operator", "replaysafe_auditor",
               "replaysafe_issuer", issuer, nested_issuer, owner, owner_member, None,
               "rs_no_such_role"]
    with psycopg.connect(dsn, autocommit=True) as c:
        for role in refused:
            assert sqlstate(c, BIND_ALL, (role,)) == "RS005", role
        assert all_tenant_roles(dsn) == []
        # The same call for a plain member of a group role is accepted.
        plain = make_role("replaysafe_auditor")
        assert sqlstate(c, BIND_ALL, (plain,)) is None
    assert all_tenant_roles(dsn) == [plain]


def test_unbind_role_removes_an_all_tenant_binding(dsn: str, make_role: MakeRole,
                                                   login_as: Login) -> None:
    seed_views(dsn, "A", "B")
    auditor = make_role("replaysafe_auditor")
    bind_to_all_tenants(dsn, auditor)
    c = login_as(auditor)
    assert seen(c) == everywhere("A", "B")
    with psycopg.connect(dsn, autocommit=True) as owner:
        assert one(owner, "SELECT replaysafe.unbind_role(p_role => %s)", (auditor,)) is True
        assert all_tenant_roles(dsn) == []
        assert seen(c) == everywhere()
        assert one(owner, "SELECT replaysafe.unbind_role(p_role => %s)", (auditor,)) is False


def test_a_tenant_binding_and_an_all_tenant_binding_replace_each_other(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    seed_views(dsn, "A", "B")
    auditor = make_role("replaysafe_auditor")
    c = login_as(auditor)
    bind_to_all_tenants(dsn, auditor)
    assert seen(c) == everywhere("A", "B")
    bind(dsn, auditor, "A")  # moves it to one tenant: the all-tenant binding goes
    assert all_tenant_roles(dsn) == []
    assert seen(c) == everywhere("A")
    bind_to_all_tenants(dsn, auditor)  # and back: the tenant binding goes
    assert owner_rows(dsn, "SELECT tenant_id FROM replaysafe.role_bindings WHERE role_name = %s",
                      (auditor,)) == []
    assert seen(c) == everywhere("A", "B")


def test_an_all_tenant_binding_belongs_to_the_role_not_its_name(
        dsn: str, make_role: MakeRole, login_as: Login, admin_dsn: str) -> None:
    seed_views(dsn, "A", "B")
    auditor = make_role("replaysafe_auditor")
    bind_to_all_tenants(dsn, auditor)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        name = sql.Identifier(auditor)
        admin.execute(sql.SQL("DROP ROLE {}").format(name))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE replaysafe_auditor").format(name))
    assert seen(login_as(auditor)) == everywhere()  # a new role of the same name: nothing
    with psycopg.connect(dsn, autocommit=True) as owner:  # the binding left behind goes
        assert one(owner, "SELECT replaysafe.unbind_role(p_role => %s)", (auditor,)) is True
    assert all_tenant_roles(dsn) == []


# --- no implicit all-tenant reading or acting --------------------------------------------

def test_an_unbound_auditor_reads_nothing_until_bound_to_all_tenants(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    seed_views(dsn, "A", "B")
    with psycopg.connect(dsn, autocommit=True) as owner:
        assert seen(owner) == everywhere("A", "B")  # every view has rows of both
    auditor = make_role("replaysafe_auditor")
    c = login_as(auditor)
    assert seen(c) == everywhere()
    bind_to_all_tenants(dsn, auditor)
    assert seen(c) == everywhere("A", "B")


def test_an_unbound_operator_acts_for_no_tenant_until_bound_to_all_tenants(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        for t in ("A", "B"):
            attempt, token = claim(owner, t, "lost")
            owner.execute("SELECT replaysafe.mark_action_unknown(p_tenant_id => %s, "
                          "p_action_key => 'lost', p_attempt => %s, p_attempt_token => %s, "
                          "p_error => '{}')", (t, attempt, token))
            expired_leases(owner, t, 1, ago="1 hour")
            finished_actions(owner, t, 1, ago="1 hour")
    operator = make_role("replaysafe_operator")
    c = login_as(operator)
    before = table_state(dsn)
    for t in ("A", "B"):
        assert sqlstate(c, RESOLVE, (t, "lost")) == "RS004", t
    assert one(c, SWEEP, (100,)) == 0
    assert one(c, PURGE, (100,)) == 0
    assert sqlstate(c, "SELECT replaysafe.sweep_expired_actions(p_tenant_id => 'A')") == "RS004"
    assert sqlstate(c, "SELECT replaysafe.purge_actions(p_older_than => '0', "
                       "p_tenant_id => 'B')") == "RS004"
    assert table_state(dsn) == before

    bind_to_all_tenants(dsn, operator)
    assert one(c, RESOLVE, ("A", "lost")) == "succeeded"
    assert one(c, RESOLVE, ("B", "lost")) == "succeeded"
    assert one(c, SWEEP, (100,)) == 2
    assert one(c, PURGE, (100,)) == 4  # each tenant's finished action and the resolved one
    assert states(dsn) == Counter({("A", "unknown"): 1, ("B", "unknown"): 1})


def test_an_all_tenant_worker_claims_for_any_tenant_within_the_worker_duty(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    worker = make_role("replaysafe_worker")
    c = login_as(worker)
    params = {"k": "job", "lease": "1 minute", "ago": "0", "on_expired": "unknown"}
    assert sqlstate(c, CLAIM, {"t": "A", **params}) == "RS004"
    bind_to_all_tenants(dsn, worker)
    for t in ("A", "B"):
        assert claim(c, t, "job", lease="1 minute")[0] == 1
    assert states(dsn) == Counter({("A", "running"): 1, ("B", "running"): 1})
    # Settling and purging are still not a worker's.
    assert sqlstate(c, RESOLVE, ("A", "job")) == "42501"
    assert sqlstate(c, PURGE, (100,)) == "42501"


def test_a_tenant_binding_of_the_login_wins_over_an_all_tenant_role_it_sets(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    seed_views(dsn, "A", "B")
    with psycopg.connect(dsn, autocommit=True) as owner:
        for t in ("A", "B"):
            expired_leases(owner, t, 1, ago="1 hour")
    everyone = make_role("replaysafe_auditor", "replaysafe_operator")
    bind_to_all_tenants(dsn, everyone)
    bound = make_role(everyone)
    bind(dsn, bound, "A")
    c = login_as(bound)
    assert seen(c) == everywhere("A")
    c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(everyone)))
    assert seen(c) == everywhere("A")
    assert sqlstate(c, RESOLVE, ("B", "lost")) == "RS004"
    assert one(c, RESOLVE, ("A", "lost")) == "succeeded"
    assert one(c, SWEEP, (100,)) == 1
    assert state_of(dsn, "A", "lease_1") == "unknown"
    assert state_of(dsn, "B", "lease_1") == "running"
    assert state_of(dsn, "B", "lost") == "unknown"


def test_a_tenant_binding_of_the_current_role_wins_over_the_logins_all_tenant_binding(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    seed_views(dsn, "A", "B")
    bound_b = make_role("replaysafe_auditor", "replaysafe_operator")
    bind(dsn, bound_b, "B")
    everyone = make_role("replaysafe_auditor", "replaysafe_operator", bound_b)
    bind_to_all_tenants(dsn, everyone)
    c = login_as(everyone)
    assert seen(c) == everywhere("A", "B")
    c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(bound_b)))
    assert seen(c) == everywhere("B")
    assert sqlstate(c, RESOLVE, ("A", "lost")) == "RS004"
    assert one(c, RESOLVE, ("B", "lost")) == "succeeded"


def test_an_all_tenant_binding_is_not_inherited_by_the_roles_members(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    seed_views(dsn, "A", "B")
    everyone = make_role("replaysafe_auditor", "replaysafe_operator")
    bind_to_all_tenants(dsn, everyone)
    member = make_role(everyone)
    c = login_as(member)
    assert seen(c) == everywhere()
    assert sqlstate(c, RESOLVE, ("A", "lost")) == "RS004"
    c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(everyone)))  # acting as it: yes
    assert seen(c) == everywhere("A", "B")


def test_code_an_all_tenant_role_owns_reads_no_more_for_a_bound_login(
        dsn: str, make_role: MakeRole, login_as: Login) -> None:
    """A login bound to A and a member of an all-tenant role: what SET ROLE to that role
    does not show (another tenant's rows), a SECURITY DEFINER function the login made that
    role own (in pg_temp, which every role may create in) must not show either."""
    seed_views(dsn, "A", "B")
    everyone = make_role("replaysafe_auditor")
    bind_to_all_tenants(dsn, everyone)
    bound = make_role(everyone)
    bind(dsn, bound, "A")
    c = login_as(bound)
    c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(everyone)))
    c.execute("CREATE FUNCTION pg_temp.peek() RETURNS SETOF text LANGUAGE sql "
              "SECURITY DEFINER AS 'SELECT DISTINCT tenant_id FROM replaysafe.actions_v'")
    try:
        assert {r[0] for r in c.execute("SELECT pg_temp.peek()").fetchall()} == {"A"}
        c.execute("RESET ROLE")
        assert {r[0] for r in c.execute("SELECT pg_temp.peek()").fetchall()} <= {"A"}
    finally:  # the role is dropped after the test: its function must be gone by then
        c.execute("RESET ROLE")
        c.execute("DROP FUNCTION pg_temp.peek()")


def test_a_binding_in_one_database_reads_nothing_in_another(
        dsn: str, empty_dsn: str, make_role: MakeRole, login_as: Login) -> None:
    replaysafe_pg.migrate(empty_dsn)  # a second installation on the same cluster
    other = empty_dsn
    seed_views(dsn, "A", "B")
    seed_views(other, "A", "B")
    with psycopg.connect(other, autocommit=True) as owner:
        assert seen(owner) == everywhere("A", "B")
    bound = make_role("replaysafe_auditor")
    bind(dsn, bound, "A")
    everyone = make_role("replaysafe_auditor")
    bind_to_all_tenants(dsn, everyone)
    operator = make_role("replaysafe_operator")
    bind(dsn, operator, "A")
    assert seen(login_as(bound)) == everywhere("A")
    assert seen(login_as(everyone)) == everywhere("A", "B")
    assert seen(login_as(bound, other)) == everywhere()
    assert seen(login_as(everyone, other)) == everywhere()
    in_other = login_as(operator, other)
    assert sqlstate(in_other, RESOLVE, ("A", "lost")) == "RS004"
    assert one(in_other, SWEEP, (100,)) == 0


# --- acting_for ---------------------------------------------------------------------------

ACTING_FOR = "SELECT role_name, tenant_id, all_tenants FROM replaysafe.acting_for()"


ACTING_FOR_GRANT = ("SELECT role_name, tenant_id, all_tenants "
                    "FROM replaysafe.acting_for(p_grant => %s)")


@pytest.mark.parametrize("group", ["replaysafe_worker", "replaysafe_operator",
                                   "replaysafe_auditor"])
def test_acting_for_is_granted_to_the_group_roles(dsn: str, make_role: MakeRole,
                                                  login_as: Login, group: str) -> None:
    role = make_role(group)
    bind(dsn, role, "A")
    assert login_as(role).execute(ACTING_FOR).fetchall() == [(role, "A", False)]


def test_acting_for_names_each_callers_scope(dsn: str, make_role: MakeRole,
                                             login_as: Login) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner_name = schema_owner(dsn)
        assert owner.execute(ACTING_FOR).fetchall() == [(owner_name, None, True)]
        grant_t = one(owner, "SELECT replaysafe.issue_tenant_grant(p_tenant_id => 'T', "
                             "p_duties => '{worker}')")
    bound = make_role("replaysafe_worker")
    bind(dsn, bound, "A")
    everyone = make_role("replaysafe_auditor")
    bind_to_all_tenants(dsn, everyone)
    unbound = make_role("replaysafe_operator")
    pooled = make_role("replaysafe_worker")
    assert login_as(bound).execute(ACTING_FOR).fetchall() == [(bound, "A", False)]
    assert login_as(everyone).execute(ACTING_FOR).fetchall() == [(everyone, None, True)]
    assert login_as(unbound).execute(ACTING_FOR).fetchall() == [(unbound, None, False)]
    c = login_as(pooled)
    assert c.execute(ACTING_FOR).fetchall() == [(pooled, None, False)]
    assert c.execute(ACTING_FOR_GRANT, (grant_t,)).fetchall() == [(pooled, "T", False)]
    # A bound login is not told it acts for another tenant's grant.
    assert sqlstate(login_as(bound), ACTING_FOR_GRANT, (grant_t,)) == "RS004"
