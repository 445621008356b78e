"""``Threads`` and ``AsyncThreads``: versioned thread state, one method per SQL function.

Every write is a compare-and-swap: ``write`` needs the version the caller last read (``0`` to
create) and raises :class:`~replaysafe_pg.errors.StaleStateError` when another write got
there first. Each method is one round trip (a named query from ``sql/queries.sql``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from replaysafe_pg import _args, _json, queries
from replaysafe_pg._conn import AsyncConninfo, AsyncSource, Conninfo, SyncSource
from replaysafe_pg.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class ThreadState:
    """What ``read_thread`` answered: ``version`` 0 and ``state`` None when the thread was
    never written; the tombstone's version and ``state`` None after a delete."""

    version: int
    state: dict[str, Any] | None
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class ThreadVersion:
    """One kept version from ``thread_history``."""

    version: int
    state: dict[str, Any]
    created_at: datetime


class _ThreadsBase:
    """Parameters in, values out: shared by the sync and async flavours."""

    def __init__(self, *, tenant_id: str, user_id: str | None) -> None:
        self.tenant_id = _args.text_id(tenant_id, "tenant_id")
        self.user_id = _args.optional_id(user_id, "user_id")

    def _key(self, thread_id: str) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "thread_id": _args.text_id(thread_id, "thread_id"),
                "user_id": self.user_id}

    def _write_params(self, thread_id: str, state: dict[str, Any], expected_version: int,
                      history_limit: int | None) -> dict[str, Any]:
        if isinstance(expected_version, bool) or not isinstance(expected_version, int):
            raise InvalidArgument("expected_version must be an int (0 creates the thread)")
        return self._key(thread_id) | {
            "expected_version": expected_version,
            "state": _json.dumps_object(state, "state"),
            "history_limit": None if history_limit is None
            else _args.integer(history_limit, "history_limit"),
        }

    def _history_params(self, thread_id: str, limit: int) -> dict[str, Any]:
        return self._key(thread_id) | {"limit": _args.integer(limit, "limit")}


class Threads(_ThreadsBase):
    """Thread state for one tenant (and optionally one user), synchronous.

    ``conninfo`` is a DSN (one autocommit connection is opened lazily), a psycopg connection,
    or a psycopg_pool pool. With ``user_id``, threads this object creates belong to that user,
    and threads of other users raise :class:`~replaysafe_pg.errors.AccessDenied`.
    """

    def __init__(self, conninfo: Conninfo, *, tenant_id: str = "default",
                 user_id: str | None = None) -> None:
        super().__init__(tenant_id=tenant_id, user_id=user_id)
        self._source = SyncSource(conninfo)

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, thread_id: str) -> ThreadState:
        """``read_thread``: the latest version and state."""
        row = self._source.execute(queries.get("read_thread"), self._key(thread_id))[0]
        return ThreadState(*row)

    def write(self, thread_id: str, state: dict[str, Any], expected_version: int, *,
              history_limit: int | None = None) -> int:
        """``write_thread``: store ``state`` if the thread is still at ``expected_version``;
        returns the new version. ``history_limit`` becomes the thread's limit."""
        params = self._write_params(thread_id, state, expected_version, history_limit)
        version: int = self._source.execute(queries.get("write_thread"), params)[0][0]
        return version

    def history(self, thread_id: str, *, limit: int = 100) -> list[ThreadVersion]:
        """``thread_history``: kept versions, newest first."""
        rows = self._source.execute(queries.get("thread_history"),
                                    self._history_params(thread_id, limit))
        return [ThreadVersion(*r) for r in rows]

    def delete(self, thread_id: str) -> bool:
        """``delete_thread``: False if the thread is absent or already deleted."""
        deleted: bool = self._source.execute(queries.get("delete_thread"),
                                             self._key(thread_id))[0][0]
        return deleted


class AsyncThreads(_ThreadsBase):
    """Thread state for one tenant (asyncio); same methods as :class:`Threads`."""

    def __init__(self, conninfo: AsyncConninfo, *, tenant_id: str = "default",
                 user_id: str | None = None) -> None:
        super().__init__(tenant_id=tenant_id, user_id=user_id)
        self._source = AsyncSource(conninfo)

    async def close(self) -> None:
        await self._source.close()

    async def __aenter__(self) -> AsyncThreads:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def read(self, thread_id: str) -> ThreadState:
        rows = await self._source.execute(queries.get("read_thread"), self._key(thread_id))
        return ThreadState(*rows[0])

    async def write(self, thread_id: str, state: dict[str, Any], expected_version: int, *,
                    history_limit: int | None = None) -> int:
        params = self._write_params(thread_id, state, expected_version, history_limit)
        version: int = (await self._source.execute(queries.get("write_thread"), params))[0][0]
        return version

    async def history(self, thread_id: str, *, limit: int = 100) -> list[ThreadVersion]:
        rows = await self._source.execute(queries.get("thread_history"),
                                          self._history_params(thread_id, limit))
        return [ThreadVersion(*r) for r in rows]

    async def delete(self, thread_id: str) -> bool:
        deleted: bool = (await self._source.execute(queries.get("delete_thread"),
                                                    self._key(thread_id)))[0][0]
        return deleted
