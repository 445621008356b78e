"""The one reader of connection strings in the package.

Everything that takes a DSN (the driver, ``migrate``, the command line) accepts the same
three spellings, read with libpq's own rules through psycopg's ``conninfo`` tools:

* a libpq URI, ``postgresql://user:pass@host/db?sslmode=require``;
* libpq key=value, ``host=/run/postgresql dbname=app password='a&b c'``;
* a SQLAlchemy URL of a libpq-based dialect, ``postgresql+psycopg://...`` (or ``+psycopg2``),
  read by SQLAlchemy's own URL parser (imported only for that spelling).

Going the other way, SQLAlchemy URLs are built with ``URL.create``; no DSN is ever split,
joined or re-quoted by hand.

An error built from a DSN never shows its password, nor what may be part of it
(:func:`redact`): libpq, psycopg and SQLAlchemy quote the token they could not read, the host
they could not reach, and that text may hold the password, or a piece of one that a quote or
an ``@`` too many split off.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import unquote

import psycopg
from psycopg import pq
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
        problem = redact(str(exc).strip(), dsn)
    else:
        return dsn
    # Raised outside the handler: libpq's message (which may quote the password) is not kept
    # as this error's context.
    raise InvalidArgument(f"not a libpq connection string: {problem}")


def _from_sqlalchemy_url(dsn: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(dsn)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        problem = redact(str(exc).strip(), dsn)
    else:
        return _libpq_of(url)
    raise InvalidArgument(f"not a SQLAlchemy URL: {problem}")


def _libpq_of(url: URL) -> str:
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


# --- errors that never show a password ---------------------------------------------------

E = TypeVar("E", bound=BaseException)

# What stands for text left out of a message.
HIDDEN = "\u2026"
NOTE = f"({HIDDEN} marks text left out: it may hold the password)"
# libpq's own punctuation in its messages (missing "=" after ..., matching "]" ...).
_PUNCTUATION = frozenset({"=", "]", ":", "/", HIDDEN})
_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")
_QUERY_SECRET = re.compile(r"[?&](?:ssl)?password=([^&#]*)", re.IGNORECASE)
_KEYWORD_SECRET = re.compile(r"(?:^|\s)(?:ssl)?password\s*=\s*", re.IGNORECASE)
_QUOTED = (re.compile(r'"([^"]*)"'), re.compile(r"'([^']*)'"))
# A run this long shared with a password is a piece of it.
_PIECE = 4


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


@functools.cache
def _next_keyword() -> re.Pattern[str]:
    """Where a key=value password ends at the latest: before the next libpq keyword's
    ``=`` (a password that was not quoted as it should have been runs on to there)."""
    names = "|".join(sorted(map(re.escape, _libpq_keywords()), key=len, reverse=True))
    return re.compile(rf"\s+(?=(?:{names})\s*=)", re.IGNORECASE)


def _secret_spans(dsn: str) -> list[tuple[int, int]]:
    """Where ``dsn`` holds, or may hold, a password: as generous as a user's mistake can
    make it (a URI's user info up to its last ``@``; a key=value password up to the next
    keyword, quoted or not)."""
    spans: list[tuple[int, int]] = []
    scheme = _SCHEME.match(dsn)
    if scheme is not None:
        at = dsn.rfind("@", scheme.end())
        colon = dsn.find(":", scheme.end(), at) if at != -1 else -1
        if colon != -1:
            spans.append((colon + 1, at))
        spans.extend(m.span(1) for m in _QUERY_SECRET.finditer(dsn))
    else:
        for m in _KEYWORD_SECRET.finditer(dsn):
            end = _next_keyword().search(dsn, m.end())
            spans.append((m.end(), len(dsn) if end is None else end.start()))
    return [(a, b) for a, b in spans if b > a]


def _parsed_secrets(dsn: str) -> list[str]:
    """The passwords libpq (or SQLAlchemy) reads from ``dsn``, if it can read it."""
    try:
        if _is_sqlalchemy_url(dsn):
            from sqlalchemy.engine import make_url

            password = make_url(dsn).password
            return [password] if password else []
        params = conninfo_to_dict(dsn)
    except Exception:
        return []
    return [str(v) for k, v in params.items() if k in ("password", "sslpassword") and v]


def _secrets(dsn: str, spans: list[tuple[int, int]]) -> list[str]:
    texts = [dsn[a:b] for a, b in spans]
    found = {*texts, *map(unquote, texts), *_parsed_secrets(dsn)}
    for quote in ("'", '"'):
        found |= {t.strip(quote) for t in found}
    return sorted((t for t in found if t), key=len, reverse=True)


def _hidden(token: str, dsn: str, spans: list[tuple[int, int]], secrets: list[str]) -> bool:
    """Could ``token`` (quoted in a message) be the password or a piece of it?"""
    if not token or token in _PUNCTUATION:
        return False
    start = dsn.find(token)
    while start != -1:
        if any(start < b and a < start + len(token) for a, b in spans):
            return True
        start = dsn.find(token, start + 1)
    for secret in secrets:
        if (len(secret) >= 3 and secret in token) or (len(token) >= 2 and token in secret):
            return True
        if any(secret[i:i + _PIECE] in token for i in range(len(secret) - _PIECE + 1)):
            return True
    return False


def _redact_one(message: str, dsn: str) -> str:
    spans = _secret_spans(dsn)
    secrets = _secrets(dsn, spans)
    if not secrets:
        return message
    out = message
    for secret in secrets:
        if len(secret) >= 3:
            out = out.replace(secret, HIDDEN)
    for quoted in _QUOTED:
        out = quoted.sub(lambda m: m.group(0) if not _hidden(m.group(1), dsn, spans, secrets)
                         else m.group(0)[0] + HIDDEN + m.group(0)[-1], out)
    return out


def redact(message: str, *dsns: str | None) -> str:
    """``message`` (an error about the ``dsns``: what the user gave, and what the driver
    made of it) without a password of theirs or what may be part of one: every quoted token
    that could be is replaced by ``\u2026``, and a note says so. A DSN without a password
    leaves the message as it is."""
    out = message
    for dsn in dsns:
        if dsn and out:
            out = _redact_one(out, dsn)
    return out if out == message or out.endswith(NOTE) else f"{out} {NOTE}"


def scrub(exc: E, *dsns: str | None) -> E:
    """``exc`` and the exceptions it was raised from, their messages redacted against
    ``dsns`` (:func:`redact`) in place; a psycopg error also lets go of the failed
    connection, whose error message libpq keeps. Returns ``exc`` (re-raise it with a bare
    ``raise``: it keeps its own traceback and chain)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        args = tuple(redact(a, *dsns) if isinstance(a, str) else a for a in current.args)
        if args != current.args:
            current.args = args
            if isinstance(current, psycopg.Error):
                current._pgconn = None
            message = getattr(current, "message", None)
            if isinstance(message, str):
                # ReplaysafeError and SQLAlchemy's errors keep the text in .message too.
                with contextlib.suppress(AttributeError):
                    current.message = redact(message, *dsns)  # type: ignore[attr-defined]
        current = current.__cause__ or current.__context__
    return exc
