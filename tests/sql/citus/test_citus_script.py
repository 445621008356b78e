"""docs/scale-out.md: replaysafe on Citus, tested here without Citus (it cannot be installed on
these machines: no package for it). ``sql/citus.sql`` runs against a migrated
database holding stand-ins with Citus's exact signatures (tests/helpers/citus.py) that record
every call; the catalog is checked for what ``create_distributed_table`` requires; the
driver's statements are checked against Citus's rule for delegating a call. What only a
cluster can show runs in tests/citus (``REPLAYSAFE_TEST_DSN`` at a Citus coordinator)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from helpers.citus import DELEGATED, citus_script_without_guard, install_standins
from helpers.cli import run_json
from helpers.db import bind, connect_as

import replaysafe_pg
from replaysafe_pg import AccessDenied, CitusUnavailable, Threads, queries, schema
from replaysafe_pg.errors import wrap_errors

Conn = psycopg.Connection[Any]


def _is_superuser(conn: Conn) -> bool:
    row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


@pytest.fixture
def citus_db(dsn: str, conn: Conn) -> Iterator[str]:
    """A migrated database with the Citus stand-ins, distributed by citus.sql (guard aside)."""
    if not _is_superuser(conn):
        pytest.skip("the Citus stand-ins are tables in pg_catalog: they need a superuser")
    install_standins(conn)
    with conn.transaction():
        conn.execute(citus_script_without_guard(schema.citus_sql()))
    yield dsn


def _calls(conn: Conn, fn: str) -> list[dict[str, Any]]:
    return [r[0] for r in conn.execute(
        "SELECT args FROM citus_standin.calls WHERE fn = %s ORDER BY n", (fn,))]


def _catalog(conn: Conn) -> tuple[set[str], set[str], set[str]]:
    """Tables of the schema: with a tenant_id column, without, and every function name."""
    tables = dict(conn.execute(
        "SELECT c.relname::text, EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid "
        "AND a.attname = 'tenant_id' AND NOT a.attisdropped) FROM pg_class c "
        "WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind IN ('r', 'p')").fetchall())
    functions = {r[0] for r in conn.execute(
        "SELECT p.proname::text FROM pg_proc p WHERE p.pronamespace = 'replaysafe'::regnamespace")}
    return ({t for t, has in tables.items() if has}, {t for t, has in tables.items() if not has},
            functions)


# --- refusal ----------------------------------------------------------------------------

def _snapshot(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT 'rel', c.oid::regclass::text, c.relkind::text FROM pg_class c "
        "WHERE c.relnamespace = 'replaysafe'::regnamespace "
        "UNION ALL SELECT 'fn', p.oid::regprocedure::text, md5(p.prosrc) FROM pg_proc p "
        "WHERE p.pronamespace = 'replaysafe'::regnamespace ORDER BY 1, 2").fetchall()


def test_without_citus_the_script_and_migrate_refuse_and_change_nothing(dsn: str, conn: Conn,
                                                                        empty_dsn: str) -> None:
    before = _snapshot(conn)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                       match="the citus extension is not installed"):
        conn.execute(schema.citus_sql())
    with pytest.raises(CitusUnavailable, match=r"citus extension is not installed.*nothing was changed"):
        replaysafe_pg.migrate(dsn, citus=True)
    assert _snapshot(conn) == before
    # An empty database is not even migrated: the refusal comes first.
    with pytest.raises(CitusUnavailable):
        replaysafe_pg.migrate(empty_dsn, citus=True)
    assert replaysafe_pg.current_revision(empty_dsn) is None
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regnamespace('replaysafe')").fetchone() == (None,)


def test_the_script_refuses_a_revision_it_was_not_written_for(dsn: str, conn: Conn) -> None:
    if not _is_superuser(conn):
        pytest.skip("the Citus stand-ins need a superuser")
    install_standins(conn)
    # The guard, on a database that has the extension as far as the guard can tell.
    guard = schema.citus_sql().split("-- guard: begin --")[1].split("-- guard: end --")[0]
    guard = guard.replace("(SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname = 'citus')",
                          "'12.1-1'")
    conn.execute(guard)  # the head: accepted
    head, previous = schema.head_revision(), schema.revisions()[-2].revision
    conn.execute("UPDATE replaysafe.alembic_version SET version_num = %s", (previous,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                       match=f"written for schema revision {head} and this database is at "
                             f"{previous}: migrate to {head} first"):
        conn.execute(guard)


def _script_refuses(conn: Conn, setup: str, match: str) -> None:
    """After ``setup`` on a database with the stand-ins, the script stops with 55000."""
    if not _is_superuser(conn):
        pytest.skip("the Citus stand-ins need a superuser")
    install_standins(conn)
    conn.execute(setup)  # type: ignore[arg-type]
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=match), \
            conn.transaction():
        conn.execute(citus_script_without_guard(schema.citus_sql()))


def test_a_table_the_script_does_not_know_stops_it(dsn: str, conn: Conn) -> None:
    _script_refuses(conn, "CREATE TABLE replaysafe.new_rows (tenant_id text PRIMARY KEY)",
                    r"does not know the table.*new_rows")
    assert conn.execute("SELECT count(*) FROM citus_standin.calls").fetchone() == (0,)


def test_a_key_without_tenant_id_stops_it(dsn: str, conn: Conn) -> None:
    _script_refuses(conn, "CREATE UNIQUE INDEX threads_by_id ON replaysafe.threads (thread_id)",
                    r"replaysafe\.threads_by_id on replaysafe\.threads do not include tenant_id")


# --- what create_distributed_table requires (the catalog, no stand-ins) --------------------------

def test_every_key_of_a_table_to_distribute_holds_tenant_id(conn: Conn) -> None:
    """create_distributed_table refuses a primary key, unique or exclusion constraint, unique
    index or foreign key without the distribution column: every one of them holds tenant_id;
    the tables the script distributes are exactly those with rows of a tenant (bindings and
    grant generations aside: reference tables, as are the all-tenant roles and the limits),
    and nothing Citus handles apart (identity columns, sequences,
    triggers, foreign keys) is on them."""
    with_tenant, without_tenant, _ = _catalog(conn)
    reference, distributed = schema.citus_layout()
    assert set(distributed) == with_tenant - {"role_bindings", "grant_generations"}
    assert set(reference) - {"role_binding_nodes"} == {"role_bindings", "installation",
                                                      "grant_keys", "grant_generations",
                                                      "all_tenant_roles", "limits"}
    assert without_tenant == {"installation", "alembic_version", "grant_keys", "all_tenant_roles",
                              "limits"}
    keys = conn.execute(
        "SELECT k.conrelid::regclass::text, k.conname::text, k.contype::text, "
        "(SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = k.conrelid AND a.attname = 'tenant_id') "
        "= ANY (k.conkey) FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
        "WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relname = ANY (%s) "
        "AND k.contype IN ('p', 'u', 'x', 'f') "
        "UNION ALL SELECT i.indrelid::regclass::text, i.indexrelid::regclass::text, 'unique index', "
        "(SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attname = 'tenant_id') "
        "= ANY (i.indkey::smallint[]) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relname = ANY (%s) AND i.indisunique",
        (list(distributed), list(distributed))).fetchall()
    assert {k[0] for k in keys if k[2] == "p"} == {f"replaysafe.{t}" for t in distributed}
    assert [k for k in keys if not k[3]] == []
    assert [k for k in keys if k[2] == "f"] == []  # no foreign key at all
    extras = conn.execute(
        "SELECT 'identity ' || a.attrelid::regclass || '.' || a.attname FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid WHERE c.relnamespace = 'replaysafe'::regnamespace "
        "AND (a.attidentity <> '' OR a.attgenerated <> '') "
        "UNION ALL SELECT 'sequence ' || c.relname FROM pg_class c "
        "WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relkind = 'S' "
        "UNION ALL SELECT 'trigger ' || t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "WHERE c.relnamespace = 'replaysafe'::regnamespace AND NOT t.tgisinternal").fetchall()
    assert extras == []


# --- the script, against the stand-ins ------------------------------------------------------------

def test_tables_are_distributed_by_tenant_and_co_located_bindings_are_reference_tables(
        citus_db: str, conn: Conn) -> None:
    with_tenant, _, _ = _catalog(conn)
    tables = _calls(conn, "create_distributed_table")
    assert tables[0] == {"table_name": "replaysafe.actions", "distribution_column": "tenant_id",
                         "distribution_type": "hash", "colocate_with": "none", "shard_count": None}
    assert {t["table_name"] for t in tables} == {
        f"replaysafe.{t}" for t in with_tenant - {"role_bindings", "grant_generations"}}
    assert all(t["distribution_column"] == "tenant_id" and t["colocate_with"] == "replaysafe.actions"
               for t in tables[1:])
    assert [t["table_name"] for t in _calls(conn, "create_reference_table")] == [
        "replaysafe.role_bindings", "replaysafe.installation", "replaysafe.role_binding_nodes",
        "replaysafe.grant_keys", "replaysafe.grant_generations", "replaysafe.all_tenant_roles",
        "replaysafe.limits"]
    # alembic_version stays on the coordinator.
    assert conn.execute("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE "
                        "'%alembic_version'").fetchone() == (0,)
    colocation = conn.execute("SELECT count(DISTINCT colocationid) FROM pg_dist_partition "
                              "WHERE partmethod = 'h'").fetchone()
    assert colocation == (1,)


def test_single_tenant_functions_are_delegated_by_p_tenant_id_and_no_other_is(
        citus_db: str, conn: Conn) -> None:
    _, _, functions = _catalog(conn)
    calls = _calls(conn, "create_distributed_function")
    names = [re.match(r"replaysafe\.(\w+)\(", c["function_name"]).group(1)  # type: ignore[union-attr]
             for c in calls]
    # Every function on every node, once, but the bindings' writers: on a worker they would
    # store that node's role OIDs where the sync reads the coordinator's.
    coordinator_only = {"bind_role_to_tenant", "unbind_role", "bind_role_to_all_tenants"}
    assert coordinator_only <= set(functions)
    assert sorted(names) == sorted(set(functions) - coordinator_only)
    by_arg = {n for n, c in zip(names, calls, strict=True) if c["distribution_arg_name"] is not None}
    assert by_arg == DELEGATED
    for name, c in zip(names, calls, strict=True):
        if name in DELEGATED:
            assert (c["distribution_arg_name"], c["colocate_with"]) == ("p_tenant_id", "replaysafe.actions")
            assert c["force_delegation"] is None
        else:  # sweep, purge, bindings, helpers: created on every node, never delegated
            assert (c["distribution_arg_name"], c["colocate_with"]) == (None, "default")
    for multi in ("sweep_expired_actions", "purge_actions", "bind_role_to_tenant", "idempotency_key"):
        assert multi not in by_arg
    # Citus's catalog: the distribution argument is p_tenant_id's position.
    wrong = conn.execute(
        "SELECT p.proname FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid "
        "WHERE o.distribution_argument_index IS NOT NULL "
        "AND p.proargnames[o.distribution_argument_index + 1] <> 'p_tenant_id'").fetchall()
    assert wrong == []


def test_running_it_again_changes_nothing(citus_db: str, conn: Conn) -> None:
    count = conn.execute("SELECT count(*) FROM citus_standin.calls "
                         "WHERE fn LIKE 'create%'").fetchone()
    with conn.transaction():
        conn.execute(citus_script_without_guard(schema.citus_sql()))
    assert conn.execute("SELECT count(*) FROM citus_standin.calls "
                        "WHERE fn LIKE 'create%'").fetchone() == count


def _run_revision(dsn: str, directory: Path, name: str, sql: str) -> None:
    """A revision script as alembic runs ours (through run_revision_sql), in one transaction."""
    (directory / name).write_text(sql)
    engine = sa.create_engine(schema.sqlalchemy_url(dsn), poolclass=sa.NullPool)
    try:
        with engine.begin() as sa_conn:
            schema.run_revision_sql(str(directory / "revision.py"), name, sa_conn)
    finally:
        engine.dispose()


NEXT_REVISION = "CREATE TABLE replaysafe.next_rows (tenant_id text PRIMARY KEY);"


def test_a_distributed_installation_takes_no_revision_script(citus_db: str, conn: Conn,
                                                             tmp_path: Path) -> None:
    """A revision script run on a distributed installation would re-create
    _caller/_reader with role-OID lookups (wrong on a worker node). Every script, up or down, is
    refused before it changes anything."""
    head, previous = schema.head_revision(), schema.revisions()[-2].revision
    before = _snapshot(conn)
    with pytest.raises(CitusUnavailable, match=r"distributed with Citus.*downgrading revision "
                       rf"{head} is refused, nothing was changed"):
        replaysafe_pg.downgrade(citus_db, previous)
    for name in (f"{int(head) + 1:04d}_next.sql", f"{head}_again.sql"):
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                           match=f"upgrading to revision {name[:4]} is refused"):
            _run_revision(citus_db, tmp_path, name, NEXT_REVISION)
    # Undistributed by hand (Citus's catalog forgets the tables): the per-node lookups that
    # citus.sql installed are still there, and so is the refusal.
    conn.execute("DELETE FROM pg_catalog.pg_dist_partition")
    with pytest.raises(CitusUnavailable, match=f"downgrading revision {head} is refused"):
        replaysafe_pg.downgrade(citus_db, previous)
    assert _snapshot(conn) == before
    assert replaysafe_pg.current_revision(citus_db) == head
    replaysafe_pg.migrate(citus_db)  # at the head already: no script runs, nothing refused


def test_the_revision_guard_lets_an_undistributed_installation_through(
        dsn: str, conn: Conn, tmp_path: Path) -> None:
    for path in (Path(schema.__file__).parent / "migrations" / "versions").glob("*.sql"):
        assert "$citus_guard$" in schema.citus_migration_guard(path.name), path.name
    conn.execute(schema.citus_migration_guard("0010_next.sql"))  # no Citus catalog at all
    if _is_superuser(conn):
        install_standins(conn)  # Citus's catalog, with an application's table distributed
        conn.execute("CREATE TABLE public.app_orders (id int PRIMARY KEY)")
        conn.execute("INSERT INTO pg_catalog.pg_dist_partition "
                     "VALUES ('public.app_orders', 'h', 'id', 1, 's')")
        conn.execute(schema.citus_migration_guard("0010_next.sql"))
        # One of ours distributed by hand, without citus.sql: refused as well.
        conn.execute("INSERT INTO pg_catalog.pg_dist_partition "
                     "VALUES ('replaysafe.actions', 'h', 'tenant_id', 2, 's')")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="0010 is refused"):
            conn.execute(schema.citus_migration_guard("0010_next.sql"))
        conn.execute("DELETE FROM pg_catalog.pg_dist_partition "
                     "WHERE logicalrelid = 'replaysafe.actions'::regclass")
    _run_revision(dsn, tmp_path, f"{int(schema.head_revision()) + 1:04d}_next.sql", NEXT_REVISION)
    assert conn.execute("SELECT to_regclass('replaysafe.next_rows') IS NOT NULL").fetchone() == (True,)
    replaysafe_pg.downgrade(dsn, "0006")  # an undistributed installation downgrades as before
    assert replaysafe_pg.current_revision(dsn) == "0006"


def test_a_table_distributed_otherwise_is_refused(dsn: str, conn: Conn) -> None:
    _script_refuses(
        conn, "INSERT INTO pg_dist_partition VALUES ('replaysafe.threads', 'h', 'thread_id', 7, 's')",
        r"replaysafe\.threads is already a Citus table")


def test_doctor_knows_a_citus_installation(citus_db: str, conn: Conn) -> None:
    report = run_json("doctor", dsn=citus_db)
    assert report["ok"] is True, report
    check = next(c for c in report["checks"] if c["check"] == "Citus distribution")
    assert check["detail"].startswith("every table distributed by tenant")
    # A later migration that put back the plain lookup is noticed.
    definition = conn.execute("SELECT pg_get_viewdef('replaysafe._reader'::regclass)").fetchone()
    assert definition is not None
    plain = re.search(r"CREATE OR REPLACE VIEW replaysafe\._reader AS(.*?);\n", schema.schema_sql(), re.S)
    assert plain is not None
    conn.execute("SET search_path = pg_catalog, pg_temp; CREATE OR REPLACE VIEW replaysafe._reader AS"
                 + plain.group(1))
    report = run_json("doctor", dsn=citus_db, exit_code=1)
    check = next(c for c in report["checks"] if c["check"] == "Citus distribution")
    assert check["ok"] is False and "_reader does not look bindings up per node" in check["detail"]


# --- role bindings on every node -----------------------------------------------------------------

def _oid(conn: Conn, role: str) -> int:
    row = conn.execute("SELECT oid FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    assert row is not None
    return int(row[0])


def _read(dsn: str, role: str, tenant: str) -> int:
    with connect_as(dsn, role) as c, wrap_errors():
        row = c.execute("SELECT version FROM replaysafe.read_thread(p_tenant_id => %s, "
                        "p_thread_id => 'th')", (tenant,)).fetchone()
    assert row is not None
    return int(row[0])


def test_bindings_are_looked_up_per_node_and_fail_closed_until_synced(
        citus_db: str, conn: Conn, make_role: Callable[..., str]) -> None:
    a, b = make_role("replaysafe_worker"), make_role("replaysafe_worker")
    with Threads(citus_db, tenant_id="ta") as th:
        th.write("th", {"n": 1}, 0)
    bind(citus_db, a, "ta")
    bind(citus_db, b, "tb")
    # Bound, not yet synced: no node knows the role, so it acts for nobody.
    with pytest.raises(AccessDenied):
        _read(citus_db, a, "ta")
    assert conn.execute("SELECT replaysafe.citus_sync_role_bindings()").fetchone() == (2,)
    assert _read(citus_db, a, "ta") == 1
    with connect_as(citus_db, a) as c:
        assert c.execute("SELECT tenant_id FROM replaysafe.threads_v").fetchall() == [("ta",)]
    with pytest.raises(AccessDenied):
        _read(citus_db, b, "ta")
    sync_command = _calls(conn, "run_command_on_workers")[-1]["command"]
    assert a in sync_command and b in sync_command

    # The same roles on a worker (group 1), where A's OID happens to be B's OID here.
    conn.execute("INSERT INTO citus_standin.worker_roles VALUES (%s, %s), (%s, %s)",
                 (a, _oid(conn, b), b, 4_000_000_000))
    conn.execute("SELECT replaysafe.citus_sync_role_bindings()")
    rows = conn.execute("SELECT groupid, role_name, role_oid, bound_oid FROM "
                        "replaysafe.role_binding_nodes ORDER BY 1, 2").fetchall()
    assert rows == sorted([(0, a, _oid(conn, a), _oid(conn, a)), (0, b, _oid(conn, b), _oid(conn, b)),
                           (1, a, _oid(conn, b), _oid(conn, a)), (1, b, 4_000_000_000, _oid(conn, b))])
    conn.execute("UPDATE pg_dist_local_group SET groupid = 1")  # evaluate as the worker would
    try:
        # B's OID here is A's there: B must not act for A's tenant, nor A (unknown here) at all.
        with pytest.raises(AccessDenied):
            _read(citus_db, b, "ta")
        with pytest.raises(AccessDenied):
            _read(citus_db, a, "ta")
        with connect_as(citus_db, b) as c:  # nor read it through the views
            assert c.execute("SELECT count(*) FROM replaysafe.threads_v").fetchone() == (0,)
    finally:
        conn.execute("UPDATE pg_dist_local_group SET groupid = 0")
    # Unbinding takes effect on every node at once (the rows join role_bindings).
    conn.execute("SELECT replaysafe.unbind_role(%s)", (a,))
    with pytest.raises(AccessDenied):
        _read(citus_db, a, "ta")


def test_only_the_schema_owner_syncs_bindings(citus_db: str, conn: Conn,
                                             make_role: Callable[..., str]) -> None:
    operator = make_role("replaysafe_operator")
    with connect_as(citus_db, operator) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        c.execute("SELECT replaysafe.citus_sync_role_bindings()")
    # EXECUTE granted by mistake opens nothing: the function checks the owner itself.
    conn.execute(f'GRANT EXECUTE ON FUNCTION replaysafe.citus_sync_role_bindings() TO "{operator}"')
    try:
        with connect_as(citus_db, operator) as c, pytest.raises(AccessDenied), wrap_errors():
            c.execute("SELECT replaysafe.citus_sync_role_bindings()")
    finally:
        conn.execute(f'REVOKE ALL ON FUNCTION replaysafe.citus_sync_role_bindings() FROM "{operator}"')


# --- the driver's calls against Citus's delegation rule -----------------------------------------

BARE = re.compile(r"^SELECT replaysafe\.(\w+)\(.*\)$", re.S)
IN_FROM = re.compile(r"^SELECT \* FROM replaysafe\.(\w+)\(.*\)$", re.S)


def _plan(conn: Conn, query: str, params: dict[str, Any]) -> str:
    return "\n".join(r[0] for r in conn.execute(f"EXPLAIN (VERBOSE, COSTS OFF) {query}", params))


def test_which_driver_calls_citus_can_delegate(conn: Conn) -> None:
    """function_call_delegation.c (Citus 11.0+): a call is delegated when the statement is
    ``SELECT fn(...)`` or ``SELECT ... FROM fn(...)`` (#5693), with no WHERE, outside a
    transaction block, and no argument contains a volatile function — checked on the
    arguments as planned, into which Postgres has put the defaults of those left out. Every
    driver call of a tenant function has a delegable shape; without ``now`` the ledger's
    calls carry ``p_now``'s default, ``clock_timestamp()`` (volatile), and run on the
    coordinator (each statement inside still goes to one shard)."""
    carries_clock = set()
    for name, query in queries.all_queries().items():
        match = BARE.match(query) or IN_FROM.match(query)
        if name not in DELEGATED:
            continue
        assert match is not None and match.group(1) == name, query
        assert " WHERE " not in query
        params = dict.fromkeys(re.findall(r"%\((\w+)\)[sbt]", query))
        params["now"] = datetime(2026, 1, 1, tzinfo=UTC)
        with_now = _plan(conn, queries.get(name, params), params)
        without_now = _plan(conn, queries.get(name, {}), params)
        assert "clock_timestamp()" not in with_now, (name, with_now)
        if "clock_timestamp()" in without_now:
            carries_clock.add(name)
    assert set(queries.all_queries()) >= DELEGATED  # the driver calls every one of them
    assert carries_clock == {"claim_action", "claim_actions", "heartbeat_action", "complete_action",
                             "fail_action", "mark_action_unknown", "resolve_action", "reopen_action"}
