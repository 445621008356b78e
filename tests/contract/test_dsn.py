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
import traceback
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


# --- errors about a DSN never show its password --------------------------------------------

# Each DSN holds the password "Hunter2" + "Xyzzy9" (the pieces a mistake may split apart),
# spelled wrongly in a way that fails: while it is read, or while connecting.
BAD_PASSWORDS = {
    "URI, bad percent escape": "postgresql://u:Hunter2%zzXyzzy9@localhost/db",
    "URI, bad percent escape in the query": "postgresql://u@localhost/db?password=Hunter2%zzXyzzy9",
    "URI, space": "postgresql://u:Hunter2 Xyzzy9@localhost/db",
    "URI, unescaped @": "postgresql://u:Hunter2@Xyzzy9@nohost.invalid/db",
    "URI, unescaped /": "postgresql://u:Hunter2/Xyzzy9@nohost.invalid/db",
    "URI, unclosed IPv6 bracket (the URI is quoted whole)": "postgresql://u:Hunter2Xyzzy9@[::1/db",
    "key=value, unquoted space": "host=localhost password=Hunter2 Xyzzy9",
    "key=value, unquoted space and =": "host=localhost password=Hunter2 Xyzzy9=1",
    "key=value, quote closed too early": "host=localhost password='Hunter2' Xyzzy9",
    "key=value, unterminated quote": "host=localhost password='Hunter2 Xyzzy9",
    "key=value, escaped quote": "host=localhost password='Hunter2\\' Xyzzy9",
    "key=value, spaces around =": "host=localhost password = Hunter2 Xyzzy9 dbname=d",
    "key=value, sslpassword": "host=localhost sslpassword=Hunter2 Xyzzy9",
    "SQLAlchemy, unescaped @": "postgresql+psycopg://u:Hunter2@Xyzzy9@nohost.invalid/db",
    "SQLAlchemy, unescaped /": "postgresql+psycopg://u:Hunter2/Xyzzy9@nohost.invalid/db",
    "SQLAlchemy, unescaped @ and :": "postgresql+psycopg://u:Hunter2@h:Xyzzy9@h/db",
    "SQLAlchemy, unclosed IPv6 bracket": "postgresql+psycopg://u:Hunter2Xyzzy9@[::1/db",
}
PIECES = ("Hunter2", "Xyzzy9", "unter2", "yzzy9")


def shows_no_password(text: str) -> None:
    for piece in PIECES:
        assert piece not in text, (piece, text)


def everything_said(exc: BaseException) -> str:
    """An exception as a traceback prints it, with every exception it was raised from, and
    the arguments of each."""
    said = ["".join(traceback.format_exception(exc))]
    seen: BaseException | None = exc
    while seen is not None:
        said.append(repr(seen.args))
        said.append(str(getattr(seen, "pgconn", None) and seen.pgconn.error_message))  # type: ignore[attr-defined]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(said)


@pytest.mark.parametrize("dsn", BAD_PASSWORDS.values(), ids=BAD_PASSWORDS.keys())
def test_the_driver_never_shows_a_password_it_could_not_use(dsn: str) -> None:
    with pytest.raises(replaysafe_pg.ReplaysafeError) as info, Ledger(dsn, tenant_id="t") as led:
        led.get("k")
    assert isinstance(info.value, InvalidArgument | replaysafe_pg.DatabaseUnavailable)
    shows_no_password(everything_said(info.value))


@pytest.mark.parametrize("dsn", BAD_PASSWORDS.values(), ids=BAD_PASSWORDS.keys())
def test_the_async_driver_and_migrate_never_show_a_password(dsn: str) -> None:
    async def claim() -> None:
        async with AsyncLedger(dsn, tenant_id="t") as led:
            await led.get("k")

    with pytest.raises(replaysafe_pg.ReplaysafeError) as info:
        asyncio.run(claim())
    shows_no_password(everything_said(info.value))
    with pytest.raises(Exception) as migrating:
        replaysafe_pg.current_revision(dsn)
    shows_no_password(everything_said(migrating.value))


@pytest.mark.parametrize("dsn", BAD_PASSWORDS.values(), ids=BAD_PASSWORDS.keys())
@pytest.mark.parametrize("command", [("actions", "list"), ("migrate", "current")],
                         ids=["actions", "migrate"])
def test_the_command_line_never_shows_a_password_it_could_not_use(
        dsn: str, command: tuple[str, ...]) -> None:
    result = run(*command, dsn=dsn)
    assert result.exit_code == 2, result.output
    assert "cannot connect to the database" in result.stderr or "not a" in result.stderr
    shows_no_password(result.output)
    debug = run("--debug", *command, dsn=dsn)
    assert debug.exit_code == 2 and "Traceback" in debug.stderr
    shows_no_password(debug.output)
    from_env = run(*command, env={"REPLAYSAFE_DSN": dsn})
    assert from_env.exit_code == 2
    shows_no_password(from_env.output)


def test_what_is_left_out_is_said_and_the_kind_of_error_stays() -> None:
    with pytest.raises(InvalidArgument) as info:
        to_conninfo("postgresql://u:pa%zzsecret@localhost/db")
    assert str(info.value) == (
        'not a libpq connection string: invalid percent-encoded token: "\u2026" '
        "(\u2026 marks text left out: it may hold the password)")
    # A DSN without a password is quoted as it is: nothing to hide.
    with pytest.raises(InvalidArgument,
                       match='invalid URI query parameter: "fallback_application"'):
        to_conninfo("postgresql://u@localhost/db?fallback_application=x")
    with pytest.raises(InvalidArgument, match='missing "=" after "oops"'):
        to_conninfo("host=localhost dbname=d oops")
    # Beside a password, what cannot be part of it is still named; what follows an unquoted
    # one up to the next keyword may be (password=my secret=x), and is left out.
    with pytest.raises(InvalidArgument, match='invalid connection option "colour"'):
        to_conninfo("host=localhost colour=blue password=Hunter2")
    with pytest.raises(InvalidArgument, match='invalid connection option "…"'):
        to_conninfo("host=localhost password=Hunter2 colour=blue")


def test_a_refused_login_still_names_its_role_and_never_its_password(admin_dsn: str) -> None:
    params = conninfo_params(admin_dsn)
    dsn = pg_conninfo.make_conninfo(admin_dsn, user="rs_no_such_role",
                                    password="Hunter2Xyzzy9")
    with pytest.raises(replaysafe_pg.LoginRefused, match='role "rs_no_such_role" does not '
                       "exist") as info, Ledger(dsn, tenant_id="t") as led:
        led.get("k")
    shows_no_password(everything_said(info.value))
    result = run("actions", "list", dsn=dsn)
    assert result.exit_code == 2 and 'role "rs_no_such_role"' in result.stderr
    assert params["host"] in result.stderr or "127.0.0.1" in result.stderr \
        or "localhost" in result.stderr  # the server it tried is named
    shows_no_password(result.output)
