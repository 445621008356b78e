"""Install and upgrade the ``replaysafe`` schema with alembic.

Three ways in, one implementation:

* ``alembic upgrade head`` with the project's ``alembic.ini`` (``migrations/env.py`` calls
  :func:`run_from_alembic_env`);
* ``replaysafe_pg.migrate(dsn)`` from Python;
* from a user's own alembic ``env.py``: ``replaysafe_pg.migrate_in_env(context)`` inside
  ``context.begin_transaction()``, which follows the alembic command being run (or
  ``replaysafe_pg.migrate(connection)``, which always upgrades).

Our chain keeps its own version table, ``replaysafe.alembic_version``, so it never collides
with an application's alembic history. Every run takes a transaction-scoped advisory lock
first, so any number of processes may migrate one database at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, LiteralString, NamedTuple

# alembic and SQLAlchemy are imported where they are used: importing them costs about a
# second, which every worker process that only needs the driver would pay at start-up.
if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection, Engine

from replaysafe_pg import _sqltree
from replaysafe_pg._dsn import render_url, scrub, sqlalchemy_url
from replaysafe_pg._paths import migrations_dir
from replaysafe_pg.errors import AccessDenied, CitusUnavailable, InvalidArgument, translate

SCHEMA = "replaysafe"
VERSION_TABLE = "alembic_version"
# pg_advisory_xact_lock key: "replaysafe" migrations (any constant works; this one is ours).
MIGRATION_LOCK_KEY = 0x7265706C61797361

def schema_sql() -> str:
    """The whole current schema as one SQL script, assembled from the tree (``sql/``)."""
    return _sqltree.schema_sql()


def citus_sql() -> str:
    """The Citus distribution script (``sql/citus.sql``, docs/scale-out.md): run on a Citus
    coordinator after the migration, by ``migrate(..., citus=True)``."""
    return _sqltree.read("citus.sql")


def citus_revision() -> str:
    """The revision citus.sql was written and reviewed for (its guard refuses any other): a
    new revision must be checked against the Citus script before it can be distributed."""
    import re

    match = re.search(r"v_written_for constant text := '(\d{4})'", citus_sql())
    assert match is not None, "sql/citus.sql: its guard names no revision"
    return match.group(1)


def expected_citus_objects() -> dict[str, set[str]]:
    """What ``citus.sql`` adds to the schema (``doctor`` expects it where Citus is)."""
    import re

    text = citus_sql()
    tables = set(re.findall(r"CREATE TABLE replaysafe\.(\w+)", text))
    return {
        "table": tables,
        "index": {f"{t}_pkey" for t in tables},
        "function": set(re.findall(r"CREATE OR REPLACE FUNCTION replaysafe\.(\w+)\(", text)),
    }


def citus_layout() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tables citus.sql makes reference tables, and those it distributes by tenant_id
    (co-located with replaysafe.actions, the first), as the script lists them."""
    import re

    lists = re.findall(r"FOREACH t IN ARRAY ARRAY\[(.*?)\] LOOP", citus_sql(), re.S)
    reference, distributed = (tuple(re.findall(r"'(\w+)'", x)) for x in lists)
    return reference, distributed


def expected_objects() -> dict[str, set[str]]:
    """What the migration creates in the schema, by kind (read from the tree, ``sql/``):
    ``doctor`` reports anything else, and every function name is expected once."""
    import re

    text = schema_sql()
    tables = set(re.findall(r"CREATE TABLE replaysafe\.(\w+)", text)) | {VERSION_TABLE}
    indexes = (set(re.findall(r"CREATE INDEX (\w+)\s+ON replaysafe\.", text))
               | {f"{t}_pkey" for t in tables - {VERSION_TABLE}} | {f"{VERSION_TABLE}_pkc"})
    return {
        "table": tables,
        "view": set(re.findall(r"CREATE (?:OR REPLACE )?VIEW replaysafe\.(\w+)", text)),
        "index": indexes,
        "function": set(re.findall(r"CREATE (?:OR REPLACE )?FUNCTION replaysafe\.(\w+)\(", text)),
        "type": set(re.findall(r"CREATE TYPE replaysafe\.(\w+)", text)),
    }


