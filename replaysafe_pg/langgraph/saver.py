"""``ReplaysafeSaver`` and ``AsyncReplaysafeSaver``: LangGraph checkpointers on the
``replaysafe`` schema (docs/langgraph.md).

Every method is one call of one ``replaysafe.langgraph_*`` function (one round trip); the
tables are reached only through those functions, for the tenant the saver acts for. A
checkpoint of the run loop whose parent is no longer the newest checkpoint of its thread and
namespace raises :class:`~replaysafe_pg.errors.StaleCheckpointError` (a ``StaleStateError``)
and is not stored: two runs on one thread cannot fork it silently.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from replaysafe_pg._conn import AsyncConninfo, AsyncSource, Conninfo, SyncSource
from replaysafe_pg._grant import GrantArg
from replaysafe_pg.langgraph._codec import Codec, next_version, strict_serde
from replaysafe_pg.limits import DEFAULT_LIMITS, Limits

__all__ = ["AsyncReplaysafeSaver", "ReplaysafeSaver"]


class _Base(BaseCheckpointSaver[str]):
    """Tenant, serializer and version policy of both flavours."""

    _codec: Codec

    def __init__(self, *, tenant_id: str | None, serde: SerializerProtocol | None,
                 history_limit: int | None, allow_pickle: bool,
                 grant: GrantArg | None, limits: Limits) -> None:
        super().__init__(serde=serde if serde is not None else strict_serde())
        self._codec = Codec(tenant_id, self.serde, history_limit, allow_pickle=allow_pickle,
                            grant=grant, limits=limits)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]
                       ) -> BaseCheckpointSaver[str]:
        """LangGraph's strict mode (``LANGGRAPH_STRICT_MSGPACK=true``): ``compile()`` allows
        the graph's own state types through a copy of the saver; its calls use that copy's
        serializer."""
        clone = super().with_allowlist(extra_allowlist)
        if clone is not self and isinstance(clone, _Base):
            clone._codec = self._codec.with_serde(clone.serde)
        return clone

    @property
    def tenant_id(self) -> str:
        return self._codec.tenant_id

    @property
    def limits(self) -> Limits:
        """The size limits checked before anything is sent (docs/python.md#size-limits)."""
        return self._codec.limits

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        return next_version(current)


class ReplaysafeSaver(_Base):
    """A synchronous LangGraph checkpointer for one tenant.

    ``conninfo`` is a DSN (one autocommit connection, opened on first use), a psycopg
    connection or a psycopg_pool ``ConnectionPool``. The tables come with the project's
    migrations (``replaysafe-pg migrate``); :meth:`setup` only checks that they are there.
    ``history_limit``: checkpoints kept per thread and namespace (None: all, as LangGraph's
    savers do); each ``put`` deletes at most 4 of the oldest beyond it, so pruning work per
    write is bounded. The async methods run the sync ones in a worker thread.

    ``serde``: LangGraph's serializer in strict mode by default (a stored value may name only
    LangGraph's safe types and the graph's own state types, never an arbitrary callable).
    ``allow_pickle``: DANGEROUS; load (and store) values of type tag ``pickle``, as
    ``JsonPlusSerializer(pickle_fallback=True)`` writes them: any writer of the tenant's
    checkpoints can then run code in every process that loads them. Refused by default.
    ``prepare``: where statements are prepared (see :class:`~replaysafe_pg.Ledger`).
    ``grant``: a tenant grant, or a callable returning the current one, sent with every call
    (see :class:`~replaysafe_pg.Ledger`); ``tenant_id`` may then be omitted. Under a grant
    that names a user, the saver reaches only that user's threads, and the threads it
    creates are that user's (docs/isolation.md#tenant-grants).
    ``limits``: a checkpoint (its JSON or its metadata's), a channel value or a pending write
    over them (32 MiB each by default) raises :class:`~replaysafe_pg.errors.InvalidArgument`
    before anything is sent (docs/python.md#size-limits).
    """

    def __init__(self, conninfo: Conninfo, *, tenant_id: str | None = None,
                 serde: SerializerProtocol | None = None,
                 history_limit: int | None = None, allow_pickle: bool = False,
                 prepare: bool | None = None, grant: GrantArg | None = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(tenant_id=tenant_id, serde=serde, history_limit=history_limit,
                         allow_pickle=allow_pickle, grant=grant, limits=limits)
        self._source = SyncSource(conninfo, prepare=prepare, listen=False)

    @classmethod
    @contextlib.contextmanager
    def from_conn_string(cls, conn_string: str, *, tenant_id: str | None = None,
                         serde: SerializerProtocol | None = None,
                         history_limit: int | None = None, allow_pickle: bool = False,
                         prepare: bool | None = None, grant: GrantArg | None = None,
                         limits: Limits = DEFAULT_LIMITS) -> Iterator[ReplaysafeSaver]:
        saver = cls(conn_string, tenant_id=tenant_id, serde=serde, history_limit=history_limit,
                    allow_pickle=allow_pickle, prepare=prepare, grant=grant, limits=limits)
        try:
            yield saver
        finally:
            saver.close()

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> ReplaysafeSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        query, params = self._codec.statement(name, params)
        return self._source.execute(query, params, binary=True)

    def setup(self) -> None:
        """Check that the schema is installed and that this role may act for the tenant
        (``SchemaNotInstalled`` / ``AccessDenied`` otherwise); creates nothing."""
        self._call("langgraph_list", self._codec.probe())

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        rows = self._call("langgraph_get_tuple", self._codec.get_tuple(config))
        return self._codec.tuple(rows[0]) if rows else None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        rows = self._call("langgraph_list", self._codec.list(config, filter, before, limit))
        for row in rows:
            yield self._codec.tuple(row)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        params, next_config = self._codec.put(config, checkpoint, metadata, new_versions)
        Codec.check_put(self._call("langgraph_put", params), params)
        return next_config

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self._call("langgraph_put_writes",
                   self._codec.put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._call("langgraph_delete_thread", self._codec.delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        params = self._codec.delete_for_runs(run_ids)
        if params["run_ids"]:
            self._call("langgraph_delete_for_runs", params)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._call("langgraph_copy_thread",
                   self._codec.copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        params = self._codec.prune(thread_ids, strategy)
        if params["thread_ids"]:
            self._call("langgraph_prune", params)

    # The async interface, for a sync saver used by ainvoke/astream: a worker thread each.

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        tuples = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for t in tuples:
            yield t

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


class AsyncReplaysafeSaver(_Base):
    """The asyncio flavour of :class:`ReplaysafeSaver` (``conninfo``: a DSN, a psycopg
    ``AsyncConnection`` or an ``AsyncConnectionPool``). The sync methods may be called from
    another thread than the event loop's (as LangGraph's sync API does with an async saver)."""

    def __init__(self, conninfo: AsyncConninfo, *, tenant_id: str | None = None,
                 serde: SerializerProtocol | None = None,
                 history_limit: int | None = None, allow_pickle: bool = False,
                 prepare: bool | None = None, grant: GrantArg | None = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(tenant_id=tenant_id, serde=serde, history_limit=history_limit,
                         allow_pickle=allow_pickle, grant=grant, limits=limits)
        self._source = AsyncSource(conninfo, prepare=prepare, listen=False)
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    @classmethod
    @contextlib.asynccontextmanager
    async def from_conn_string(cls, conn_string: str, *, tenant_id: str | None = None,
                               serde: SerializerProtocol | None = None,
                               history_limit: int | None = None, allow_pickle: bool = False,
                               prepare: bool | None = None, grant: GrantArg | None = None,
                               limits: Limits = DEFAULT_LIMITS
                               ) -> AsyncIterator[AsyncReplaysafeSaver]:
        saver = cls(conn_string, tenant_id=tenant_id, serde=serde, history_limit=history_limit,
                    allow_pickle=allow_pickle, prepare=prepare, grant=grant, limits=limits)
        try:
            yield saver
        finally:
            await saver.aclose()

    async def aclose(self) -> None:
        await self._source.close()

    async def __aenter__(self) -> AsyncReplaysafeSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        query, params = self._codec.statement(name, params)
        return await self._source.execute(query, params, binary=True)

    async def setup(self) -> None:
        """See :meth:`ReplaysafeSaver.setup`."""
        await self._call("langgraph_list", self._codec.probe())

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        rows = await self._call("langgraph_get_tuple", self._codec.get_tuple(config))
        return self._codec.tuple(rows[0]) if rows else None

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        rows = await self._call("langgraph_list", self._codec.list(config, filter, before, limit))
        for row in rows:
            yield self._codec.tuple(row)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        params, next_config = self._codec.put(config, checkpoint, metadata, new_versions)
        Codec.check_put(await self._call("langgraph_put", params), params)
        return next_config

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._call("langgraph_put_writes",
                         self._codec.put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._call("langgraph_delete_thread", self._codec.delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        params = self._codec.delete_for_runs(run_ids)
        if params["run_ids"]:
            await self._call("langgraph_delete_for_runs", params)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._call("langgraph_copy_thread",
                         self._codec.copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        params = self._codec.prune(thread_ids, strategy)
        if params["thread_ids"]:
            await self._call("langgraph_prune", params)

    # The sync interface, from another thread than the loop's.

    def _sync(self, coro: Any) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self.loop is None or running is self.loop:
            coro.close()
            raise RuntimeError(
                "AsyncReplaysafeSaver's sync methods must be called from another thread than "
                "its event loop (use the async methods there, or ReplaysafeSaver)")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        result: CheckpointTuple | None = self._sync(self.aget_tuple(config))
        return result

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._sync(collect())

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        result: RunnableConfig = self._sync(self.aput(config, checkpoint, metadata, new_versions))
        return result

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self._sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync(self.aprune(thread_ids, strategy=strategy))
