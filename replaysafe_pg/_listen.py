"""The LISTEN session that wakes the waiters of ``Ledger.run``: one per place and process.

A waiter subscribes to its action's key, claims again, then waits for the key's NOTIFY — at
most :data:`POLL_INTERVAL` — and claims again. Every driver object of a process that listens
at the same place shares one session (per event loop, in the asyncio flavour): one
connection outside any pool, opened by its reader (a thread, or a task) when a first waiter
subscribes and closed again once nobody has waited for :data:`IDLE_CLOSE` seconds, or once
no driver object refers to it any more. A subscriber waits at most :data:`LISTEN_WAIT` for a
session that is opening, so that LISTEN comes before its claim; a waiter never waits on the
connection itself, and holds nothing the owner of its action needs.

Behind a transaction pooler a LISTEN lands on whichever server connection serves it and
hears nothing afterwards (it stays registered there, for other clients). So a session for
the place the driver object's own connections go is first probed as the statements' are
(:mod:`replaysafe_pg._prepared`): through a pooler it never LISTENs and the waiters' claims
every second carry the wake-ups. A DSN given as ``listen=`` is trusted (a direct one, or a
session pooler). A session that fails, or cannot be opened, wakes its waiters to claim at
once; it is opened again on a later wait, at most once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, LiteralString

import psycopg
from psycopg.rows import tuple_row

log = logging.getLogger("replaysafe_pg.run")

CHANNEL = "replaysafe_actions"
LISTEN: LiteralString = "LISTEN replaysafe_actions"
PROBE: LiteralString = "SELECT pg_catalog.pg_backend_pid()"


def own_session(rows: list[tuple[Any, ...]], conn: Any) -> bool:
    """Is the server session :data:`PROBE` answered ``rows`` on the connection's own? The
    backend pid of the connection's startup answer (libpq's BackendKeyData) is the server's
    only on a direct connection: a pooler answers the startup before it lends a server
    connection, with a pid of its own making (PgBouncer's is random)."""
    return bool(rows) and rows[0][0] == conn.info.backend_pid


# A waiter claims again at least this often (seconds), whether or not the session hears.
POLL_INTERVAL = 1.0
# How long a subscriber waits for a session that is being opened (seconds).
LISTEN_WAIT = 0.2
# A session nobody waited on for this long is closed (seconds).
IDLE_CLOSE = 10.0
# After a failure to open the session, waits go without one for this long (seconds).
REOPEN_DELAY = 1.0
# How often a reader looks whether its listener is still wanted (seconds).
_READ_TICK = 0.2

Connect = Callable[[], psycopg.Connection[Any]]
AsyncConnect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]


class _Subscribers:
    """Who waits for which key, and the session's state; shared by both flavours."""

    def __init__(self, target: str, probe: bool) -> None:
        self.target = target
        self.probe = probe
        self.by_key: dict[str, set[Any]] = {}
        self.failed_at: float | None = None
        self.deaf = False
        self.idle_since = time.monotonic()

    def add(self, key: str, event: Any) -> None:
        self.by_key.setdefault(key, set()).add(event)

    def discard(self, key: str, event: Any) -> None:
        events = self.by_key.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self.by_key[key]
        if not self.by_key:
            self.idle_since = time.monotonic()

    def wake(self, key: str | None) -> None:
        """Wake the waiters of ``key`` (None: every waiter)."""
        groups = list(self.by_key.values()) if key is None else [self.by_key.get(key, set())]
        for events in groups:
            for event in events:
                event.set()

    def may_open(self) -> bool:
        return not self.deaf and (
            self.failed_at is None or time.monotonic() - self.failed_at >= REOPEN_DELAY)

    def idle(self) -> bool:
        return not self.by_key and time.monotonic() - self.idle_since >= IDLE_CLOSE

    def opening_failed(self, exc: BaseException) -> None:
        self.failed_at = time.monotonic()
        log.warning("replaysafe_pg: cannot LISTEN for wake-ups (%s); waiters claim again every "
                    "%g s meanwhile", exc, POLL_INTERVAL)

    def heard_nothing(self) -> None:
        self.deaf = True
        log.info("replaysafe_pg: the connections for LISTEN go through a pooler, where LISTEN "
                 "hears nothing; waiters claim again every %g s (give the ledger listen= a "
                 "direct DSN for immediate wake-ups)", POLL_INTERVAL)

    def ended(self, failure: BaseException | None, opened: bool) -> None:
        """The reader is gone (``failure``: why; ``opened``: after its LISTEN)."""
        if failure is not None and opened:
            log.warning("replaysafe_pg: the LISTEN session failed (%s); opening another on "
                        "the next wait", failure)
        elif failure is not None:
            self.opening_failed(failure)
        self.wake(None)  # claim again now: a wake-up may have been lost

    def own_session(self, rows: list[tuple[Any, ...]], conn: Any) -> bool:
        """Probed (or trusted): may ``conn`` LISTEN?"""
        if self.probe and not own_session(rows, conn):
            self.heard_nothing()
            return False
        return True


