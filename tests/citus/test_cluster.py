"""replaysafe on a real Citus cluster: the subset of the contract that runs against one
database of a Citus coordinator, with no template database to clone and no server to
restart (docs/scale-out.md, "Testing on a cluster"). Citus cannot be installed on our
machines, so these tests are skipped here; a user runs them with

    REPLAYSAFE_TEST_DSN=postgresql://owner@coordinator/db python -m pytest tests/citus

where ``owner`` may create roles (Citus creates them on every node) and the nodes accept
the roles the tests create (trust, or a .pgpass/citus.node_conninfo for them). The database
is migrated and distributed (``migrate(dsn, citus=True)``, idempotent) and kept; the tests'
roles, bindings and rows are removed afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from helpers.citus import DELEGATED
from psycopg import conninfo as pg_conninfo

import replaysafe_pg
from replaysafe_pg import AccessDenied, Ledger, Threads, schema
from replaysafe_pg.errors import wrap_errors

Conn = psycopg.Connection[Any]

pytestmark = pytest.mark.skipif(not os.environ.get("REPLAYSAFE_TEST_DSN"),
                                reason="needs REPLAYSAFE_TEST_DSN at a Citus coordinator")


@pytest.fixture(scope="module")
def cluster() -> str:
    dsn = os.environ["REPLAYSAFE_TEST_DSN"]
    with psycopg.connect(dsn) as c:
        if c.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone() is None:
            pytest.skip("REPLAYSAFE_TEST_DSN is not a Citus database (no citus extension)")
    replaysafe_pg.migrate(dsn, citus=True)
    replaysafe_pg.migrate(dsn, citus=True)  # again: nothing to do
    return dsn


@pytest.fixture
def tenant_roles(cluster: str) -> Iterator[Callable[[str], tuple[str, str]]]:
    """Make a LOGIN role in replaysafe_worker bound to a fresh tenant: (role, tenant)."""
    made: list[str] = []

    def make(group: str = "replaysafe_worker") -> tuple[str, str]:
        role, tenant = f"rs_citus_{uuid.uuid4().hex[:8]}", f"t_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(cluster, autocommit=True) as c:
            c.execute(f'CREATE ROLE "{role}" LOGIN')
            c.execute(f'GRANT "{group}" TO "{role}"')
            c.execute("SELECT replaysafe.bind_role_to_tenant(%s, %s)", (role, tenant))
            c.execute("SELECT replaysafe.citus_sync_role_bindings()")
        made.append(role)
        return role, tenant

    yield make
    with psycopg.connect(cluster, autocommit=True) as c:
        for role in made:
            c.execute("SELECT replaysafe.unbind_role(%s)", (role,))
            c.execute(f'DROP ROLE IF EXISTS "{role}"')
        c.execute("SELECT replaysafe.citus_sync_role_bindings()")


def _as(dsn: str, role: str) -> str:
    return pg_conninfo.make_conninfo(dsn, user=role)


def test_the_schema_is_distributed_as_documented(cluster: str) -> None:
    reference, distributed = schema.citus_layout()
    with psycopg.connect(cluster) as c:
        rows = dict(c.execute(
            "SELECT c.relname::text, p.partmethod::text || coalesce(':' || "
            "column_to_column_name(p.logicalrelid, p.partkey), '') FROM pg_class c "
            "LEFT JOIN pg_dist_partition p ON p.logicalrelid = c.oid "
            "WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind = 'r'").fetchall())
        assert rows.pop("alembic_version") is None
        assert rows == {t: "n" for t in reference} | {t: "h:tenant_id" for t in distributed}
        assert c.execute("SELECT count(DISTINCT colocationid) FROM pg_dist_partition "
                         "WHERE logicalrelid::text LIKE 'replaysafe.%' AND partmethod = 'h'"
                         ).fetchone() == (1,)
        by_arg = {r[0] for r in c.execute(
            "SELECT p.proname::text FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid "
            "WHERE p.pronamespace = 'replaysafe'::regnamespace "
            "AND o.distribution_argument_index IS NOT NULL")}
        assert by_arg == DELEGATED


def test_a_bound_worker_runs_on_the_worker_that_holds_its_tenant(cluster: str,
                                                                 tenant_roles: Any) -> None:
    role, tenant = tenant_roles()
    notices: list[str] = []
    with psycopg.connect(_as(cluster, role), autocommit=True) as c:
        c.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        c.execute("SET client_min_messages TO debug1")
        c.execute("SELECT replaysafe.write_thread(p_tenant_id => %s, p_thread_id => 'th', "
                  "p_expected_version => 0, p_state => '{}')", (tenant,))
        assert "pushing down the function call" in notices
        notices.clear()
        now = datetime.now(UTC)
        row = c.execute("SELECT * FROM replaysafe.claim_action(p_tenant_id => %s, p_action_key => 'k', "
                        "p_operation => 'op', p_request => '{}', p_worker_id => 'w', p_now => %s)",
                        (tenant, now)).fetchone()
        assert row is not None and row[0] == "claimed"
        assert "pushing down the function call" in notices
        notices.clear()
        # Without p_now the default clock_timestamp() (volatile) keeps the call on the
        # coordinator (docs/scale-out.md): it works, each statement inside goes to the shard.
        row = c.execute("SELECT * FROM replaysafe.claim_action(p_tenant_id => %s, p_action_key => 'k', "
                        "p_operation => 'op', p_request => '{}', p_worker_id => 'w')",
                        (tenant,)).fetchone()
        assert row is not None and row[0] == "running"
        assert "pushing down the function call" not in notices
    with Ledger(_as(cluster, role), tenant_id=tenant) as led:
        first = led.claim("refund", "refund", {"n": 1})
        assert led.complete(first, {"ok": True}).value == "recorded"
        assert led.claim("refund", "refund", {"n": 1}).outcome.value == "replay"
    with Threads(_as(cluster, role), tenant_id=tenant) as th:
        assert th.read("th").version == 1


def test_another_tenants_rows_are_refused_on_the_worker(cluster: str, tenant_roles: Any) -> None:
    role_a, _ = tenant_roles()
    _, tenant_b = tenant_roles()
    with Threads(_as(cluster, role_a), tenant_id=tenant_b) as th, pytest.raises(AccessDenied):
        th.read("th")
    with psycopg.connect(_as(cluster, role_a), autocommit=True) as c, \
            pytest.raises(AccessDenied), wrap_errors():
        c.execute("SELECT replaysafe.heartbeat_action(p_tenant_id => %s, p_action_key => 'k', "
                  "p_attempt => 1, p_attempt_token => 'rsat_x', p_now => %s)",
                  (tenant_b, datetime.now(UTC)))


def test_sweep_runs_per_tenant_and_the_owners_all_tenant_sweep_is_refused(
        cluster: str, tenant_roles: Any) -> None:
    role, tenant = tenant_roles()
    with Ledger(_as(cluster, role), tenant_id=tenant) as led:
        assert led.sweep() == 0  # FOR UPDATE SKIP LOCKED on one shard: a router query
    with psycopg.connect(cluster, autocommit=True) as c, \
            pytest.raises(psycopg.errors.FeatureNotSupported, match="FOR UPDATE"):
        c.execute("SELECT replaysafe.sweep_expired_actions()")


@pytest.mark.xfail(reason="citusdata/citus#1683, #6161: a view over a distributed table needs the "
                          "reader's own privileges on the shards (docs/scale-out.md)", strict=False)
def test_a_bound_reader_reads_its_tenant_through_the_views(cluster: str, tenant_roles: Any) -> None:
    role, tenant = tenant_roles()
    with Ledger(_as(cluster, role), tenant_id=tenant) as led:
        led.claim("seen", "op", {})
        assert led.get("seen") is not None
