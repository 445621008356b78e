"""replaysafe inside a user's own alembic env, following docs/migrations.md's recipe: it
follows the alembic command being run (upgrade upgrades it, offline ``--sql`` prints it,
``current``/``check``/``history``/``downgrade`` leave it alone) and is downgraded only when
``-x replaysafe=REV`` says so."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from test_migrations import (
    USER_REVISION,
    alembic,
    pg_tool,
    schema_dump,
    user_url,
    versions,
)

import replaysafe_pg
from replaysafe_pg.schema import head_revision

# docs/migrations.md, "From your own alembic env.py": the env of `alembic init`, with the
# one line the recipe adds (and a MetaData for `alembic check`).
SYNC_ENV = '''
from alembic import context
import sqlalchemy as sa

import replaysafe_pg

url = context.get_x_argument(as_dictionary=True).get("dsn", "postgresql+psycopg://")
target_metadata = sa.MetaData()
sa.Table("widgets", target_metadata, sa.Column("id", sa.Integer, primary_key=True))


def run_migrations_offline():
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True,
                      dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        replaysafe_pg.migrate_in_env(context)
        context.run_migrations()


def run_migrations_online():
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            replaysafe_pg.migrate_in_env(context)
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
'''

# `alembic init -t async`, with the recipe's line in do_run_migrations (inside run_sync).
ASYNC_ENV = '''
import asyncio

from alembic import context
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import replaysafe_pg

url = context.get_x_argument(as_dictionary=True)["dsn"]
target_metadata = sa.MetaData()
sa.Table("widgets", target_metadata, sa.Column("id", sa.Integer, primary_key=True))


def do_run_migrations(connection):
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        replaysafe_pg.migrate_in_env(context)
        context.run_migrations()


async def main():
    engine = create_async_engine(url, poolclass=sa.NullPool)
    async with engine.connect() as connection:
        await connection.run_sync(do_run_migrations)
    await engine.dispose()


asyncio.run(main())
'''


def user_env(tmp_path: Path, env: str) -> Path:
    (tmp_path / "versions").mkdir()
    (tmp_path / "env.py").write_text(textwrap.dedent(env))
    (tmp_path / "script.py.mako").write_text("")
    (tmp_path / "versions" / "u0001_widgets.py").write_text(textwrap.dedent(USER_REVISION))
    ini = tmp_path / "alembic.ini"
    ini.write_text(f"[alembic]\nscript_location = {tmp_path}\n")
    return ini


def user_alembic(ini: Path, *args: str, url: str | None = None,
                 ok: bool = True) -> subprocess.CompletedProcess[str]:
    xs = ["-x", f"dsn={url}"] if url else []
    done = alembic("-c", str(ini), *xs, *args, cwd=ini.parent)
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def widgets(dsn: str) -> bool:
    with psycopg.connect(dsn) as c:
        return c.execute("SELECT to_regclass('public.widgets') IS NOT NULL").fetchone() == (True,)


@pytest.mark.parametrize(("driver", "env"), [("psycopg", SYNC_ENV), ("psycopg2", SYNC_ENV),
                                             ("asyncpg", ASYNC_ENV)])
def test_only_upgrade_moves_replaysafe_and_x_replaysafe_downgrades_it(
        tmp_path: Path, empty_dsn: str, driver: str, env: str) -> None:
    ini, url = user_env(tmp_path, env), user_url(empty_dsn, driver)
    head = head_revision()
    # Inspect-only commands on an empty database install nothing.
    user_alembic(ini, "current", url=url)
    user_alembic(ini, "history", "--indicate-current", url=url)
    assert replaysafe_pg.current_revision(empty_dsn) is None
    user_alembic(ini, "upgrade", "head", url=url)
    assert replaysafe_pg.current_revision(empty_dsn) == head
    assert versions(empty_dsn, "public.alembic_version") == ["u0001"]
    # An older replaysafe stays older under every command but upgrade ...
    replaysafe_pg.downgrade(empty_dsn, "0003")
    user_alembic(ini, "current", url=url)
    user_alembic(ini, "check", url=url)  # the user's chain is at head and matches its models
    user_alembic(ini, "history", "--indicate-current", url=url)
    user_alembic(ini, "stamp", "u0001", url=url)
    assert replaysafe_pg.current_revision(empty_dsn) == "0003"
    # ... and downgrading the user's own chain downgrades only that chain.
    user_alembic(ini, "downgrade", "base", url=url)
    assert versions(empty_dsn, "public.alembic_version") == [] and not widgets(empty_dsn)
    assert replaysafe_pg.current_revision(empty_dsn) == "0003"
    # Downgrading replaysafe from the user's env: said explicitly with -x replaysafe=REV.
    user_alembic(ini, "-x", "replaysafe=0002", "downgrade", "base", url=url)
    assert replaysafe_pg.current_revision(empty_dsn) == "0002"
    user_alembic(ini, "-x", "replaysafe=base", "downgrade", "base", url=url)
    assert replaysafe_pg.current_revision(empty_dsn) is None
    user_alembic(ini, "upgrade", "head", url=url)
    assert replaysafe_pg.current_revision(empty_dsn) == head and widgets(empty_dsn)
    user_alembic(ini, "-x", "replaysafe=0003", "upgrade", "head", url=url)  # said: down
    assert replaysafe_pg.current_revision(empty_dsn) == "0003"


def test_offline_sql_from_a_users_env_includes_replaysafe(
        tmp_path: Path, empty_dsn: str, new_db: Callable[[], str]) -> None:
    migrated = new_db()
    replaysafe_pg.migrate(migrated)
    ini = user_env(tmp_path, SYNC_ENV)
    done = user_alembic(ini, "upgrade", "head", "--sql")  # no database at all
    script = done.stdout
    assert "CREATE FUNCTION replaysafe.claim_action(" in script
    assert "CREATE TABLE widgets" in script
    assert script.count("BEGIN;") == 1 and script.rstrip().endswith("COMMIT;")
    applied = subprocess.run([pg_tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                              f"--dbname={empty_dsn}"], input=script, text=True,
                             capture_output=True, timeout=120)
    assert applied.returncode == 0, applied.stderr
    assert schema_dump(empty_dsn) == schema_dump(migrated)  # what migrate() builds
    assert versions(empty_dsn) == [head_revision()]
    assert versions(empty_dsn, "public.alembic_version") == ["u0001"]


def test_offline_sql_of_a_users_env_from_a_given_replaysafe_revision(tmp_path: Path) -> None:
    ini = user_env(tmp_path, SYNC_ENV)
    newest = user_alembic(ini, "-x", "replaysafe=0003:head", "upgrade", "head", "--sql").stdout
    assert "CREATE FUNCTION replaysafe.installed_revision()" in newest
    assert "CREATE TABLE replaysafe.actions" not in newest  # 0001 is not run again
    down = user_alembic(ini, "-x", "replaysafe=0004:0003", "downgrade", "u0001:base",
                        "--sql").stdout
    assert "DROP FUNCTION replaysafe.installed_revision()" in down
    assert "DROP TABLE widgets" in down
    # Offline, the installed revision is unknown: a downgrade must say where it starts.
    vague = user_alembic(ini, "-x", "replaysafe=0003", "downgrade", "u0001:base", "--sql",
                         ok=False)
    assert vague.returncode != 0 and "FROM:0003" in vague.stdout + vague.stderr
    nothing = user_alembic(ini, "downgrade", "u0001:base", "--sql").stdout
    assert "replaysafe" not in nothing
