"""Prepared statements only where no pooler can mix them up.

psycopg prepares a statement after five uses, under a name numbered per client connection
(``_pg3_0``, ``_pg3_1``, ...). Behind a transaction pooler two clients share server
connections, and one client's ``_pg3_1`` can be the other's: a ``fail_action`` ran as another
client's ``complete_action``. Worse, any client of the same login can ``PREPARE`` a statement
of its own under a name another client will bind on that server session, and run it with
that client's parameters (its attempt token included). A named statement is safe only on a
server session nobody else uses.

So by default the driver names its statements only on a connection it has probed (once) to
have a server session of its own (:data:`replaysafe_pg._listen.PROBE`); through a pooler it sends them unnamed
(parsed and bound in one exchange that a pooler never splits). Where it names them, the name
is what the statement is: ``rs_`` and a digest of its text and parameter types, never a
per-client number. Between clients of the driver a name then always means one statement.
With ``prepare=True`` behind a pooler, a name can still be unknown on the server session it
lands on (``26000``) or already there (``42P05``): refused before anything runs, the
statement is sent again unnamed (nothing ran: that is safe), and every later one on that
connection too. What ``prepare=True`` cannot survive there is a client that replaces a
statement under the name on purpose (``DEALLOCATE``, then ``PREPARE`` of its own): it is
for poolers that never share a server session while a client uses it.

This names psycopg's statements through its prepared-statement manager (``conn._prepared``,
not a public API): on a psycopg whose manager is not the one known here, on a connection
whose manager already holds prepared statements of psycopg's own naming (a caller's queries
on its connection), or with ``prepare_threshold=None``, the statements are sent unnamed.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from psycopg import errors as pg_errors

from replaysafe_pg._listen import own_session

try:
    from psycopg._preparing import Prepare, PrepareManager
except ImportError:  # a psycopg without this module: every statement is sent unnamed
    Prepare = PrepareManager = None  # type: ignore[assignment, misc]

log = logging.getLogger("replaysafe_pg")

# What a pooler answers when server connections are shared: nothing ran.
LOST = (pg_errors.DuplicatePreparedStatement, pg_errors.InvalidSqlStatementName)
# Set on a connection once a pooler has shown: its statements go unnamed from then on.
_UNNAMED = "_replaysafe_unnamed"


def statement_name(query: bytes, types: Any) -> bytes:
    """``rs_`` and a digest of a statement's text and parameter types (under Postgres's 63
    bytes of a name)."""
    digest = hashlib.sha256(query + b"\0" + repr(tuple(types)).encode()).hexdigest()
    return b"rs_" + digest[:40].encode()


if PrepareManager is not None:
    class _ByContent(PrepareManager):
        """psycopg's manager, naming each statement it prepares by its content."""

        def get(self, query: Any, prepare: bool | None = None) -> tuple[Any, bytes]:
            prep, name = super().get(query, prepare)
            if prep is Prepare.SHOULD:
                name = statement_name(query.query, query.types)
            return prep, name
else:  # pragma: no cover
    _ByContent = None  # type: ignore[assignment, misc]


# Whether a connection's server session is its own: see replaysafe_pg._listen.own_session.
_OWN_SESSION = "_replaysafe_own_session"


def unprobed(conn: Any, prepare: bool | None) -> bool:
    """Must ``conn`` be probed before one of the driver's statements is sent on it?"""
    return prepare is None and _OWN_SESSION not in conn.__dict__ and _ByContent is not None


def probed(conn: Any, rows: list[tuple[Any, ...]]) -> None:
    own = own_session(rows, conn)
    conn.__dict__[_OWN_SESSION] = own
    if not own:
        log.info("replaysafe_pg: this connection goes through a pooler (its server session is "
                 "not its own); the driver's statements on it are sent unnamed")


def _may_name(conn: Any, prepare: bool | None) -> bool:
    if prepare is False or conn.__dict__.get(_UNNAMED) or _ByContent is None:
        return False
    return prepare is True or bool(conn.__dict__.get(_OWN_SESSION))


def adoptable(conn: Any, prepare: bool | None) -> bool:
    """Should ``conn``'s prepared-statement manager become one that names by content (call
    :func:`adopt` holding the connection's lock)? Only a manager of psycopg's that holds no
    prepared statement yet and may prepare at all."""
    if not _may_name(conn, prepare):
        return False
    manager = getattr(conn, "_prepared", None)
    return (type(manager) is PrepareManager and not manager._names
            and manager.prepare_threshold is not None)


def adopt(conn: Any) -> None:
    manager = conn._prepared
    if type(manager) is PrepareManager and not manager._names:
        named = _ByContent()
        named.prepare_threshold = manager.prepare_threshold
        named.prepared_max = manager.prepared_max
        conn._prepared = named


def mode(conn: Any, prepare: bool | None) -> bool | None:
    """psycopg's ``prepare=`` for one of the driver's statements on ``conn``: None (a
    prepared statement named by its content; psycopg's threshold decides when) or False
    (unnamed). ``prepare``: None, named only on a connection probed to have a server session
    of its own; True, named wherever psycopg's manager allows; False, never."""
    if _may_name(conn, prepare) and type(getattr(conn, "_prepared", None)) is _ByContent:
        return None
    return False


def pooler_seen(conn: Any, exc: BaseException) -> None:
    """``conn``'s server connections are shared (``exc`` said so): unnamed from now on."""
    conn.__dict__[_UNNAMED] = True
    log.info("replaysafe_pg: a pooler shares this connection's server sessions (%s); its "
             "statements are sent unnamed from now on", str(exc).strip().splitlines()[0])
