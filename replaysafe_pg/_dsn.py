"""The one reader of connection strings in the package.

Everything that takes a DSN (the driver, ``migrate``, the command line) accepts the same
three spellings, read with libpq's own rules through psycopg's ``conninfo`` tools:

* a libpq URI, ``postgresql://user:pass@host/db?sslmode=require``;
* libpq key=value, ``host=/run/postgresql dbname=app password='a&b c'``;
* a SQLAlchemy URL of a libpq-based dialect, ``postgresql+psycopg://...`` (or ``+psycopg2``),
  read by SQLAlchemy's own URL parser (imported only for that spelling).

Going the other way, SQLAlchemy URLs are built with ``URL.create``; no DSN is ever split,
joined or re-quoted by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from replaysafe_pg.errors import InvalidArgument

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

# SQLAlchemy dialects whose URL means what a libpq conninfo means (their query arguments are
# libpq keywords). asyncpg's are not: its URLs are refused rather than half understood.
LIBPQ_DRIVERS = frozenset({"psycopg", "psycopg_async", "psycopg2", "psycopg2cffi"})
SQLALCHEMY_DRIVER = "postgresql+psycopg"


def _is_sqlalchemy_url(dsn: str) -> bool:
    scheme, sep, _rest = dsn.partition("://")
    return bool(sep) and "+" in scheme and " " not in scheme and "=" not in scheme


def to_conninfo(dsn: str) -> str:
    """``dsn`` in any accepted spelling as a libpq conninfo (a URI or key=value string is
    returned as given, once libpq's parser has accepted it)."""
    if not isinstance(dsn, str):
        raise TypeError(f"expected a DSN string, got {type(dsn).__name__}")
    if _is_sqlalchemy_url(dsn):
        return _from_sqlalchemy_url(dsn)
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise InvalidArgument(f"not a libpq connection string: {exc}") from None
    return dsn


def _from_sqlalchemy_url(dsn: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(dsn)
    except ArgumentError as exc:
        raise InvalidArgument(f"not a SQLAlchemy URL: {exc}") from None
    if url.get_backend_name() != "postgresql" or url.get_driver_name() not in LIBPQ_DRIVERS:
        raise InvalidArgument(
            f"a {url.drivername!r} URL is not a libpq connection string: use postgresql://, "
            f"key=value, or postgresql+psycopg:// (or +psycopg2)")
    params: dict[str, str | int | None] = {
        "user": url.username, "password": url.password, "host": url.host,
        "port": url.port, "dbname": url.database}
    for key, value in url.query.items():
        # host=a&host=b: SQLAlchemy's multi-host form, libpq's host=a,b
        params[key] = ",".join(value) if isinstance(value, tuple) else value
    return make_conninfo("", **{k: v for k, v in params.items() if v is not None})


def conninfo_params(dsn: str) -> dict[str, str]:
    """The libpq keywords of ``dsn`` (any accepted spelling)."""
    return {k: str(v) for k, v in conninfo_to_dict(to_conninfo(dsn)).items() if v is not None}


def sqlalchemy_url(dsn: str) -> URL:
    """``dsn`` as a SQLAlchemy URL for the psycopg 3 dialect, meaning exactly what libpq
    would: user, password and database in the URL, every other keyword (a socket directory
    as ``host``, several hosts, ``sslmode``, ``options``...) as a query argument, which the
    dialect hands to libpq unchanged."""
    from sqlalchemy.engine import URL

    params = conninfo_params(dsn)
    user, password, dbname = params.pop("user", None), params.pop("password", None), \
        params.pop("dbname", None)
    return URL.create(SQLALCHEMY_DRIVER, username=user, password=password, database=dbname,
                      query=params)


def render_url(url: URL) -> str:
    """A URL as text, password included (for alembic's ``sqlalchemy.url`` option)."""
    return url.render_as_string(hide_password=False)
