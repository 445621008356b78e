"""docs/isolation.md: a binding belongs to the role the schema owner bound, never to a name or a
group, and SET ROLE never widens what a bound login reads or does. Tried as an attacker
holding a worker's (or an auditor's) credentials; roles are real LOGIN roles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as, sqlstate
from psycopg import sql

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


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


def test_set_role_never_widens_a_bound_login(world: str, make_role: MakeRole) -> None:
    """Finding 0002-F2: a bound auditor
    reads every tenant."""
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
    """PostgREST style: an unbound authenticator login SETs ROLE to a bound role per request.

    Finding 0002-F2: a bound auditor
    reads every tenant."""
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


def test_binding_is_the_owners_even_with_execute_granted_by_mistake(world: str,
                                                                   worker_a: Conn) -> None:
    """Finding 0003-R."""
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute("GRANT EXECUTE ON FUNCTION replaysafe.bind_role_to_tenant(text, text), "
                      "replaysafe.unbind_role(text) TO replaysafe_worker")
    assert sqlstate(worker_a, "SELECT replaysafe.bind_role_to_tenant(p_role => current_user, "
                              "p_tenant_id => 'B')") == "RS004"
    assert sqlstate(worker_a, "SELECT replaysafe.unbind_role(p_role => current_user)") == "RS004"


def test_a_binding_follows_the_role_not_its_name(world: str, admin_dsn: str,
                                                  make_role: MakeRole) -> None:
    """Finding 0003-R."""
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


def test_group_roles_cannot_be_bound(dsn: str) -> None:
    """Finding 0004/0005-R."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for role in ("replaysafe_worker", "replaysafe_operator", "replaysafe_auditor"):
            assert sqlstate(c, "SELECT replaysafe.bind_role_to_tenant(p_role => %s, "
                               "p_tenant_id => 'B')", (role,)) == "RS005"
        assert c.execute("SELECT count(*) FROM replaysafe.role_bindings").fetchone() == (0,)


def test_set_role_to_a_group_role_still_reads_the_logins_tenant(world: str,
                                                                make_role: MakeRole) -> None:
    """Finding 0003-R4."""
    login = make_role("replaysafe_worker", "replaysafe_auditor")
    bind(world, login, "A")
    with connect_as(world, login) as c:
        for group in ("replaysafe_worker", "replaysafe_auditor"):
            c.execute(f"SET ROLE {group}")
            assert {r[0] for r in c.execute("SELECT tenant_id FROM replaysafe.actions_v")} == {"A"}
            c.execute("RESET ROLE")