class Listener:
    """The shared LISTEN session of sync driver objects for one place; see the module."""

    def __init__(self, connect: Connect, target: str, probe: bool) -> None:
        self._connect = connect
        self._subscribers = _Subscribers(target, probe)
        self._after_fork()
        _EVERY.add(self)

    def _after_fork(self) -> None:
        """No reader (a forked child has none), a new lock and readiness."""
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    def subscribe(self, key: str) -> threading.Event:
        """An event set when ``key`` is notified (or the session failed)."""
        event = threading.Event()
        try:
            with self._lock:
                self._subscribers.add(key, event)
                reader = self._reader
                if reader is not None and not reader.is_alive():
                    reader = self._reader = None
                    self._ready.clear()
                if reader is None and self._subscribers.may_open():
                    self._ready.clear()
                    reader = threading.Thread(
                        target=_read, args=(weakref.ref(self), self._connect), daemon=True,
                        name="replaysafe-listen")
                    reader.start()
                    self._reader = reader
            if reader is not None:
                self._ready.wait(LISTEN_WAIT)
        except BaseException:
            self.unsubscribe(key, event)
            raise
        return event

    def unsubscribe(self, key: str, event: threading.Event) -> None:
        with self._lock:
            self._subscribers.discard(key, event)

    def _open(self, conn: psycopg.Connection[Any]) -> bool:
        """Probe (for the driver's own place) and LISTEN on ``conn``."""
        rows = conn.cursor(row_factory=tuple_row).execute(PROBE).fetchall() \
            if self._subscribers.probe else []
        with self._lock:
            if not self._subscribers.own_session(rows, conn):
                return False
        conn.execute(LISTEN)
        with self._lock:
            self._ready.set()
            # Who subscribed before the LISTEN (a subscriber waits only LISTEN_WAIT for it)
            # may have missed a NOTIFY: claim once more.
            self._subscribers.wake(None)
        return True

    def _wake(self, key: str | None) -> None:
        with self._lock:
            self._subscribers.wake(key)

    def _wanted(self) -> bool:
        with self._lock:
            return not self._subscribers.idle()

    def _done(self, failure: BaseException | None, opened: bool) -> None:
        with self._lock:
            self._reader = None
            self._ready.clear()
            self._subscribers.ended(failure, opened)


def _read(ref: weakref.ref[Listener], connect: Connect) -> None:
    """A sync listener's reader: holds the listener only by a weak reference, so a listener
    no driver object refers to any more is collected and its session closed."""
    failure: BaseException | None = None
    opened = False
    conn: psycopg.Connection[Any] | None = None
    try:
        conn = connect()
        listener = ref()
        if listener is None or not listener._open(conn):
            return
        opened = True
        del listener
        while (listener := ref()) is not None and listener._wanted():
            del listener
            for note in conn.notifies(timeout=_READ_TICK):
                if note.channel == CHANNEL and (listener := ref()) is not None:
                    listener._wake(note.payload)
                    del listener
    except Exception as exc:
        failure = exc
    finally:
        if conn is not None:
            conn.close()
        if (listener := ref()) is not None:
            listener._done(failure, opened)


