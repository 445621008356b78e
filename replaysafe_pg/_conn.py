"""Where the driver gets its connections: a DSN, a psycopg connection, or a pool.

Every call is one round trip on an autocommit connection. A caller's own non-autocommit
connection is respected: inside the caller's transaction the call joins it; on an idle
connection it runs in a transaction of its own, committed at once. The claims of
``Ledger.run`` are the exception (``alone=True``): they must be committed before the tool
runs, so a connection inside a transaction is refused before anything is sent.

Under a tenant grant, a view's query (which takes no ``p_grant``) is preceded by
``use_grant`` in the same transaction: in the caller's open one, else in one of its own, so
that the grant is in force for that query only (docs/isolation.md#tenant-grants).

Long tasks (LISTEN while waiting for another attempt, heartbeats) never run on a connection
that ordinary calls use: psycopg holds a connection's lock for the whole wait, which would
stall the heartbeats and records of every other call on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import select
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, LiteralString, TypeAlias, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import ConnStatus, ExecStatus, PipelineStatus, TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from replaysafe_pg import _listen, _prepared
from replaysafe_pg._dsn import scrub, to_conninfo
from replaysafe_pg.errors import DatabaseUnavailable, InvalidArgument, wrap_errors

Conninfo: TypeAlias = "str | psycopg.Connection[Any] | ConnectionPool[Any]"
AsyncConninfo: TypeAlias = "str | psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any]"

log = logging.getLogger("replaysafe_pg")


def _usable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return not conn.closed and not conn.broken and not dropped(conn)


# A pool may hold several connections the server closed while they were idle.
_POOL_TRIES = 4


def dropped(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Did the server (or the network) close this idle connection: a terminated backend, a
    restart, a cut? Nothing is sent: one poll of the socket. An idle connection has nothing
    to read unless the server said goodbye (its FATAL message, then end of file), so a
    statement sent on it would fail although the server never saw it. A connection inside a
    transaction or busy is never judged here."""
    if conn.closed or conn.broken:
        return True
    if conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    pgconn = conn.pgconn
    # The goodbye may take two reads: the server's FATAL message, then the end of file, which
    # follows once the backend has exited: after a first read, wait a moment for it (only
    # an idle connection that was sent something waits; an ordinary one returns at once).
    for wait in (0.0, 0.05, 0.05):
        try:
            readable, _, _ = select.select([pgconn.socket], [], [], wait)
        except (OSError, ValueError, psycopg.OperationalError):
            return True
        if not readable:
            return False
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            return True
        if pgconn.status == ConnStatus.BAD:
            return True
    return False


# No statement here depends on session state, so that each may land on any server connection
# of a pooler in transaction mode:
# - no startup ``options`` (PgBouncer refuses the parameter): instead of pinning the
#   search_path, every name in the statements we send is qualified (sql/queries.sql,
#   tests/unit/test_qualified_statements.py);
# - prepared statements only on a connection whose server session is its own, named by their
#   content, never by psycopg's per-client numbers; through a pooler, unnamed
#   (replaysafe_pg._prepared, docs/deploying.md).

# SPEC: an address that accepts and never answers fails instead of hanging.
DEFAULT_CONNECT_TIMEOUT = 10


def connectable(conninfo: str) -> str:
    """``conninfo`` (any spelling :mod:`replaysafe_pg._dsn` reads) as a libpq conninfo for the
    connections the package opens itself: a ``connect_timeout`` of 10 s unless it names one."""
    conninfo = to_conninfo(conninfo)
    if "connect_timeout" in conninfo_to_dict(conninfo):
        return conninfo
    return make_conninfo(conninfo, connect_timeout=DEFAULT_CONNECT_TIMEOUT)


