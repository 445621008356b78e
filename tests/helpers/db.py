"""One cloned database shared by a test module (a clone per test costs ~0.3 s each), a
reset that empties the ledger between tests that share it, and connecting as (and binding)
the LOGIN roles of the isolation tests, and what they are refused."""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo


def own_installation(dsn: str) -> None:
    """Make a template clone an installation of its own, as a user makes a copy of a
    database one (docs/isolation.md, copies of the database): a clone shares the template's
    grant keys and issues no grant until it has its own."""
    with psycopg.connect(dsn, autocommit=True) as c:
        if c.execute("SELECT to_regprocedure('replaysafe.rotate_grant_key(boolean)') IS NOT NULL"
                     ).fetchone() == (True,):
            c.execute("SELECT replaysafe.rotate_grant_key(p_keep_previous => false)")


@contextlib.contextmanager
def cloned_database(admin_dsn: str, template: str) -> Iterator[str]:
    name = f"rs_mod_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    own_installation(pg_conninfo.make_conninfo(admin_dsn, dbname=name))
    try:
        yield pg_conninfo.make_conninfo(admin_dsn, dbname=name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def dsn_for(admin_dsn: str, dbname: str) -> str:
    return pg_conninfo.make_conninfo(admin_dsn, dbname=dbname)


_counter = itertools.count()


def clone_database(admin_dsn: str, template: str) -> str:
    """A new database copied from ``template`` (the session's migrated one)."""
    name = f"rs_t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    own_installation(dsn_for(admin_dsn, name))
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reset_ledger(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DELETE FROM replaysafe.action_attempts; DELETE FROM replaysafe.actions; "
                 "DELETE FROM replaysafe.role_bindings")


def derived_key(dsn: str, tenant_id: str, action_key: str) -> str:
    """The idempotency key the database derives for a pair, read as the schema owner (the
    test's superuser): no Python helper computes it (docs/isolation.md)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT replaysafe.idempotency_key(%s, %s)",
                        (tenant_id, action_key)).fetchone()
    assert row is not None
    key: str = row[0]
    return key


def dsn_as(dsn: str, role: str) -> str:
    """``dsn`` for the LOGIN ``role``: the same server and database, without ``dsn``'s
    password (it is the superuser's; the test roles have none)."""
    params = pg_conninfo.conninfo_to_dict(dsn)
    params["user"] = role
    params.pop("password", None)
    return pg_conninfo.make_conninfo("", **params)


def connect_as(dsn: str, role: str) -> psycopg.Connection[Any]:
    return psycopg.connect(pg_conninfo.make_conninfo(dsn, user=role), autocommit=True)


def bind(dsn: str, role: str, tenant: str) -> None:
    """Bind ``role`` to ``tenant``, as the schema owner (the test's superuser)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => %s)",
                  (role, tenant))


def require_maintain_privilege(dsn: str) -> None:
    """Skip unless the server knows the MAINTAIN privilege (Postgres 17+): before it, only a
    table's owner (or a superuser) runs ANALYZE on it, so a tenant's maintenance cannot run
    another tenant's index expression."""
    import pytest

    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT current_setting('server_version_num')::int").fetchone()
    if row is None or row[0] < 170000:
        pytest.skip("GRANT MAINTAIN needs Postgres 17+")


def plan_counts(c: psycopg.Connection[Any], query: str) -> list[tuple[str, int]]:
    """Every row count EXPLAIN ANALYZE reports on the schema's tables, node by node (scans of
    the catalogs, which count roles anyone may list, aside)."""
    import json

    plan = c.execute(f"EXPLAIN (ANALYZE, VERBOSE, FORMAT JSON, TIMING OFF) {query}".encode()
                     ).fetchone()
    assert plan is not None
    doc = plan[0] if isinstance(plan[0], list) else json.loads(plan[0])
    out: list[tuple[str, int]] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Schema") == "replaysafe":  # a table's scan, or a function's (grant_in_force)
            name = node.get("Relation Name") or node.get("Function Name")
            out.extend((f"{name}: {k}", int(v)) for k, v in node.items()
                       if k.startswith(("Actual Rows", "Rows Removed")) and isinstance(v, int | float))
        for child in node.get("Plans", []):
            walk(child)

    walk(doc[0]["Plan"])
    return out


def sqlstate(c: psycopg.Connection[Any], query: str, params: Any = None) -> str | None:
    """The SQLSTATE ``query`` raises, or None when it succeeds."""
    try:
        c.execute(query.encode(), params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def owner_rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """``query``'s rows, read on a connection of ``dsn``'s own role (the schema owner)."""
    with psycopg.connect(dsn) as c:
        return c.execute(query.encode(), params).fetchall()


def own_connection(ledger: Any) -> psycopg.Connection[Any]:
    """The connection a Ledger made from a DSN opened for itself."""
    conn = ledger._source._own
    assert conn is not None
    return conn


def bind_to_all_tenants(dsn: str, role: str) -> None:
    """Let ``role`` act for every tenant (``bind_role_to_all_tenants``), as the schema owner."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT replaysafe.bind_role_to_all_tenants(p_role => %s)", (role,))


def refused(conn: psycopg.Connection[Any], sql: str, *args: Any) -> None:
    """``sql`` (its arguments positional) is refused with RS004: not the caller's."""
    import pytest

    with pytest.raises(psycopg.Error) as raised:
        conn.execute(sql, args)
    assert raised.value.sqlstate == "RS004", raised.value
