"""One LISTEN session per driver object, shared by every waiter of ``Ledger.run``.

A waiter subscribes to its action's key before it claims again (so no wake-up can be
missed), then waits for the key's NOTIFY, at most :data:`POLL_INTERVAL`, and claims again.
The session is one connection outside the caller's pool, opened on the first wait and kept
until the ledger closes; a waiter holds nothing the owner of the action needs (its claims
borrow a connection for one statement each).

Behind a transaction pooler a LISTEN lands on whichever server connection serves it and
hears nothing afterwards: there the waiters' claims every :data:`POLL_INTERVAL` carry the
wake-ups (give the ledger ``listen=`` a direct DSN, or ``listen=False``: docs/deploying.md).
A session that cannot be opened, or dies, is logged and opened again on a later wait; its
waiters are woken to claim again at once (a NOTIFY may have been lost with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

log = logging.getLogger("replaysafe_pg.run")

CHANNEL = "replaysafe_actions"
LISTEN = "LISTEN replaysafe_actions"
# A waiter claims again at least this often (seconds), whether or not its session hears.
POLL_INTERVAL = 1.0
# After a failure to open the session, waits go without one for this long (seconds).
REOPEN_DELAY = 1.0
# How often an idle sync reader looks whether its listener was closed (seconds).
_READ_TICK = 0.2

Connect = Callable[[], psycopg.Connection[Any]]
AsyncConnect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]


class _Subscribers:
    """Who waits for which key; shared by both flavours."""

    def __init__(self) -> None:
        self.by_key: dict[str, set[Any]] = {}
        self.failed_at: float | None = None

    def add(self, key: str, event: Any) -> None:
        self.by_key.setdefault(key, set()).add(event)

    def discard(self, key: str, event: Any) -> None:
        events = self.by_key.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self.by_key[key]

    def wake(self, key: str | None) -> None:
        """Wake the waiters of ``key`` (None: every waiter)."""
        groups = self.by_key.values() if key is None else [self.by_key.get(key, ())]
        for events in groups:
            for event in events:
                event.set()

    def may_open(self) -> bool:
        return self.failed_at is None or time.monotonic() - self.failed_at >= REOPEN_DELAY

    def opening_failed(self, exc: BaseException) -> None:
        self.failed_at = time.monotonic()
        log.warning("replaysafe_pg: cannot LISTEN for wake-ups (%s); waiters claim again every "
                    "%g s meanwhile", exc, POLL_INTERVAL)


class Listener:
    """The LISTEN session of a sync driver object (``connect`` None: none; waiters poll)."""

    def __init__(self, connect: Connect | None) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self._subscribers = _Subscribers()
        self._conn: psycopg.Connection[Any] | None = None
        self._reader: threading.Thread | None = None
        self._closed = False

    def subscribe(self, key: str) -> threading.Event:
        """An event set when ``key`` is notified; the session LISTENs before this returns
        (when it can)."""
        event = threading.Event()
        with self._lock:
            self._subscribers.add(key, event)
            self._ensure_open()
        return event

    def unsubscribe(self, key: str, event: threading.Event) -> None:
        with self._lock:
            self._subscribers.discard(key, event)

    def _ensure_open(self) -> None:
        if (self._connect is None or self._closed or self._conn is not None
                or not self._subscribers.may_open()):
            return
        try:
            conn = self._connect()
            try:
                conn.execute(LISTEN)
            except BaseException:
                conn.close()
                raise
        except Exception as exc:
            self._subscribers.opening_failed(exc)
            return
        self._conn = conn
        self._reader = threading.Thread(target=self._read, args=(conn,), daemon=True,
                                        name="replaysafe-listen")
        self._reader.start()

    def _read(self, conn: psycopg.Connection[Any]) -> None:
        try:
            while not self._closed:
                for note in conn.notifies(timeout=_READ_TICK):
                    if note.channel == CHANNEL:
                        with self._lock:
                            self._subscribers.wake(note.payload)
        except psycopg.Error as exc:
            if not self._closed:
                log.warning("replaysafe_pg: the LISTEN session failed (%s); opening another "
                            "on the next wait", exc)
        finally:
            with self._lock:
                if self._conn is conn:
                    self._conn = None
                self._subscribers.wake(None)  # claim again now: a wake-up may be lost
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            reader = self._reader
        if reader is not None:
            reader.join(timeout=2 * _READ_TICK + 1.0)


class AsyncListener:
    """The LISTEN session of an asyncio driver object; see :class:`Listener`."""

    def __init__(self, connect: AsyncConnect | None) -> None:
        self._connect = connect
        self._lock: asyncio.Lock | None = None
        self._subscribers = _Subscribers()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    async def subscribe(self, key: str) -> asyncio.Event:
        """See :meth:`Listener.subscribe`."""
        event = asyncio.Event()
        self._subscribers.add(key, event)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await self._ensure_open()
        return event

    def unsubscribe(self, key: str, event: asyncio.Event) -> None:
        self._subscribers.discard(key, event)

    async def _ensure_open(self) -> None:
        if (self._connect is None or self._closed or self._conn is not None
                or not self._subscribers.may_open()):
            return
        try:
            conn = await self._connect()
            try:
                await conn.execute(LISTEN)
            except BaseException:
                await conn.close()
                raise
        except Exception as exc:
            self._subscribers.opening_failed(exc)
            return
        self._conn = conn
        self._reader = asyncio.get_running_loop().create_task(self._read(conn))

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            async for note in conn.notifies():
                if note.channel == CHANNEL:
                    self._subscribers.wake(note.payload)
        except psycopg.Error as exc:
            if not self._closed:
                log.warning("replaysafe_pg: the LISTEN session failed (%s); opening another "
                            "on the next wait", exc)
        finally:
            if self._conn is conn:
                self._conn = None
            self._subscribers.wake(None)
            await conn.close()

    async def close(self) -> None:
        self._closed = True
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                await reader


class Subscription:
    """One waiter's subscription to its key on a :class:`Listener` (one key at a time)."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._key: str | None = None
        self._event: threading.Event | None = None

    def subscribe(self, key: str) -> None:
        self.drop()
        self._event = self._listener.subscribe(key)
        self._key = key

    def wait(self, seconds: float) -> None:
        """Until the key is notified, at most ``seconds``."""
        if self._event is not None:
            self._event.wait(seconds)

    def drop(self) -> None:
        if self._key is not None and self._event is not None:
            self._listener.unsubscribe(self._key, self._event)
        self._key = self._event = None


class AsyncSubscription:
    """See :class:`Subscription`."""

    def __init__(self, listener: AsyncListener) -> None:
        self._listener = listener
        self._key: str | None = None
        self._event: asyncio.Event | None = None

    async def subscribe(self, key: str) -> None:
        self.drop()
        self._event = await self._listener.subscribe(key)
        self._key = key

    async def wait(self, seconds: float) -> None:
        if self._event is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._event.wait()

    def drop(self) -> None:
        if self._key is not None and self._event is not None:
            self._listener.unsubscribe(self._key, self._event)
        self._key = self._event = None
