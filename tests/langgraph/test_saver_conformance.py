"""Both savers through langgraph-checkpoint-conformance's own ``validate()``: every capability
it tests (the base set, delete_for_runs, copy_thread, prune), counting the tests that ran."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate

from replaysafe_pg.langgraph import AsyncReplaysafeSaver, ReplaysafeSaver

# langgraph-checkpoint-conformance 0.0.2: tests per capability.
EXPECTED = {"put": 17, "put_writes": 10, "get_tuple": 10, "list": 16, "delete_thread": 5,
            "delete_for_runs": 7, "copy_thread": 8, "prune": 8}


class SyncAdapter(BaseCheckpointSaver[str]):
    """The suite drives only async methods: these call the sync saver's methods directly (not
    its own to_thread wrappers), so what runs is the sync code."""

    def __init__(self, inner: ReplaysafeSaver) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        return self.inner.get_next_version(current, channel)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.inner.get_tuple(config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        for t in self.inner.list(config, filter=filter, before=before, limit=limit):
            yield t

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return self.inner.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        self.inner.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.inner.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.inner.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.inner.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.inner.prune(thread_ids, strategy=strategy)


def counts(report: Any) -> dict[str, tuple[int, int]]:
    return {cap: (r.tests_passed, r.tests_failed) for cap, r in report.results.items()}


def check(report: Any) -> None:
    print(report.checkpointer_name, {cap: (r.tests_passed, r.tests_failed, r.tests_skipped)
                                     for cap, r in report.results.items()})
    failures = {cap: r.failures for cap, r in report.results.items() if r.failures}
    assert not failures, failures
    assert counts(report) == {cap: (n, 0) for cap, n in EXPECTED.items()}
    assert sum(r.tests_passed for r in report.results.values()) == 81
    assert all(r.detected and r.passed for r in report.results.values())


def test_async_saver_passes_every_capability(dsn: str) -> None:
    @checkpointer_test(name="AsyncReplaysafeSaver")
    async def factory() -> AsyncIterator[AsyncReplaysafeSaver]:
        async with AsyncReplaysafeSaver.from_conn_string(dsn, tenant_id="t1") as saver:
            await saver.setup()
            yield saver

    check(asyncio.run(validate(factory)))


def test_sync_saver_passes_every_capability(dsn: str) -> None:
    @checkpointer_test(name="ReplaysafeSaver")
    async def factory() -> AsyncIterator[SyncAdapter]:
        with ReplaysafeSaver.from_conn_string(dsn, tenant_id="t1") as saver:
            saver.setup()
            yield SyncAdapter(saver)

    check(asyncio.run(validate(factory)))


