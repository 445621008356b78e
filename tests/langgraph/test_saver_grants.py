"""The LangGraph savers under tenant grants (SPEC §4, §6): one pooled login bound to no
tenant; under a grant that names a user, a saver reaches only that user's threads, and the
threads it creates are that user's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint
from psycopg import conninfo as pg_conninfo

from replaysafe_pg import AccessDenied, InvalidArgument, issue_grant
from replaysafe_pg.langgraph import AsyncReplaysafeSaver, ReplaysafeSaver


def thread(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def seed(saver: ReplaysafeSaver, thread_id: str, value: str) -> dict[str, Any]:
    cp = empty_checkpoint()
    cp["channel_values"] = {"who": value}
    cp["channel_versions"] = {"who": saver.get_next_version(None)}
    stored = saver.put(thread(thread_id), cp,
                       {"source": "input", "step": -1, "run_id": f"run-{value}"},
                       cp["channel_versions"])
    saver.put_writes(stored, [("who", value)], "task")
    return stored


@pytest.fixture
def pooled(dsn: str, make_role: Callable[..., str]) -> tuple[str, str]:
    """DSNs of a pooled worker login (bound to no tenant) and of an issuer login."""
    return (pg_conninfo.make_conninfo(dsn, user=make_role("replaysafe_worker")),
            pg_conninfo.make_conninfo(dsn, user=make_role("replaysafe_issuer")))


def test_two_users_of_one_tenant_cannot_read_each_others_threads(
        pooled: tuple[str, str]) -> None:
    worker, issuer = pooled
    alice, bob = (issue_grant(issuer, "acme", user_id=u) for u in ("alice", "bob"))
    with ReplaysafeSaver(worker, grant=alice) as a, ReplaysafeSaver(worker, grant=bob) as b:
        assert (a.tenant_id, b.tenant_id) == ("acme", "acme")
        a.setup()
        b.setup()
        seed(a, "alice-thread", "alice")
        found = a.get_tuple(thread("alice-thread"))
        assert found is not None and found.checkpoint["channel_values"] == {"who": "alice"}
        assert found.pending_writes == [("task", "who", "alice")]
        # Bob, of the same tenant, is refused every way into Alice's thread.
        for call in (lambda: b.get_tuple(thread("alice-thread")),
                     lambda: list(b.list(thread("alice-thread"))),
                     lambda: seed(b, "alice-thread", "bob"),
                     lambda: b.delete_thread("alice-thread"),
                     lambda: b.copy_thread("alice-thread", "stolen")):
            with pytest.raises(AccessDenied):
                call()
        # Bob's own thread is his alone.
        seed(b, "bob-thread", "bob")
        with pytest.raises(AccessDenied):
            a.get_tuple(thread("bob-thread"))
        assert [t.config["configurable"]["thread_id"] for t in a.list(None)] == ["alice-thread"]
        assert [t.config["configurable"]["thread_id"] for t in b.list(None)] == ["bob-thread"]
        found = a.get_tuple(thread("alice-thread"))
        assert found is not None and found.checkpoint["channel_values"] == {"who": "alice"}


def test_a_saver_with_a_grant_for_another_tenant_is_refused(pooled: tuple[str, str]) -> None:
    worker, issuer = pooled
    acme = issue_grant(issuer, "acme")
    with pytest.raises(InvalidArgument, match="the grant is for tenant 'acme'"):
        ReplaysafeSaver(worker, tenant_id="globex", grant=acme)
    with pytest.raises(InvalidArgument):
        ReplaysafeSaver(worker, grant="not a grant")
    # Without a grant the pooled login acts for nobody.
    with ReplaysafeSaver(worker, tenant_id="acme") as nobody, pytest.raises(AccessDenied):
        nobody.setup()


def test_the_async_saver_under_a_user_grant(pooled: tuple[str, str]) -> None:
    worker, issuer = pooled
    alice, bob = (issue_grant(issuer, "acme", user_id=u) for u in ("alice", "bob"))

    async def main() -> None:
        async with AsyncReplaysafeSaver(worker, grant=lambda: alice) as a, \
                AsyncReplaysafeSaver(worker, grant=bob) as b:
            await a.setup()
            cp = empty_checkpoint()
            cp["channel_values"] = {"who": "alice"}
            cp["channel_versions"] = {"who": a.get_next_version(None)}
            await a.aput(thread("t"), cp, {"source": "input", "step": -1}, cp["channel_versions"])
            found = await a.aget_tuple(thread("t"))
            assert found is not None and found.checkpoint["channel_values"] == {"who": "alice"}
            with pytest.raises(AccessDenied):
                await b.aget_tuple(thread("t"))

    asyncio.run(main())