class AsyncListener:
    """The shared LISTEN session of asyncio driver objects for one place and event loop."""

    def __init__(self, connect: AsyncConnect, target: str, probe: bool) -> None:
        self._connect = connect
        self._subscribers = _Subscribers(target, probe)
        self._ready = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def subscribe(self, key: str) -> asyncio.Event:
        """See :meth:`Listener.subscribe`."""
        event = asyncio.Event()
        self._subscribers.add(key, event)
        try:
            if self._reader is not None and self._reader.done():
                self._reader = None
                self._ready.clear()
            if self._reader is None and self._subscribers.may_open():
                self._ready.clear()
                self._reader = asyncio.get_running_loop().create_task(
                    _aread(weakref.ref(self), self._connect))
            if self._reader is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LISTEN_WAIT):
                        await self._ready.wait()
        except BaseException:
            self._subscribers.discard(key, event)
            raise
        return event

    def unsubscribe(self, key: str, event: asyncio.Event) -> None:
        self._subscribers.discard(key, event)

    async def _open(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        rows: list[tuple[Any, ...]] = []
        if self._subscribers.probe:
            cur = conn.cursor(row_factory=tuple_row)
            rows = await (await cur.execute(PROBE)).fetchall()
        if not self._subscribers.own_session(rows, conn):
            return False
        await conn.execute(LISTEN)
        self._ready.set()
        self._subscribers.wake(None)  # see Listener._open
        return True

    def _done(self, failure: BaseException | None, opened: bool) -> None:
        self._reader = None
        self._ready.clear()
        self._subscribers.ended(failure, opened)


async def _aread(ref: weakref.ref[AsyncListener], connect: AsyncConnect) -> None:
    """See :func:`_read`."""
    failure: BaseException | None = None
    opened = False
    conn: psycopg.AsyncConnection[Any] | None = None
    try:
        conn = await connect()
        listener = ref()
        if listener is None or not await listener._open(conn):
            return
        opened = True
        del listener
        while (listener := ref()) is not None and not listener._subscribers.idle():
            del listener
            async for note in conn.notifies(timeout=_READ_TICK):
                if note.channel == CHANNEL and (listener := ref()) is not None:
                    listener._subscribers.wake(note.payload)
                    del listener
    except Exception as exc:
        failure = exc
    finally:
        if conn is not None:
            await conn.close()
        if (listener := ref()) is not None:
            listener._done(failure, opened)


# One listener per place (and event loop), shared by the driver objects that listen there.
_SHARED: weakref.WeakValueDictionary[tuple[str, bool], Listener] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()
_EVERY: weakref.WeakSet[Listener] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child inherits the listeners but not their readers (nor a lock's owner)."""
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for listener in list(_EVERY):
        listener._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
_ASYNC_SHARED: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakValueDictionary[tuple[str, bool], AsyncListener]
] = weakref.WeakKeyDictionary()


def listener_for(target: str, connect: Connect, *, probe: bool) -> Listener:
    """The process's listener for ``target`` (a conninfo), made on first use."""
    with _SHARED_LOCK:
        listener = _SHARED.get((target, probe))
        if listener is None:
            listener = _SHARED[(target, probe)] = Listener(connect, target, probe)
        return listener


def async_listener_for(target: str, connect: AsyncConnect, *, probe: bool) -> AsyncListener:
    """The running event loop's listener for ``target``, made on first use."""
    loop = asyncio.get_running_loop()
    listeners = _ASYNC_SHARED.setdefault(loop, weakref.WeakValueDictionary())
    listener = listeners.get((target, probe))
    if listener is None:
        listener = listeners[(target, probe)] = AsyncListener(connect, target, probe)
    return listener


class Subscription:
    """One waiter's subscription to its key (one key at a time); ``listener`` None: the
    driver object does not listen (the waiter only polls)."""

    def __init__(self, listener: Listener | None) -> None:
        self._listener = listener
        self._key: str | None = None
        self._event: threading.Event | None = None

    def subscribe(self, key: str) -> None:
        self.drop()
        if self._listener is not None:
            self._event = self._listener.subscribe(key)
            self._key = key

    def wait(self, seconds: float) -> None:
        """Until the key is notified, at most ``seconds``."""
        if self._event is not None:
            self._event.wait(seconds)
        else:
            time.sleep(seconds)

    def drop(self) -> None:
        if self._listener is not None and self._key is not None and self._event is not None:
            self._listener.unsubscribe(self._key, self._event)
        self._key = self._event = None


class AsyncSubscription:
    """See :class:`Subscription`."""

    def __init__(self, listener: AsyncListener | None) -> None:
        self._listener = listener
        self._key: str | None = None
        self._event: asyncio.Event | None = None

    async def subscribe(self, key: str) -> None:
        self.drop()
        if self._listener is not None:
            self._event = await self._listener.subscribe(key)
            self._key = key

    async def wait(self, seconds: float) -> None:
        if self._event is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._event.wait()

    def drop(self) -> None:
        if self._listener is not None and self._key is not None and self._event is not None:
            self._listener.unsubscribe(self._key, self._event)
        self._key = self._event = None