def _full_conninfo(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str:
    """The options a live connection was made with, password included (``conn.info.dsn``
    hides it), so that a second connection to the same place can be opened."""
    options = {o.keyword.decode(): o.val.decode() for o in conn.pgconn.info if o.val is not None}
    return make_conninfo(**options)


_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


def refuse_open_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """docs/run.md: ``run`` never joins the caller's transaction. Joined, its claim would vanish
    with the caller's rollback, and the next run would call the tool a second time."""
    if conn.info.transaction_status in _OPEN:
        raise InvalidArgument(
            "Ledger.run was given a connection inside an open transaction: its claim must be "
            "committed before the tool runs, and a rollback would erase it and let the tool run "
            "again. Commit or roll back first, or give the Ledger a DSN or a pool")


def _in_pipeline(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    # A broken connection may still say ON after its block (psycopg leaves pipeline mode only
    # on a good one): the statement then fails as on any broken connection.
    return (not conn.closed and not conn.broken
            and conn.pgconn.pipeline_status != PipelineStatus.OFF)


_IN_PIPELINE = (
    "the connection is in pipeline mode (inside `with conn.pipeline()`): replaysafe_pg needs "
    "the answer to each call before the call returns, and a pipeline gives it only at its "
    "end. Nothing was sent; make the call outside the pipeline block")


def refuse_pipeline(conn: psycopg.Connection[Any]) -> None:
    """A caller's connection inside ``with conn.pipeline()`` answers a statement only at the
    pipeline's end, and every call here needs its answer before it returns (a claim's
    outcome, a checkpoint's compare-and-swap, a read): refused before anything is sent. Sent,
    a claim would run at the pipeline's end with nobody to act on it, a read would answer
    "nothing there". A pipeline seen is looked at again under the connection's lock:
    psycopg's ``executemany`` (a neighbour's, on a shared connection) holds it for the
    pipeline it opens itself, so a call waits for that one to end instead of being refused.
    The common case (no pipeline) takes no lock here. A caller's own block does not hold the
    lock between its statements; one opened by another thread between this look and the
    statement is not seen (a narrow race, docs/python.md)."""
    if _in_pipeline(conn):
        with conn.lock:
            if _in_pipeline(conn):
                raise InvalidArgument(_IN_PIPELINE)


async def arefuse_pipeline(conn: psycopg.AsyncConnection[Any]) -> None:
    """See :func:`refuse_pipeline`."""
    if _in_pipeline(conn):
        async with conn.lock:
            if _in_pipeline(conn):
                raise InvalidArgument(_IN_PIPELINE)


# A statement sent before another in the same transaction: its query and parameters.
First: TypeAlias = "tuple[LiteralString, dict[str, Any]]"
# How a query of sql/queries.sql takes a tenant grant (replaysafe_pg.queries.GRANT_ARGUMENT).
_GRANT_PLACEHOLDER = "%(grant)s"


def view_grant(query: LiteralString, params: dict[str, Any] | None) -> str | None:
    """The grant ``params`` carry for a query that does not take one (a view's): it must be
    put in force by ``use_grant`` first, in the query's transaction. None otherwise (no
    grant, or a function that takes it as ``p_grant``)."""
    grant = params.get("grant") if params else None
    if grant is None or _GRANT_PLACEHOLDER in query:
        return None
    return str(grant)


def execute_on(conn: psycopg.Connection[Any], query: LiteralString,
               params: dict[str, Any] | None = None, *, alone: bool = False,
               binary: bool = False, prepare: bool | None = None,
               first: First | None = None) -> list[tuple[Any, ...]]:
    """One statement on ``conn``: joins an open transaction, else commits at once.
    With ``alone``, a connection inside a transaction is refused instead of joined.
    Rows are tuples whatever the connection's row factory. Statements without a result
    (LISTEN) answer ``[]``. ``binary``: results in binary format (bytea without hex text).
    ``prepare`` (:mod:`replaysafe_pg._prepared`): None, a prepared statement named by its
    content after psycopg's few uses on a connection with a server session of its own, else
    unnamed; True, named wherever psycopg allows; False, always unnamed. ``first``: a
    statement sent before ``query`` in the same transaction (the caller's open one, else one
    of its own, also on an autocommit connection); its rows are not read."""
    refuse_pipeline(conn)
    if alone:
        refuse_open_transaction(conn)
    with wrap_errors():
        if _prepared.unprobed(conn, prepare):
            probe = conn.cursor(row_factory=tuple_row)
            _prepared.probed(conn, _execute(conn, probe, _listen.PROBE, None, False, False))
        if _prepared.adoptable(conn, prepare):
            with conn.lock:
                _prepared.adopt(conn)
        cursors, cur = _take_cursor(conn, query)
        lead = None if first is None else (_take_cursor(conn, first[0])[1], *first)
        try:
            named = _prepared.mode(conn, prepare)
            try:
                return _execute(conn, cur, query, params, binary, named, lead)
            except _prepared.LOST as exc:
                if named is False or conn.info.transaction_status != TransactionStatus.IDLE:
                    raise
                _prepared.pooler_seen(conn, exc)
                return _execute(conn, cur, query, params, binary, False, lead)
        finally:
            _put_back(cursors, query, cur)
            if lead is not None:
                _put_back(cursors, lead[1], lead[0])
            _bound_backlog(conn)


# A statement to send first: its cursor, query and parameters.
_Lead: TypeAlias = "tuple[Any, LiteralString, dict[str, Any]]"


def _execute(conn: psycopg.Connection[Any], cur: Any, query: LiteralString,
             params: dict[str, Any] | None, binary: bool,
             prepare: bool | None, lead: _Lead | None = None) -> list[tuple[Any, ...]]:
    """``query`` alone: as it is on an autocommit connection or inside a transaction, else
    in a transaction of its own. After ``lead``: both in the open transaction, else both in
    one of their own (autocommit or not)."""
    if lead is None and (conn.autocommit
                         or conn.info.transaction_status != TransactionStatus.IDLE):
        cur.execute(query, params, binary=binary, prepare=prepare)
        return cur.fetchall() if _has_rows(cur) else []
    if lead is not None and conn.info.transaction_status != TransactionStatus.IDLE:
        lead[0].execute(lead[1], lead[2], prepare=prepare)
        cur.execute(query, params, binary=binary, prepare=prepare)
        return cur.fetchall() if _has_rows(cur) else []
    with conn.transaction():
        if lead is not None:
            lead[0].execute(lead[1], lead[2], prepare=prepare)
        cur.execute(query, params, binary=binary, prepare=prepare)
        return cur.fetchall() if _has_rows(cur) else []


# Our statements' cursors, one per connection and statement, kept on the connection (a
# cursor holds its connection: a weak mapping from connection to cursor would keep both
# alive). psycopg keeps a cursor's adaptation state while the same query object runs on it
# again: the dumpers it chose for the parameters (list parameters are inspected element by
# element to choose one), the loaders of the result. A new cursor per call looks all of them
# up again: ~26 us of client CPU per langgraph_put (12 parameters), docs/performance.md.
_CURSORS = "_replaysafe_cursors"


def _take_cursor(conn: Any, query: LiteralString) -> tuple[dict[str, Any], Any]:
    """The cursor of ``query`` on ``conn``, taken out of the connection's cache for the
    statement: no other thread or task can use it meanwhile, whatever shares ``conn`` (two
    driver objects on one caller's connection have a lock each; a waiter that fell back to
    the given connection has none). Taken, it is a new cursor for that call."""
    cursors: dict[str, Any] = conn.__dict__.setdefault(_CURSORS, {})  # atomic under the GIL
    cur = cursors.pop(query, None)
    if cur is None or cur.closed:
        cur = conn.cursor(row_factory=tuple_row)
    return cursors, cur


def _put_back(cursors: dict[str, Any], query: LiteralString, cur: Any) -> None:
    """Let go of the result the cursor holds (a checkpoint's values can be megabytes: the
    cursor's and its transformer's references) while keeping its adaptation state, then
    put the cursor back; psycopg has no public call for it."""
    reset = getattr(cur, "_reset", None)
    if reset is not None:
        reset()
    tx = getattr(cur, "_tx", None)
    if tx is not None:
        tx.set_pgresult(None, set_loaders=False)
    cursors.setdefault(query, cur)


def _has_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    # The result status, not cur.description: that builds a Column object per column on
    # every access, a measurable part of a replay's client time.
    result = cur.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


async def aexecute_on(conn: psycopg.AsyncConnection[Any], query: LiteralString,
                      params: dict[str, Any] | None = None, *,
                      alone: bool = False, binary: bool = False,
                      prepare: bool | None = None,
                      first: First | None = None) -> list[tuple[Any, ...]]:
    """See :func:`execute_on`."""
    await arefuse_pipeline(conn)
    if alone:
        refuse_open_transaction(conn)
    with wrap_errors():
        if _prepared.unprobed(conn, prepare):
            probe = conn.cursor(row_factory=tuple_row)
            _prepared.probed(conn, await _aexecute(conn, probe, _listen.PROBE, None, False,
                                                   False))
        if _prepared.adoptable(conn, prepare):
            async with conn.lock:
                _prepared.adopt(conn)
        cursors, cur = _take_cursor(conn, query)
        lead = None if first is None else (_take_cursor(conn, first[0])[1], *first)
        try:
            named = _prepared.mode(conn, prepare)
            try:
                return await _aexecute(conn, cur, query, params, binary, named, lead)
            except _prepared.LOST as exc:
                if named is False or conn.info.transaction_status != TransactionStatus.IDLE:
                    raise
                _prepared.pooler_seen(conn, exc)
                return await _aexecute(conn, cur, query, params, binary, False, lead)
        finally:
            _put_back(cursors, query, cur)
            if lead is not None:
                _put_back(cursors, lead[1], lead[0])
            _bound_backlog(conn)


async def _aexecute(conn: psycopg.AsyncConnection[Any], cur: Any, query: LiteralString,
                    params: dict[str, Any] | None, binary: bool,
                    prepare: bool | None, lead: _Lead | None = None) -> list[tuple[Any, ...]]:
    """See :func:`_execute`."""
    if lead is None and (conn.autocommit
                         or conn.info.transaction_status != TransactionStatus.IDLE):
        await cur.execute(query, params, binary=binary, prepare=prepare)
        return await cur.fetchall() if _has_rows(cur) else []
    if lead is not None and conn.info.transaction_status != TransactionStatus.IDLE:
        await lead[0].execute(lead[1], lead[2], prepare=prepare)
        await cur.execute(query, params, binary=binary, prepare=prepare)
        return await cur.fetchall() if _has_rows(cur) else []
    async with conn.transaction():
        if lead is not None:
            await lead[0].execute(lead[1], lead[2], prepare=prepare)
        await cur.execute(query, params, binary=binary, prepare=prepare)
        return await cur.fetchall() if _has_rows(cur) else []


# Notifications are for the LISTEN session only. Elsewhere psycopg keeps every one it
# receives until someone asks (an unbounded backlog): behind a transaction pooler a server
# session another client LISTENs on hands them to whoever runs there next.
NOTIFY_BACKLOG_LIMIT = 1000
_C = TypeVar("_C", psycopg.Connection[Any], psycopg.AsyncConnection[Any])


def _ignore(_note: psycopg.Notify) -> None:
    return None


def _deaf(conn: _C) -> _C:
    """A connection of the driver's own that drops every notification it receives."""
    conn.add_notify_handler(_ignore)
    return conn


def _bound_backlog(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """A caller's (or a pool's) connection keeps at most NOTIFY_BACKLOG_LIMIT notifications
    received while the driver used it."""
    backlog = getattr(conn, "_notifies_backlog", None)
    if backlog and len(backlog) > NOTIFY_BACKLOG_LIMIT:
        log.warning("replaysafe_pg: dropping the %d oldest notifications nobody read on a "
                    "connection the driver used (a pooler's server session that someone "
                    "LISTENs on?)", len(backlog) - NOTIFY_BACKLOG_LIMIT)
        while len(backlog) > NOTIFY_BACKLOG_LIMIT:
            backlog.popleft()


def open_connection(conninfo: str, *, given: Sequence[str] = (),
                    **kwargs: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect``; its error never shows a password of ``conninfo`` or of the DSNs
    it was ``given`` as (the host, user or database it quotes may hold a piece of a password
    that a mistake in the DSN split off: replaysafe_pg._dsn.redact)."""
    try:
        return psycopg.connect(conninfo, **kwargs)
    except psycopg.Error as exc:
        scrub(exc, *given, conninfo)
        raise


async def aopen_connection(conninfo: str, *, given: Sequence[str] = (),
                           **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """See :func:`open_connection`."""
    try:
        return await psycopg.AsyncConnection.connect(conninfo, **kwargs)
    except psycopg.Error as exc:
        scrub(exc, *given, conninfo)
        raise


def _connect_to(conninfo: str) -> psycopg.Connection[Any]:
    return open_connection(conninfo, autocommit=True)


async def _aconnect_to(conninfo: str) -> psycopg.AsyncConnection[Any]:
    return await aopen_connection(conninfo, autocommit=True)


def _given_dsns(*values: object) -> tuple[str, ...]:
    """The DSNs a user gave a source: what its connection errors are redacted against, as
    well as the conninfo made of them (a piece of a password that a mistake in the DSN split
    off shows only in what the user wrote)."""
    return tuple(v for v in values if isinstance(v, str))


def _scrubbed(connect: Callable[[], psycopg.Connection[Any]],
              given: Sequence[str]) -> psycopg.Connection[Any]:
    try:
        return connect()
    except psycopg.Error as exc:
        scrub(exc, *given)
        raise


async def _ascrubbed(connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
                     given: Sequence[str]) -> psycopg.AsyncConnection[Any]:
    try:
        return await connect()
    except psycopg.Error as exc:
        scrub(exc, *given)
        raise


def _pool_place(conninfo: str, kwargs: dict[str, Any] | None) -> str:
    """A pool's ``conninfo`` with the connection parameters among its ``kwargs`` (the others
    are psycopg's: row_factory, autocommit...)."""
    extra = {k: v for k, v in (kwargs or {}).items()
             if isinstance(v, str | int) and not isinstance(v, bool)
             and k not in ("prepare_threshold",)}
    return connectable(make_conninfo(conninfo, **extra))


def _called(value: Any) -> Any:
    """A pool's ``conninfo`` or ``kwargs``: the value, or what the callable given instead
    returns (psycopg_pool takes either)."""
    return value() if callable(value) else value


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _prepare_flag(value: bool | None) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise InvalidArgument(f"prepare must be None, True or False, not {value!r}")
    return value


def _split_grant(use_grant: LiteralString | None, query: LiteralString,
                 params: dict[str, Any]) -> tuple[dict[str, Any], First | None]:
    """A view's statement under a grant (:func:`view_grant`): its parameters without the
    grant, and the ``use_grant`` to send first. Any other statement: as it is, nothing first."""
    grant = view_grant(query, params)
    if grant is None:
        return params, None
    if use_grant is None:
        raise InvalidArgument("this statement reads a view under a tenant grant, which this "
                              "driver object cannot put in force: nothing was sent")
    return {k: v for k, v in params.items() if k != "grant"}, (use_grant, {"grant": grant})


def _lead(split: tuple[dict[str, Any], First | None],
          first: First | None) -> tuple[dict[str, Any], First | None]:
    """:func:`_split_grant`'s answer with the caller's own ``first`` statement (only one
    statement can go first)."""
    params, grant_first = split
    if first is None:
        return params, grant_first
    if grant_first is not None:
        raise InvalidArgument("a view's query under a tenant grant takes no other statement "
                              "before it: nothing was sent")
    return params, first


def _listen_target(listen: str | bool) -> str | None:
    """The DSN a ``listen=`` names (None: True or False)."""
    if isinstance(listen, bool):
        return None
    if isinstance(listen, str):
        return connectable(listen)
    raise InvalidArgument(f"listen must be a DSN, True or False, not {type(listen).__name__}")


class SyncSource:
    """Where a sync driver object gets its connections. ``prepare``: see :func:`execute_on`.
    ``listen``: where waiters LISTEN (True: the place the source points to, on one connection
    outside any pool; a DSN: there; False: nowhere, waiters claim again every second).
    ``use_grant``: the statement that puts a tenant grant in force for the rest of a
    transaction (``use_grant`` of sql/queries.sql); :meth:`execute` sends it before a view's
    query whose parameters carry a grant (:func:`view_grant`), in the query's transaction."""

    def __init__(self, conninfo: Conninfo, *, prepare: bool | None = None,
                 listen: str | bool = True, use_grant: LiteralString | None = None) -> None:
        self.dsn: str | None = connectable(conninfo) if isinstance(conninfo, str) else None
        self._given_dsns = _given_dsns(conninfo, listen)
        self._pool = conninfo if isinstance(conninfo, ConnectionPool) else None
        self._given = conninfo if isinstance(conninfo, psycopg.Connection) else None
        if self.dsn is None and self._pool is None and self._given is None:
            raise TypeError("expected a DSN, a psycopg Connection or a psycopg_pool ConnectionPool")
        self.prepare = _prepare_flag(prepare)
        self._use_grant = use_grant
        self._listen_at = _listen_target(listen)
        self._listens = listen is not False
        self._listener: _listen.Listener | None = None
        self._own: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        # A caller's connection is shared by our threads (run_many, heartbeats): the check
        # of its transaction status and the statement must not interleave.
        self._given_lock = threading.Lock()

    @property
    def can_reconnect(self) -> bool:
        """A DSN or a pool can hand out a fresh connection after one broke; a single given
        connection cannot."""
        return self._given is None

    @property
    def pooled(self) -> bool:
        return self._pool is not None

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection of our own: from the DSN, or, given a connection, to
        the same database as that one."""
        with wrap_errors():  # a refused connection is DatabaseUnavailable
            if self.dsn is not None:
                return _deaf(open_connection(self.dsn, given=self._given_dsns, autocommit=True))
            assert self._given is not None
            return _deaf(open_connection(connectable(_full_conninfo(self._given)),
                                         autocommit=True))

    def listener(self) -> _listen.Listener | None:
        """The LISTEN session the waiters of this source share (None: it does not listen):
        the process's one for the same place."""
        if not self._listens:
            return None
        if self._listener is None:
            target = self._place()
            connect: _listen.Connect = functools.partial(
                _scrubbed, functools.partial(_connect_to, target) if self._pool is None
                else lambda: _connect_to(self._place()),  # a pool's credentials may rotate
                self._given_dsns)
            self._listener = _listen.listener_for(target, connect,
                                                  probe=self._listen_at is None)
        return self._listener

    def _place(self) -> str:
        """Where this source's connections go, as a conninfo (a pool's outside the pool)."""
        if self._listen_at is not None:
            return self._listen_at
        if self.dsn is not None:
            return self.dsn
        if self._pool is not None:
            return _pool_place(_called(self._pool.conninfo), _called(self._pool.kwargs))
        assert self._given is not None
        return connectable(_full_conninfo(self._given))

    @contextlib.contextmanager
    def _pooled(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection from the pool that the server has not closed while it sat idle
        there (closed, it goes back to the pool, which replaces it)."""
        assert self._pool is not None
        for _ in range(_POOL_TRIES):
            with self._pool.connection() as conn:
                if not dropped(conn):
                    yield conn
                    return
                conn.close()
        with self._pool.connection() as conn:
            yield conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is not None:
            with self._pooled() as conn:
                yield conn
            return
        if self._given is not None:
            yield self._given
            return
        # Held for the statement too: the check polls the socket, which must not race with
        # another thread's statement on the same connection (it read that statement's answer
        # as a goodbye, or consumed it: run_many's threads got each other's rows).
        with self._lock:
            yield self._usable_own()

    def _usable_own(self) -> psycopg.Connection[Any]:
        """The ledger's own connection, (re)opened if the server closed it while it sat idle
        (never raises for that); the caller holds ``self._lock``."""
        own = self._own
        if own is None or not _usable(own):
            if own is not None:
                own.close()
            own = self._own = self.connect()
        return own

    def execute(self, query: LiteralString, params: dict[str, Any], *,
                alone: bool = False, binary: bool = False,
                first: First | None = None) -> list[tuple[Any, ...]]:
        """One statement; ``alone``: it must commit on its own (see :func:`execute_on`).
        A view's query under a grant is preceded by ``use_grant`` on the same connection,
        in the same transaction; ``first``: a statement to send before it likewise (a
        function's query: one that takes its grant as ``p_grant``)."""
        params, first = _lead(_split_grant(self._use_grant, query, params), first)
        if self._given is not None:
            with self._given_lock:
                return execute_on(self._given, query, params, alone=alone, binary=binary,
                                  prepare=self.prepare, first=first)
        if self._pool is None:  # the common case without connection(): a replay's whole path
            with wrap_errors(), self._lock:
                return execute_on(self._usable_own(), query, params, alone=alone, binary=binary,
                                  prepare=self.prepare, first=first)
        with wrap_errors(), self.connection() as conn:
            return execute_on(conn, query, params, alone=alone, binary=binary,
                              prepare=self.prepare, first=first)

    def refuse_open_transaction(self, message: str) -> None:
        """``InvalidArgument(message)`` when the caller's connection is inside an open
        transaction (a pool's and the driver's own never are); nothing is sent. For a call
        whose statements must each be a transaction of its own (``first``'s settings end with
        it, an error ends it)."""
        if self._given is not None and self._given.info.transaction_status in _OPEN:
            raise InvalidArgument(message)

    def execute_aside(self, query: LiteralString, params: dict[str, Any], *,
                      alone: bool = False) -> list[tuple[Any, ...]]:
        """As :meth:`execute`, for a waiter's claims: beside a caller's connection, on a
        second one of the driver's own (the caller's may be inside a transaction of its own
        meanwhile), or on the given one when no second can be opened."""
        if self._given is not None:
            with self._lock:
                try:
                    conn: psycopg.Connection[Any] | None = self._usable_own()
                except DatabaseUnavailable:
                    conn = None
                if conn is not None:
                    params, first = _split_grant(self._use_grant, query, params)
                    return execute_on(conn, query, params, alone=alone, prepare=self.prepare,
                                      first=first)
        return self.execute(query, params, alone=alone)

    def close(self) -> None:
        self._listener = None  # the session closes with its last driver object
        with self._lock:
            if self._own is not None:
                self._own.close()
                self._own = None


class AsyncSource:
    """See :class:`SyncSource`."""

    def __init__(self, conninfo: AsyncConninfo, *, prepare: bool | None = None,
                 listen: str | bool = True, use_grant: LiteralString | None = None) -> None:
        self.dsn: str | None = connectable(conninfo) if isinstance(conninfo, str) else None
        self._given_dsns = _given_dsns(conninfo, listen)
        self._pool = conninfo if isinstance(conninfo, AsyncConnectionPool) else None
        self._given = conninfo if isinstance(conninfo, psycopg.AsyncConnection) else None
        if self.dsn is None and self._pool is None and self._given is None:
            raise TypeError(
                "expected a DSN, a psycopg AsyncConnection or a psycopg_pool AsyncConnectionPool")
        self.prepare = _prepare_flag(prepare)
        self._use_grant = use_grant
        self._listen_at = _listen_target(listen)
        self._listens = listen is not False
        # The listener of the event loop it was last asked in (a loop has one of its own).
        self._listener: tuple[weakref.ref[asyncio.AbstractEventLoop],
                              _listen.AsyncListener] | None = None
        self._own: psycopg.AsyncConnection[Any] | None = None
        self._lock: asyncio.Lock | None = None
        self._given_lock: asyncio.Lock | None = None

    @property
    def can_reconnect(self) -> bool:
        """See :attr:`SyncSource.can_reconnect`."""
        return self._given is None

    async def connect(self) -> psycopg.AsyncConnection[Any]:
        """See :meth:`SyncSource.connect`."""
        with wrap_errors():
            if self.dsn is not None:
                return _deaf(await aopen_connection(self.dsn, given=self._given_dsns,
                                                    autocommit=True))
            assert self._given is not None
            return _deaf(await aopen_connection(connectable(_full_conninfo(self._given)),
                                                autocommit=True))

    @property
    def pooled(self) -> bool:
        return self._pool is not None

    async def listener(self) -> _listen.AsyncListener | None:
        """See :meth:`SyncSource.listener`; the running event loop's."""
        if not self._listens:
            return None
        loop = asyncio.get_running_loop()
        if self._listener is not None and self._listener[0]() is loop:
            return self._listener[1]
        target = await self._place()
        connect: _listen.AsyncConnect = functools.partial(
            _ascrubbed, functools.partial(_aconnect_to, target) if self._pool is None
            else self._connect_to_place,  # a pool's credentials may rotate
            self._given_dsns)
        listener = _listen.async_listener_for(target, connect, probe=self._listen_at is None)
        self._listener = (weakref.ref(loop), listener)
        return listener

    async def _place(self) -> str:
        """See :meth:`SyncSource._place`."""
        if self._listen_at is not None:
            return self._listen_at
        if self.dsn is not None:
            return self.dsn
        if self._pool is not None:
            return _pool_place(await _awaited(_called(self._pool.conninfo)),
                               await _awaited(_called(self._pool.kwargs)))
        assert self._given is not None
        return connectable(_full_conninfo(self._given))

    async def _connect_to_place(self) -> psycopg.AsyncConnection[Any]:
        return await _aconnect_to(await self._place())

    @contextlib.asynccontextmanager
    async def dedicated(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of our own for one long task (an attempt's heartbeats): new from the
        DSN or, given a single connection, a second one to the same database (a pool lends
        one per statement instead: :meth:`execute`)."""
        if self._given is None:
            async with await self.connect() as conn:
                yield conn
            return
        try:
            second = await self.connect()
        except DatabaseUnavailable as exc:
            log.warning("replaysafe_pg: cannot open a second connection (%s); heartbeats share "
                        "the given one and may wait for its other statements", exc)
            yield self._given
            return
        async with second:
            yield second

    @contextlib.asynccontextmanager
    async def _pooled(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """See :meth:`SyncSource._pooled`."""
        assert self._pool is not None
        for _ in range(_POOL_TRIES):
            async with self._pool.connection() as conn:
                if not dropped(conn):
                    yield conn
                    return
                await conn.close()
        async with self._pool.connection() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._pool is not None:
            async with self._pooled() as conn:
                yield conn
            return
        if self._given is not None:
            yield self._given
            return
        async with self._own_lock():  # for the statement too: see SyncSource.connection
            yield await self._usable_own()

    def _own_lock(self) -> asyncio.Lock:
        """The lock of the own connection, made on first use (inside the event loop)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _usable_own(self) -> psycopg.AsyncConnection[Any]:
        """See :meth:`SyncSource._usable_own`; the caller holds ``self._lock``."""
        own = self._own
        if own is None or not _usable(own):
            if own is not None:
                await own.close()
            own = self._own = await self.connect()
        return own

    async def execute(self, query: LiteralString, params: dict[str, Any], *,
                      alone: bool = False, binary: bool = False,
                      first: First | None = None) -> list[tuple[Any, ...]]:
        """See :meth:`SyncSource.execute`."""
        params, first = _lead(_split_grant(self._use_grant, query, params), first)
        if self._given is not None:
            if self._given_lock is None:
                self._given_lock = asyncio.Lock()
            async with self._given_lock:
                return await aexecute_on(self._given, query, params, alone=alone, binary=binary,
                                         prepare=self.prepare, first=first)
        if self._pool is None:  # as SyncSource.execute: the common case without connection()
            with wrap_errors():
                async with self._own_lock():
                    return await aexecute_on(await self._usable_own(), query, params,
                                             alone=alone, binary=binary, prepare=self.prepare,
                                             first=first)
        with wrap_errors():
            async with self.connection() as conn:
                return await aexecute_on(conn, query, params, alone=alone, binary=binary,
                                         prepare=self.prepare, first=first)

    def refuse_open_transaction(self, message: str) -> None:
        """See :meth:`SyncSource.refuse_open_transaction`."""
        if self._given is not None and self._given.info.transaction_status in _OPEN:
            raise InvalidArgument(message)

    async def execute_aside(self, query: LiteralString, params: dict[str, Any], *,
                            alone: bool = False) -> list[tuple[Any, ...]]:
        """See :meth:`SyncSource.execute_aside`."""
        if self._given is not None:
            async with self._own_lock():
                try:
                    conn: psycopg.AsyncConnection[Any] | None = await self._usable_own()
                except DatabaseUnavailable:
                    conn = None
                if conn is not None:
                    params, first = _split_grant(self._use_grant, query, params)
                    return await aexecute_on(conn, query, params, alone=alone,
                                             prepare=self.prepare, first=first)
        return await self.execute(query, params, alone=alone)

    async def close(self) -> None:
        self._listener = None
        if self._own is not None:
            await self._own.close()
            self._own = None
