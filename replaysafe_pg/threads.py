"""``Threads`` and ``AsyncThreads``: versioned thread state, one method per SQL function.

Every write is a compare-and-swap: ``write`` needs the version the caller last read (``0`` to
create) and raises :class:`~replaysafe_pg.errors.StaleStateError` when another write got
there first. Each method is one round trip; its parameters and answer are those of
:class:`~replaysafe_pg.statements.ThreadStatements`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from replaysafe_pg._conn import AsyncConninfo, AsyncSource, Conninfo, SyncSource
from replaysafe_pg._grant import GrantArg
from replaysafe_pg.limits import DEFAULT_LIMITS, Limits
from replaysafe_pg.models import ThreadState, ThreadVersion
from replaysafe_pg.statements import Lease, Statement, ThreadStatements

__all__ = ["AsyncThreads", "ThreadState", "ThreadVersion", "Threads"]

T = TypeVar("T")


class _ThreadsBase:
    """What both flavours share: the calls bound to tenant and user."""

    def __init__(self, *, tenant_id: str | None, user_id: str | None,
                 grant: GrantArg | None, limits: Limits) -> None:
        self._sql = ThreadStatements(tenant_id, user_id, grant, limits)

    @property
    def tenant_id(self) -> str:
        return self._sql.tenant_id

    @property
    def user_id(self) -> str | None:
        """The ``user_id`` given (under a grant that names a user and without one, the
        database takes the grant's user)."""
        return self._sql.user_id

    @property
    def limits(self) -> Limits:
        """The size limits checked before anything is sent (docs/python.md#size-limits)."""
        return self._sql.limits


class Threads(_ThreadsBase):
    """Thread state for one tenant (and optionally one user), synchronous.

    ``conninfo`` is a DSN (one autocommit connection is opened lazily), a psycopg connection,
    or a psycopg_pool pool. With ``user_id``, threads this object creates belong to that user,
    and threads of other users raise :class:`~replaysafe_pg.errors.AccessDenied`.
    ``prepare``: where statements are prepared (see :class:`~replaysafe_pg.Ledger`).
    ``grant``: a tenant grant or a callable returning the current one, sent with every call
    (see :class:`~replaysafe_pg.Ledger`); ``tenant_id`` may then be omitted. A grant that
    names a user restricts this object to that user's threads: ``user_id`` must be that
    user or omitted (the database then takes the grant's user).
    ``limits``: a ``state`` whose JSON is over ``limits.thread_state`` (32 MiB by default)
    raises :class:`~replaysafe_pg.errors.InvalidArgument` before anything is sent
    (docs/python.md#size-limits).
    """

    def __init__(self, conninfo: Conninfo, *, tenant_id: str | None = None,
                 user_id: str | None = None, prepare: bool | None = None,
                 grant: GrantArg | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(tenant_id=tenant_id, user_id=user_id, grant=grant, limits=limits)
        self._source = SyncSource(conninfo, prepare=prepare, listen=False)

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, statement: Statement[T]) -> T:
        return statement.decode(self._source.execute(statement.query, statement.params))

    def read(self, thread_id: str) -> ThreadState:
        """``read_thread``: the latest version and state."""
        return self._send(self._sql.read(thread_id))

    def write(self, thread_id: str, state: dict[str, Any], expected_version: int, *,
              history_limit: int | None = None) -> int:
        """``write_thread``: store ``state`` if the thread is still at ``expected_version``;
        returns the new version. ``history_limit`` becomes the thread's limit."""
        return self._send(self._sql.write(thread_id, state, expected_version, history_limit))

    def history(self, thread_id: str, *, limit: int = 100) -> list[ThreadVersion]:
        """``thread_history``: kept versions, newest first."""
        return self._send(self._sql.history(thread_id, limit))

    def delete(self, thread_id: str) -> bool:
        """``delete_thread``: False if the thread is absent or already deleted."""
        return self._send(self._sql.delete(thread_id))

    def purge(self, older_than: Lease, *, limit: int = 10000, now: datetime | None = None) -> int:
        """``purge_threads`` (an operator's duty): one batch of at most ``limit`` threads and
        ``limit`` LangGraph threads not written for ``older_than``, of every tenant this
        role acts for (under a grant: the grant's tenant). Each purged thread keeps its
        version counter (a tombstone, as :meth:`delete` leaves). Returns how many went."""
        return self._send(self._sql.purge(older_than, limit, now))


class AsyncThreads(_ThreadsBase):
    """Thread state for one tenant (asyncio); same methods as :class:`Threads`."""

    def __init__(self, conninfo: AsyncConninfo, *, tenant_id: str | None = None,
                 user_id: str | None = None, prepare: bool | None = None,
                 grant: GrantArg | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(tenant_id=tenant_id, user_id=user_id, grant=grant, limits=limits)
        self._source = AsyncSource(conninfo, prepare=prepare, listen=False)

    async def close(self) -> None:
        await self._source.close()

    async def __aenter__(self) -> AsyncThreads:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(self, statement: Statement[T]) -> T:
        return statement.decode(await self._source.execute(statement.query, statement.params))

    async def read(self, thread_id: str) -> ThreadState:
        return await self._send(self._sql.read(thread_id))

    async def write(self, thread_id: str, state: dict[str, Any], expected_version: int, *,
                    history_limit: int | None = None) -> int:
        return await self._send(self._sql.write(thread_id, state, expected_version,
                                                  history_limit))

    async def history(self, thread_id: str, *, limit: int = 100) -> list[ThreadVersion]:
        return await self._send(self._sql.history(thread_id, limit))

    async def delete(self, thread_id: str) -> bool:
        return await self._send(self._sql.delete(thread_id))

    async def purge(self, older_than: Lease, *, limit: int = 10000,
                    now: datetime | None = None) -> int:
        """See :meth:`Threads.purge`."""
        return await self._send(self._sql.purge(older_than, limit, now))
