"""Background heartbeats for the actions ``Ledger.run`` and ``AsyncLedger.run`` execute.

Sync: one daemon thread per ledger serves every running action: registering an action costs a
heap push, and nothing is sent for tools that return before a third of their lease. The
thread opens its own connection (from a DSN) only when a heartbeat is due, so a heartbeat
never waits behind the records and claims on the ledger's connection.

Async: one task per running action, on a connection opened only once a heartbeat is due
(from a pool, one borrowed per beat: never held while the task sleeps).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from replaysafe_pg._conn import AsyncSource, SyncSource, aexecute_on, dropped, execute_on
from replaysafe_pg.errors import LeaseLost
from replaysafe_pg.run_policy import RETRY_ERRORS, Ticket, lease_lost_warning
from replaysafe_pg.statements import Statement

log = logging.getLogger("replaysafe_pg.run")


class Heartbeats:
    """The thread that sends the heartbeats of a sync ledger's running attempts."""

    def __init__(self, source: SyncSource) -> None:
        self._source = source
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Ticket]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf
        self._closed = False
        self._conn: psycopg.Connection[Any] | None = None

    def start(self, ticket: Ticket) -> None:
        due = time.monotonic() + ticket.first_beat
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._heap, (due, next(self._seq), ticket))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="replaysafe-heartbeat",
                                                daemon=True)
                self._thread.start()
            elif due < self._wake_at:
                self._cond.notify()

    @staticmethod
    def stop(ticket: Ticket) -> None:
        ticket.done = True  # dropped from the heap when it comes up

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _next_due(self) -> list[Ticket] | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    break
                self._wake_at = self._heap[0][0] if self._heap else math.inf
                self._cond.wait(None if not self._heap else self._heap[0][0] - now)
            self._wake_at = -math.inf  # busy: the loop looks at the heap again before sleeping
            due: list[Ticket] = []
            while self._heap and self._heap[0][0] <= now:
                ticket = heapq.heappop(self._heap)[2]
                if not ticket.done:
                    due.append(ticket)
            return due

    def _loop(self) -> None:
        while (due := self._next_due()) is not None:
            for ticket in due:
                delay = self._beat(ticket)
                if delay is not None and not ticket.done:
                    with self._cond:
                        heapq.heappush(self._heap,
                                       (time.monotonic() + delay, next(self._seq), ticket))

    def _execute(self, statement: Statement[Any]) -> None:
        query, params = statement.query, statement.params
        if self._source.pooled:
            self._source.execute(query, params)  # a pool lends one per beat
            return
        # Our own autocommit connection, also when the ledger was given one: a heartbeat
        # must commit at once, never wait in (or join) the caller's transaction.
        if self._conn is None or dropped(self._conn):
            if self._conn is not None:
                self._conn.close()
            self._conn = self._source.connect()
        execute_on(self._conn, query, params, prepare=self._source.prepare)

    def _beat(self, ticket: Ticket) -> float | None:
        """Heartbeat once; seconds until the next one, or None to stop."""
        sent_at = time.monotonic()
        try:
            self._execute(ticket.heartbeat)
            ticket.extended(sent_at)
        except LeaseLost:
            # While the outcome is being written, the write itself tells whether the lease
            # held (a heartbeat that lands after it committed is refused: that is no loss).
            if not ticket.recording and not ticket.done:
                ticket.lease_lost = True
                lease_lost_warning(ticket.action_key, ticket.attempt, "heartbeat refused")
            return None
        except RETRY_ERRORS as exc:
            log.warning("heartbeat for action %r (attempt %d) failed, retrying: %s",
                        ticket.action_key, ticket.attempt, exc)
            if self._conn is not None and (self._conn.closed or self._conn.broken):
                self._conn = None
            return ticket.retry_delay
        except Exception:
            log.exception("heartbeat for action %r (attempt %d) failed", ticket.action_key,
                          ticket.attempt)
            return ticket.interval / 2
        return ticket.interval


class AsyncHeartbeats:
    """A task per running attempt: extend the lease every third of it, on a connection
    opened only once one is due."""

    def __init__(self, source: AsyncSource) -> None:
        self._source = source
        self._tasks: dict[Ticket, asyncio.Task[None]] = {}

    def start(self, ticket: Ticket) -> None:
        self._tasks[ticket] = asyncio.create_task(self._beat(ticket))

    def stop(self, ticket: Ticket) -> None:
        ticket.done = True
        task = self._tasks.pop(ticket)
        task.cancel()
        task.add_done_callback(_consume)

    async def _beat(self, ticket: Ticket) -> None:
        await asyncio.sleep(ticket.first_beat)
        while True:
            try:
                if self._source.pooled:  # a pool lends one per beat: never held while asleep
                    await self._beats(ticket, self._source.execute)
                else:
                    async with self._source.dedicated() as conn:
                        await self._beats(ticket, functools.partial(
                            aexecute_on, conn, prepare=self._source.prepare))
            except LeaseLost:
                if not ticket.recording and not ticket.done:  # as the sync heartbeat
                    ticket.lease_lost = True
                    lease_lost_warning(ticket.action_key, ticket.attempt, "heartbeat refused")
                return
            except RETRY_ERRORS as exc:
                log.warning("heartbeat for action %r (attempt %d) failed, retrying: %s",
                            ticket.action_key, ticket.attempt, exc)
                await asyncio.sleep(ticket.retry_delay)
            except Exception:
                # As the sync heartbeat does: never die silently while the tool still runs.
                log.exception("heartbeat for action %r (attempt %d) failed", ticket.action_key,
                              ticket.attempt)
                await asyncio.sleep(ticket.interval / 2)

    @staticmethod
    async def _beats(ticket: Ticket, send: Callable[..., Awaitable[Any]]) -> None:
        query = ticket.heartbeat.query
        while True:
            sent_at = time.monotonic()
            await send(query, ticket.heartbeat.params)  # a grant's current value, each beat
            ticket.extended(sent_at)
            await asyncio.sleep(ticket.interval)


def _consume(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("heartbeat task failed", exc_info=task.exception())
