"""docs/isolation.md: a binding belongs to the role the schema owner bound, never to a name or a
group, and SET ROLE never widens what a bound login reads or does. Tried as an attacker
holding a worker's (or an auditor's) credentials; roles are real LOGIN roles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from helpers.db import bind, connect_as, sqlstate
from helpers.seeded_tenants import VIEWS
from psycopg import sql

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


def test_set_role_never_widens_a_bound_login(seeded_world: str, make_role: MakeRole) -> None:
    """Set role never widens a bound login."""
    auditor = make_role("replaysafe_auditor")
    worker = make_role("replaysafe_worker")
    bind(seeded_world, auditor, "A")
    bind(seeded_world, worker, "A")
    with connect_as(seeded_world, auditor) as c:
        c.execute("SET ROLE replaysafe_auditor")  # the group itself is unbound
        for view in VIEWS:
            tenants = {r[0] for r in c.execute(f"SELECT tenant_id FROM replaysafe.{view}")}
            assert tenants <= {"A"}, view
        assert {r[0] for r in c.execute("SELECT tenant_id FROM replaysafe.actions_v")} == {"A"}
    with connect_as(seeded_world, worker) as c:
        c.execute("SET ROLE replaysafe_worker")
        assert sqlstate(c, "SELECT * FROM replaysafe.read_thread(p_tenant_id => 'B', "
                           "p_thread_id => 'mine', p_user_id => 'alice')") == "RS004"
        assert c.execute("SELECT version FROM replaysafe.read_thread(p_tenant_id => 'A', "
                         "p_thread_id => 'mine', p_user_id => 'alice')").fetchone() == (1,)
        assert c.execute("SELECT replaysafe.sweep_expired_actions()").fetchone() == (0,)


def test_per_request_set_role_from_an_unbound_login(seeded_world: str, make_role: MakeRole) -> None:
    """PostgREST style: an unbound authenticator login SETs ROLE to a bound role per request.

    A bound auditor
    reads every tenant."""
    authenticator = make_role()
    tenant_role = make_role("replaysafe_worker")
    bind(seeded_world, tenant_role, "B")
    with psycopg.connect(seeded_world, autocommit=True) as owner:
        owner.execute(f'GRANT "{tenant_role}" TO "{authenticator}"')
    with connect_as(seeded_world, authenticator) as c:
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


def test_binding_is_the_owners_even_with_execute_granted_by_mistake(seeded_world: str,
                                                                   worker_a: Conn) -> None:
    """Binding is the owners even with execute granted by mistake."""
    with psycopg.connect(seeded_world, autocommit=True) as owner:
        owner.execute("GRANT EXECUTE ON FUNCTION replaysafe.bind_role_to_tenant(text, text), "
                      "replaysafe.unbind_role(text) TO replaysafe_worker")
    assert sqlstate(worker_a, "SELECT replaysafe.bind_role_to_tenant(p_role => current_user, "
                              "p_tenant_id => 'B')") == "RS004"
    assert sqlstate(worker_a, "SELECT replaysafe.unbind_role(p_role => current_user)") == "RS004"


def test_a_binding_follows_the_role_not_its_name(seeded_world: str, admin_dsn: str,
                                                  make_role: MakeRole) -> None:
    """A binding follows the role not its name."""
    renamed, recreated = make_role("replaysafe_auditor"), make_role("replaysafe_worker")
    bind(seeded_world, renamed, "A")
    bind(seeded_world, recreated, "B")
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'ALTER ROLE "{renamed}" RENAME TO "{renamed}_x"')
        admin.execute(f'ALTER ROLE "{renamed}_x" RENAME TO "{renamed}"')  # the fixture drops it
        admin.execute(f'ALTER ROLE "{renamed}" RENAME TO "{renamed}_y"')
    try:
        with connect_as(seeded_world, f"{renamed}_y") as c:  # renamed: still bound, not every tenant
            assert {r[0] for r in c.execute("SELECT tenant_id FROM replaysafe.actions_v")} == {"A"}
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER ROLE "{renamed}_y" RENAME TO "{renamed}"')
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP OWNED BY "{recreated}"')
        admin.execute(f'DROP ROLE "{recreated}"')
        admin.execute(f'CREATE ROLE "{recreated}" LOGIN IN ROLE replaysafe_worker')
    with connect_as(seeded_world, recreated) as c:  # same name, new role: no tenant
        assert sqlstate(c, "SELECT * FROM replaysafe.read_thread(p_tenant_id => 'B', "
                           "p_thread_id => 'mine', p_user_id => 'alice')") == "RS004"
    with psycopg.connect(seeded_world, autocommit=True) as owner:  # the orphan can be unbound by name
        assert owner.execute("SELECT replaysafe.unbind_role(p_role => %s)",
                             (recreated,)).fetchone() == (True,)


def test_group_roles_cannot_be_bound(dsn: str) -> None:
    """Group roles cannot be bound."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for role in ("replaysafe_worker", "replaysafe_operator", "replaysafe_auditor"):
            assert sqlstate(c, "SELECT replaysafe.bind_role_to_tenant(p_role => %s, "
                               "p_tenant_id => 'B')", (role,)) == "RS005"
        assert c.execute("SELECT count(*) FROM replaysafe.role_bindings").fetchone() == (0,)


def test_set_role_to_a_group_role_still_reads_the_logins_tenant(seeded_world: str,
                                                                make_role: MakeRole) -> None:
    """Set role to a group role still reads the logins tenant."""
    login = make_role("replaysafe_worker", "replaysafe_auditor")
    bind(seeded_world, login, "A")
    with connect_as(seeded_world, login) as c:
        for group in ("replaysafe_worker", "replaysafe_auditor"):
            c.execute(f"SET ROLE {group}")
            assert {r[0] for r in c.execute("SELECT tenant_id FROM replaysafe.actions_v")} == {"A"}
            c.execute("RESET ROLE")
