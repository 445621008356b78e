"""One reading of a DSN everywhere: a login whose password holds ``&``, a space, a quote,
``=``, ``%``, ``@``, ``:``, ``/`` and a backslash, on the test server's unix socket, reaches
the database in every spelling through ``migrate``, ``migrate current``, ``doctor``,
``replaysafe_pg.migrate``, the Ledger, the AsyncLedger and Threads.

The embedded test server trusts local logins; the fixture makes it ask *this* role for its
password (a ``scram-sha-256`` line in pg_hba.conf, first match), so a mangled password
fails authentication here exactly as on a production server."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from helpers.cli import run, run_json
from psycopg import conninfo as pg_conninfo
from psycopg import sql
from sqlalchemy.engine import URL, make_url

import replaysafe_pg
from replaysafe_pg import AsyncLedger, InvalidArgument, Ledger, Threads
from replaysafe_pg._dsn import conninfo_params, to_conninfo
from replaysafe_pg.schema import alembic_config, head_revision

PASSWORD = "a&b c'd=e%f@g:h/i\\j"


@pytest.fixture
def password_login(admin_dsn: str, template_db: str,
                   empty_dsn: str) -> Iterator[dict[str, str]]:
    """A LOGIN role that must give PASSWORD (scram-sha-256), allowed to migrate
    ``empty_dsn``: its libpq keywords. (``template_db``: the group roles exist.)"""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        row = c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        hba = Path(str(c.execute("SHOW hba_file").fetchone()[0]))  # type: ignore[index]
    if not (row and row[0]) or not os.access(hba, os.W_OK):
        pytest.skip("needs a superuser on a server whose pg_hba.conf this process may edit")
    params = conninfo_params(empty_dsn)
    role = f"rs_pw_{os.getpid()}"
    original = hba.read_text(encoding="utf-8")
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(PASSWORD)))
        c.execute(f'GRANT CREATE ON DATABASE "{params["dbname"]}" TO {role}'.encode())  # type: ignore[arg-type]
        hba.write_text(f"local all {role} scram-sha-256\nhost all {role} all scram-sha-256\n"
                       + original, encoding="utf-8")
        c.execute("SELECT pg_reload_conf()")
    try:
        yield params | {"user": role, "password": PASSWORD}
    finally:
        hba.write_text(original, encoding="utf-8")
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute("SELECT pg_reload_conf()")
        with psycopg.connect(empty_dsn, autocommit=True) as c:
            c.execute("DROP SCHEMA IF EXISTS replaysafe CASCADE")
            c.execute(f"DROP OWNED BY {role}".encode())  # type: ignore[arg-type]
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f"DROP ROLE {role}".encode())  # type: ignore[arg-type]


def spell(params: dict[str, str], how: str) -> str:
    """The same login as a user would write it in each spelling (socket directory as host)."""
    if how == "key=value":
        return pg_conninfo.make_conninfo("", **params)
    rest = {k: v for k, v in params.items() if k not in ("user", "password", "dbname")}
    if how == "libpq URI":
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in rest.items())
        return (f"postgresql://{quote(params['user'], safe='')}:{quote(params['password'], safe='')}"
                f"@/{quote(params['dbname'], safe='')}?{query}")
    return URL.create(how, username=params["user"], password=params["password"],
                      database=params["dbname"], query=rest).render_as_string(hide_password=False)


SPELLINGS = ["key=value", "libpq URI", "postgresql+psycopg", "postgresql+psycopg2"]


@pytest.mark.parametrize("how", SPELLINGS)
def test_a_hard_password_reaches_the_database_in_every_spelling(
        password_login: dict[str, str], how: str) -> None:
    dsn = spell(password_login, how)
    assert conninfo_params(dsn) == password_login  # read as libpq reads it
    # The server really checks the password: a wrong one is refused.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(pg_conninfo.make_conninfo(to_conninfo(dsn), password="wrong")).close()

    assert run_json("migrate", "current", dsn=dsn)["current"] is None
    migrated = run("migrate", dsn=dsn)
    assert migrated.exit_code == 0, migrated.stderr
    assert run_json("migrate", "current", dsn=dsn)["current"] == head_revision()
    doctor = run("doctor", dsn=dsn)
    assert doctor.exit_code == 0, (doctor.stdout, doctor.stderr)
    replaysafe_pg.migrate(dsn)  # already at head
    assert replaysafe_pg.current_revision(dsn) == head_revision()

    with Ledger(dsn, tenant_id="t") as led:
        assert led.claim("k", "op", {}).outcome == "claimed"
    with Threads(dsn, tenant_id="t") as threads:
        assert threads.write("th", {"n": 1}, expected_version=0) == 1

    async def async_claim() -> str:
        async with AsyncLedger(dsn, tenant_id="t") as led:
            return str((await led.claim("k2", "op", {})).outcome)

    assert asyncio.run(async_claim()) == "claimed"


@pytest.mark.parametrize("how", SPELLINGS)
def test_the_migration_engine_gets_what_libpq_would(how: str) -> None:
    params = {"user": "u", "password": PASSWORD, "dbname": "d b", "host": "/tmp/sock dir",
              "port": "5433", "sslmode": "disable", "options": "-c lock_timeout=5s"}
    # The URL migrate() gives alembic (a text option, read back by SQLAlchemy's parser).
    text = alembic_config(spell(params, how)).get_main_option("sqlalchemy.url")
    assert text is not None
    url = make_url(text)
    _args, kwargs = url.get_dialect()().create_connect_args(url)
    assert {k: str(v) for k, v in kwargs.items()} == params


@pytest.mark.parametrize("dsn", ["postgresql+asyncpg://u@h/d", "mysql+pymysql://u@h/d",
                                 "this is not a dsn"])
def test_a_dsn_libpq_cannot_read_is_refused_up_front(dsn: str) -> None:
    with pytest.raises(InvalidArgument):
        Ledger(dsn, tenant_id="t")