def expected_grants() -> set[tuple[str, str, str]]:
    """``(kind, name, grantee)`` of every privilege ``sql/grants.sql`` grants: EXECUTE on a
    function to a group role, SELECT on a view, USAGE on the schema."""
    import re

    text = _sqltree.read("grants.sql")
    block = text[text.index("DO $grants$"):]
    grants: set[tuple[str, str, str]] = set()
    rows = re.findall(r"\(\d+, '(replaysafe_\w+)',\s*ARRAY\[(.*?)\],\s*ARRAY\[(.*?)\]\)", block, re.S)
    for role, functions, views in rows:
        grants |= {("function", n, role) for n in re.findall(r"'(\w+)'", functions)}
        grants |= {("view", n, role) for n in re.findall(r"'(\w+)'", views)}
        grants.add(("schema", SCHEMA, role))
    return grants


def alembic_config(dsn: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if dsn:
        # "%%": the option is read through configparser's interpolation.
        cfg.set_main_option("sqlalchemy.url", render_url(sqlalchemy_url(dsn)).replace("%", "%%"))
    return cfg


# On a distributed installation (citus.sql ran: its role_binding_nodes table exists, or a
# replaysafe table is in Citus's pg_dist_partition) no revision script runs, up or down: a
# script re-creates objects as a single node has them — _caller and _reader with bindings
# looked up by role OID, which on a worker node is another role's OID (a worker bound there
# would act as whichever role has that OID) — and classifies no new table for Citus.
# Upgrading a distributed installation needs a release that does it together with citus.sql
# and was tried on a cluster; until then it is refused before anything changes. Prepended to
# every revision script, online and offline (the inner IF is planned only where Citus's
# catalog exists).
CITUS_MIGRATION_GUARD_SQL = """DO $citus_guard$
DECLARE
    v_distributed boolean := pg_catalog.to_regclass('replaysafe.role_binding_nodes') IS NOT NULL;
BEGIN
    IF NOT v_distributed AND pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        v_distributed := EXISTS (
            SELECT 1 FROM pg_catalog.pg_dist_partition p
            JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.logicalrelid::pg_catalog.oid
            JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
            WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe'::pg_catalog.name);
    END IF;
    IF v_distributed THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = pg_catalog.concat(
            'replaysafe is distributed with Citus (docs/scale-out.md): {step} is refused, ',
            'nothing was changed');
    END IF;
END
$citus_guard$;
"""


def citus_migration_guard(name: str) -> str:
    """The guard that runs before the revision script ``name`` (``NNNN_x.sql`` or
    ``NNNN_x.down.sql``): it refuses a Citus-distributed installation."""
    revision = name.split("_", 1)[0]
    step = (f"downgrading revision {revision}" if name.endswith(".down.sql")
            else f"upgrading to revision {revision}")
    return CITUS_MIGRATION_GUARD_SQL.replace("{step}", step.replace("'", "''"))


def run_revision_sql(revision_file: str, name: str, connection: Connection | None) -> None:
    """Run a revision's SQL file whole (revisions 0001-0009: their files carry every function
    body they change): on ``connection``, or through alembic's ``op`` (offline); on a
    Citus-distributed installation, only what :func:`citus_migration_guard` allows."""
    _execute_step(citus_migration_guard(name) + (
        Path(revision_file).resolve().parent / name).read_text(encoding="utf-8"), connection)


def run_revision(revision_file: str, name: str, connection: Connection | None, *,
                 arrives_at: str) -> None:
    """One step of a revision from 0010 on: its DDL file ``name`` (tables, indexes, dropped
    signatures, data; no function body), then the function set of the revision the step
    arrives at — the revision itself when upgrading, its predecessor when downgrading
    (``replaysafe_pg._sqltree``). One script, so the Citus guard refuses it whole."""
    ddl = (Path(revision_file).resolve().parent / name).read_text(encoding="utf-8")
    _execute_step(citus_migration_guard(name) + ddl.rstrip("\n") + "\n\n"
                  + _sqltree.function_set_of(arrives_at, head_revision()), connection)


def _execute_step(sql: str, connection: Connection | None) -> None:
    if connection is None:
        import sqlalchemy as sa
        from alembic import op

        op.execute(sa.text(sql.replace(":", r"\:")))
        return
    execute_script(connection, sql)


def execute_script(connection: Connection, sql: str) -> None:
    """Run a script of several statements (no parameters) on whatever DBAPI connection
    alembic handed out: psycopg 3 or psycopg2, or — inside an async env's ``run_sync`` —
    psycopg's AsyncConnection or asyncpg, whose coroutines are awaited here. (A coroutine
    left un-awaited ran nothing while alembic recorded the revision.)"""
    import inspect

    import sqlalchemy as sa

    # Through SQLAlchemy first, so the DBAPI has begun the migration's transaction (asyncpg's
    # adapter begins it only then): the script must not run outside it, in transactions of
    # its own that the version row would not share.
    connection.execute(sa.text("SELECT 1"))
    driver_conn = connection.connection.driver_connection
    assert driver_conn is not None
    execute = getattr(driver_conn, "execute", None)
    if execute is None:  # psycopg2: statements go through a cursor (no parameters: no % parsing)
        with driver_conn.cursor() as cur:
            cur.execute(sql)
        return
    result = execute(sql)  # without parameters: the simple-query protocol, several statements
    if inspect.isawaitable(result):
        from sqlalchemy.util import await_only

        await_only(result)


# Run before any revision, in the migration's transaction: take the migration lock, resolve
# every name in pg_catalog first (a hostile overload in public must not run as the migrating
# role; the caller's search_path is restored afterwards), and create the schema — or refuse
# one that the migration did not create or that another role owns (a squatter's function
# would otherwise later run as the owner).
PREPARE_SQL = f"""
SELECT pg_catalog.pg_advisory_xact_lock({MIGRATION_LOCK_KEY});
SELECT pg_catalog.set_config('replaysafe.outer_search_path', pg_catalog.current_setting('search_path'), true);
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
DO $guard$
DECLARE
    v_owner oid;
    v_me    oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user);
BEGIN
    SELECT n.nspowner INTO v_owner FROM pg_catalog.pg_namespace n WHERE n.nspname = '{SCHEMA}';
    IF NOT FOUND THEN
        CREATE SCHEMA {SCHEMA};
        RETURN;
    END IF;
    IF v_owner <> v_me THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = pg_catalog.format(
            'schema {SCHEMA} is owned by role %s, not by %s: migrate as its owner, or drop a '
            'schema that replaysafe_pg did not create', v_owner::pg_catalog.regrole, current_user);
    END IF;
    IF pg_catalog.to_regclass('{SCHEMA}.{VERSION_TABLE}') IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42P06', MESSAGE =
            'schema {SCHEMA} exists but replaysafe_pg''s migration did not create it '
            '(it has no {SCHEMA}.{VERSION_TABLE}): refusing to install into it';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relnamespace = '{SCHEMA}'::pg_catalog.regnamespace
                 AND c.relowner <> v_owner
               UNION ALL
               SELECT 1 FROM pg_catalog.pg_proc p WHERE p.pronamespace = '{SCHEMA}'::pg_catalog.regnamespace
                 AND p.proowner <> v_owner
               UNION ALL
               SELECT 1 FROM pg_catalog.pg_type t WHERE t.typnamespace = '{SCHEMA}'::pg_catalog.regnamespace
                 AND t.typowner <> v_owner
               UNION ALL
               SELECT 1 FROM pg_catalog.pg_operator o
               WHERE o.oprnamespace = '{SCHEMA}'::pg_catalog.regnamespace AND o.oprowner <> v_owner) THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE =
            'schema {SCHEMA} holds objects owned by another role than its owner: refusing to '
            'migrate (run `replaysafe-pg doctor` to list them)';
    END IF;
END
$guard$;
"""

RESTORE_SQL = ("SELECT pg_catalog.set_config('search_path', "
               "pg_catalog.current_setting('replaysafe.outer_search_path'), true)")


def _lock_and_prepare(connection: Connection) -> None:
    execute_script(connection, PREPARE_SQL)


def _restore(connection: Connection) -> None:
    """After our revisions, in their transaction: check that the head revision recorded
    means the head schema installed (a version row without the functions must be
    impossible: it would make every later migrate a no-op), then give the caller back its
    search_path."""
    import sqlalchemy as sa

    row = connection.execute(sa.text(
        f"SELECT version_num FROM {SCHEMA}.{VERSION_TABLE}")).first()
    if row is not None and row[0] == head_revision():
        installed = {r[0] for r in connection.execute(sa.text(
            "SELECT p.proname::text FROM pg_catalog.pg_proc p "
            "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace "
            f"WHERE n.nspname = '{SCHEMA}'"))}
        missing = expected_objects()["function"] - installed
        if missing:
            raise RuntimeError(
                f"replaysafe_pg: the migration recorded revision {row[0]} but the schema lacks "
                f"{len(missing)} function(s) ({', '.join(sorted(missing)[:5])}...): nothing is "
                "committed; please report this with your alembic env.py")
    connection.execute(sa.text(RESTORE_SQL))


def _context_opts() -> dict[str, Any]:
    return {
        "version_table": VERSION_TABLE,
        "version_table_schema": SCHEMA,
        "transaction_per_migration": False,
    }


def _script() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def _steps_fn(script: Any, destination: str, *, downgrade: bool) -> Any:
    def steps(rev: Any, _context: Any) -> Any:
        if downgrade:
            return script._downgrade_revs(destination, rev)
        return script._upgrade_revs(destination, rev)
    return steps


def _run(connection: Connection, destination: str, *, downgrade: bool) -> None:
    from alembic.runtime.migration import MigrationContext

    script = _script()
    opts = _context_opts() | {"script": script,
                              "fn": _steps_fn(script, destination, downgrade=downgrade)}
    # No alembic EnvironmentContext here: it installs module-level proxies that would
    # clobber the caller's own alembic env when we run inside it.
    ctx = MigrationContext.configure(connection, opts=opts)
    _lock_and_prepare(connection)
    ctx.run_migrations(connection=connection)
    _restore(connection)


@contextlib.contextmanager
def _connection(target: str | Connection | Engine) -> Iterator[Connection]:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection, Engine

    with _privilege_errors():
        if isinstance(target, Connection):
            if target.in_transaction():
                yield target
            else:
                with target.begin():
                    yield target
            return
        if isinstance(target, Engine):
            with target.begin() as conn:
                yield conn
            return
        try:
            engine = sa.create_engine(sqlalchemy_url(target), poolclass=sa.NullPool)
        except Exception as exc:
            scrub(exc, target)  # what the URL quotes, never the password
            raise
        try:
            with engine.begin() as conn:
                yield conn
        except Exception as exc:
            # A refused connection quotes its host, user, database: never the password.
            scrub(exc, target)
            raise
        finally:
            engine.dispose()


@contextlib.contextmanager
def _privilege_errors() -> Iterator[None]:
    """A missing privilege reaches the caller as :class:`AccessDenied` (its message says
    which), the Citus guard's refusal as :class:`CitusUnavailable`, not as SQLAlchemy's
    wrapper of the DBAPI's error."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    try:
        yield
    except (DBAPIError, psycopg.Error) as exc:
        # Scripts run on the DBAPI connection itself: its errors arrive unwrapped.
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(orig, psycopg.Error) and orig.sqlstate == "42501":
            domain = translate(orig)
            if domain is not None:
                raise domain from exc
        if isinstance(orig, psycopg.Error) and orig.sqlstate == "55000" and \
                "is distributed with Citus" in (orig.diag.message_primary or ""):
            raise CitusUnavailable(orig.diag.message_primary or str(orig)) from exc
        raise


# --- the installed revision, for every role -----------------------------------------------------

# Which way the installed revision may be read by the current role, from the catalogs alone
# (they need no privilege): replaysafe.installed_revision() (0004 on; EXECUTE for the group
# roles and the owner), else the version table (the owner, before 0004). NULL: not there.
# Sent on any role's connection, whatever its search_path: every name is qualified
# (tests/unit/test_qualified_statements.py).
REVISION_PROBE_SQL: LiteralString = (
    "SELECT (SELECT pg_catalog.has_schema_privilege(p.pronamespace, 'USAGE') "
    "AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE') "
    "FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n "
    "ON n.oid OPERATOR(pg_catalog.=) p.pronamespace "
    "WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe' "
    "AND p.proname OPERATOR(pg_catalog.=) 'installed_revision' "
    "AND p.pronargs OPERATOR(pg_catalog.=) 0), "
    "(SELECT pg_catalog.has_schema_privilege(c.relnamespace, 'USAGE') "
    "AND pg_catalog.has_table_privilege(c.oid, 'SELECT') "
    "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
    "ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
    "WHERE n.nspname OPERATOR(pg_catalog.=) 'replaysafe' "
    "AND c.relname OPERATOR(pg_catalog.=) 'alembic_version' "
    "AND c.relkind OPERATOR(pg_catalog.=) 'r')")
REVISION_BY_FUNCTION_SQL: LiteralString = "SELECT replaysafe.installed_revision()"
REVISION_BY_TABLE_SQL: LiteralString = "SELECT version_num::pg_catalog.text FROM replaysafe.alembic_version"


def read_revision(fetch: Callable[[LiteralString], Any]) -> str | None:
    """The installed revision (None: never migrated, or downgraded to base), read the way
    the current role may. ``fetch(sql)`` runs one query and returns its first row (or
    None), on any connection. Raises :class:`AccessDenied` for a role that may read it
    neither way (not a member of a replaysafe role, not the owner)."""
    by_function, by_table = fetch(REVISION_PROBE_SQL)
    if by_function:
        row = fetch(REVISION_BY_FUNCTION_SQL)
    elif by_table:
        row = fetch(REVISION_BY_TABLE_SQL)
    elif by_function is None and by_table is None:
        return None
    else:
        raise AccessDenied(
            "access denied: this role may not read the installed replaysafe revision: grant "
            "it replaysafe_worker, replaysafe_auditor or replaysafe_operator (and migrate to "
            "0004 or later, which gives them replaysafe.installed_revision()), or connect as "
            "the schema owner")
    return None if row is None or row[0] is None else str(row[0])


def _revision_on(connection: Connection) -> str | None:
    import sqlalchemy as sa

    return read_revision(lambda sql: connection.execute(sa.text(sql)).first())


def current_revision(target: str | Connection | Engine) -> str | None:
    """The installed revision, or None when the schema was never migrated. Any role that
    may use replaysafe can ask (through ``replaysafe.installed_revision()``); the owner can
    ask a database of any revision."""
    with _connection(target) as conn:
        return _revision_on(conn)


# --- upgrade and downgrade ---------------------------------------------------------------------

def _resolved(revision: str) -> str:
    return head_revision() if revision in ("head", "heads") else revision


def migrate(target: str | Connection | Engine, revision: str = "head", *,
            citus: bool = False, shard_count: int | None = None) -> None:
    """Upgrade the ``replaysafe`` schema to ``revision`` (default: the newest), in one
    transaction. ``target`` is a DSN, a SQLAlchemy engine or connection.

    When the schema is already at ``revision``, nothing is locked or written: any role that
    may read the revision (a worker, say, with the application's own DSN) may call it.

    ``citus=True`` (a Citus coordinator, as the schema owner; docs/scale-out.md): then, in a
    second transaction, distribute the schema by tenant (``sql/citus.sql``; it
    skips what is distributed already). Once distributed, an installation takes no revision
    script, up or down (:func:`citus_migration_guard`). A database without
    the ``citus`` extension is refused with :class:`CitusUnavailable` before anything is
    written. ``shard_count``: the shards of a table distributed now (default: the server's
    ``citus.shard_count``)."""
    if shard_count is not None and (isinstance(shard_count, bool) or not isinstance(shard_count, int)
                                    or not 1 <= shard_count <= 64000):
        raise InvalidArgument(f"invalid argument shard_count: must be an integer from 1 to 64000 "
                              f"(got {shard_count!r})")
    if citus:
        with _connection(target) as conn:
            _require_citus(conn)
    with _connection(target) as conn:
        try:
            at_target = _revision_on(conn) == _resolved(revision)
        except AccessDenied:
            at_target = False  # not even the revision: the migration itself says what is missing
        if not at_target:
            _run(conn, revision, downgrade=False)
    if citus:
        with _connection(target) as conn:
            _distribute(conn, shard_count)


# Sent before the migration's transaction pins its search_path: every name is qualified.
CITUS_VERSION_SQL: LiteralString = ("SELECT e.extversion FROM pg_catalog.pg_extension e "
                                    "WHERE e.extname OPERATOR(pg_catalog.=) 'citus'")


def _require_citus(connection: Connection) -> None:
    import sqlalchemy as sa

    version = connection.execute(sa.text(CITUS_VERSION_SQL)).scalar()
    if version is None:
        raise CitusUnavailable(
            "the citus extension is not installed in this database: replaysafe's Citus "
            "distribution needs a Citus coordinator (CREATE EXTENSION citus); nothing was "
            "changed (docs/scale-out.md)")


def _distribute(connection: Connection, shard_count: int | None) -> None:
    """citus.sql in the connection's transaction, under the migration lock; its guard's
    refusals (SQLSTATE 55000) reach the caller as :class:`CitusUnavailable`."""
    import psycopg
    import sqlalchemy as sa
    from sqlalchemy.exc import DBAPIError

    # The migration lock, and the caller's search_path kept (citus.sql pins its own).
    connection.execute(sa.text(
        f"SELECT pg_catalog.pg_advisory_xact_lock({MIGRATION_LOCK_KEY}), pg_catalog.set_config("
        "'replaysafe.outer_search_path', pg_catalog.current_setting('search_path'), true)"))
    if shard_count is not None:
        connection.execute(sa.text("SELECT pg_catalog.set_config('citus.shard_count', :n, true)"),
                           {"n": str(shard_count)})
    try:
        execute_script(connection, citus_sql())
    except (DBAPIError, psycopg.Error) as exc:
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(orig, psycopg.Error) and orig.sqlstate == "55000":
            message = orig.diag.message_primary or str(orig)
            raise CitusUnavailable(f"{message}; nothing was changed") from exc
        raise
    connection.execute(sa.text(RESTORE_SQL))


def downgrade(target: str | Connection | Engine, revision: str) -> None:
    """Downgrade to ``revision``, which must be given: ``"base"`` removes every replaysafe
    object (and all its data) but the schema and its then empty version table."""
    with _connection(target) as conn:
        _run(conn, revision, downgrade=True)


class Revision(NamedTuple):
    revision: str
    name: str  # the file's stem, e.g. 0002_threads
    drops: tuple[str, ...]  # the tables (with their rows) its downgrade drops


def revisions() -> list[Revision]:
    """The chain, oldest first."""
    import re

    chain = []
    for s in reversed(list(_script().walk_revisions())):
        path = Path(s.path)
        down = (path.parent / f"{path.stem}.down.sql").read_text(encoding="utf-8")
        tables = re.findall(r"DROP TABLE (?:IF EXISTS )?([\w., ]+)", down)
        chain.append(Revision(s.revision, path.stem, tuple(
            t.strip() for group in tables for t in group.split(","))))
    return chain


def undone_by(current: str | None, target: str) -> list[Revision]:
    """The revisions (newest first) that going from ``current`` to ``target`` undoes: empty
    unless ``target`` is older than ``current``."""
    chain = revisions()
    order = [r.revision for r in chain]
    if current not in order or (target != "base" and target not in order):
        return []
    stop = -1 if target == "base" else order.index(target)
    return list(reversed(chain[stop + 1:order.index(current) + 1]))


def head_revision() -> str:
    head = _script().get_current_head()
    assert head is not None
    return str(head)


# --- from a user's own alembic env ---------------------------------------------------------------

X_ARGUMENT = "replaysafe"


def _alembic_command(migration_context: Any) -> str | None:
    """The alembic command an env runs under, from the step function alembic gave it (each
    command defines its own inside itself: ``upgrade.<locals>.upgrade``)."""
    name = getattr(migration_context.opts.get("fn"), "__qualname__", "")
    command, sep, _rest = name.partition(".<locals>.")
    return command if sep else None


def migrate_in_env(context: Any) -> None:
    """Bring replaysafe along with the command a user's alembic ``env.py`` runs. Call it
    inside ``with context.begin_transaction():``, before ``context.run_migrations()``, in
    online and offline mode alike (``context`` is ``alembic.context``).

    * ``alembic upgrade ...``: replaysafe is upgraded to its head in your migration's
      transaction (with ``--sql``: its SQL is printed with yours, from nothing, or from
      ``-x replaysafe=FROM:head``);
    * ``-x replaysafe=REV`` with ``alembic upgrade`` or ``alembic downgrade``: replaysafe
      moves to ``REV``, up or down — the one way to downgrade it from your env;
    * any other command (``current``, ``check``, ``history``, ``stamp``, ``downgrade``
      without ``-x replaysafe``...) leaves replaysafe alone.
    """
    migration_context = context.get_context()
    command = _alembic_command(migration_context)
    wanted = context.get_x_argument(as_dictionary=True).get(X_ARGUMENT)
    if command != "upgrade" and not (command == "downgrade" and wanted):
        return
    if migration_context.as_sql:
        _print_sql(migration_context, wanted or "head", command)
        return
    target = wanted or "head"
    with _connection(migration_context.connection) as conn:
        current = _revision_on(conn)
        if undone_by(current, target):
            _run(conn, target, downgrade=True)
        elif current != _resolved(target):
            _run(conn, target, downgrade=False)


def _print_sql(user_context: Any, spec: str, command: str) -> None:
    """Offline: our revisions' SQL into the user's script (its output buffer, inside its
    BEGIN ... COMMIT). ``spec`` is ``TO`` or ``FROM:TO`` (alembic's own notation)."""
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext
    from alembic.util import CommandError

    start, _sep, destination = spec.rpartition(":")
    down = bool(undone_by(start or None, _resolved(destination)))
    if (command == "downgrade" or destination == "base") and not down:
        raise CommandError(f"replaysafe_pg: an offline downgrade needs the revision it starts "
                           f"from: -x {X_ARGUMENT}=FROM:{destination}")
    script = _script()
    opts = _context_opts() | {
        "script": script, "fn": _steps_fn(script, destination, downgrade=down), "as_sql": True,
        "literal_binds": True, "output_buffer": user_context.output_buffer,
        "starting_rev": start or None, "destination_rev": destination}
    ours = MigrationContext.configure(dialect_name="postgresql",
                                      dialect_opts={"paramstyle": "named"}, opts=opts)
    ours.execute(PREPARE_SQL.replace(":", r"\:"))
    # Our revisions run their SQL through alembic.op: bound to our context while they run
    # (the user's run_migrations binds it to theirs afterwards).
    with Operations.context(ours):
        ours.run_migrations()
    ours.execute(RESTORE_SQL)


def run_from_alembic_env(context: Any) -> None:
    """Body of ``migrations/env.py`` (``alembic upgrade head`` with our alembic.ini)."""
    import sqlalchemy as sa

    config = context.config
    dsn = (context.get_x_argument(as_dictionary=True).get("dsn")
           or os.environ.get("REPLAYSAFE_DSN")
           or config.get_main_option("sqlalchemy.url"))
    if context.is_offline_mode():
        # Printing the SQL needs only the dialect, never a database. The "named" paramstyle
        # keeps "%" in function bodies as written (pyformat would print "%%").
        context.configure(url=sqlalchemy_url(dsn) if dsn else "postgresql+psycopg://",
                          literal_binds=True, dialect_opts={"paramstyle": "named"},
                          **_context_opts())
        with context.begin_transaction():
            # The printed script is as safe to run from several places at once as migrate().
            context.execute(PREPARE_SQL.replace(":", r"\:"))
            context.run_migrations()
            context.execute(RESTORE_SQL)
        return
    if not dsn:
        raise SystemExit("no database: pass -x dsn=..., set REPLAYSAFE_DSN or sqlalchemy.url")
    try:
        engine = sa.create_engine(sqlalchemy_url(dsn), poolclass=sa.NullPool)
    except Exception as exc:
        scrub(exc, dsn)
        raise
    try:
        with engine.connect() as conn:
            context.configure(connection=conn, **_context_opts())
            with context.begin_transaction():
                _lock_and_prepare(conn)
                context.run_migrations(connection=conn)
                _restore(conn)
    except Exception as exc:
        scrub(exc, dsn)
        raise
    finally:
        engine.dispose()
