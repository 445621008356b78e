"""Tenants are isolated as in SPEC §4: a saver of a login bound to tenant A sees, lists,
copies, prunes and deletes only A's threads, and cannot act for B at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")

from helpers.db import bind
from langgraph.checkpoint.base import empty_checkpoint
from psycopg import conninfo as pg_conninfo

from replaysafe_pg import AccessDenied
from replaysafe_pg.langgraph import AsyncReplaysafeSaver, ReplaysafeSaver


def login(dsn: str, make_role: Callable[..., str], tenant: str) -> str:
    role = make_role("replaysafe_worker")
    bind(dsn, role, tenant)
    return pg_conninfo.make_conninfo(dsn, user=role)


def seed(saver: ReplaysafeSaver, thread_id: str, value: str) -> dict[str, Any]:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    cp = empty_checkpoint()
    cp["channel_values"] = {"who": value}
    cp["channel_versions"] = {"who": saver.get_next_version(None)}
    stored = saver.put(config, cp, {"source": "input", "step": -1, "run_id": f"run-{value}"},
                       cp["channel_versions"])
    saver.put_writes(stored, [("who", value)], "task")
    return stored


def test_a_tenants_saver_never_touches_another_tenants_threads(
        dsn: str, make_role: Callable[..., str]) -> None:
    with ReplaysafeSaver(login(dsn, make_role, "A"), tenant_id="A") as a, \
            ReplaysafeSaver(login(dsn, make_role, "B"), tenant_id="B") as b:
        a.setup()
        b.setup()
        seed(a, "shared-name", "A")
        thread = {"configurable": {"thread_id": "shared-name", "checkpoint_ns": ""}}
        assert b.get_tuple(thread) is None
        assert list(b.list(thread)) == [] and list(b.list(None)) == []
        b.copy_thread("shared-name", "stolen")
        assert list(b.list({"configurable": {"thread_id": "stolen"}})) == []
        b.prune(["shared-name"], strategy="delete")
        b.delete_thread("shared-name")
        b.delete_for_runs(["run-A"])
        # B's own thread of the same name is B's alone.
        seed(b, "shared-name", "B")
        found = a.get_tuple(thread)
        assert found is not None and found.checkpoint["channel_values"] == {"who": "A"}
        assert found.pending_writes == [("task", "who", "A")]
        assert [t.checkpoint["channel_values"] for t in b.list(None)] == [{"who": "B"}]


def test_a_bound_login_cannot_act_for_another_tenant(dsn: str,
                                                      make_role: Callable[..., str]) -> None:
    thread = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with ReplaysafeSaver(login(dsn, make_role, "A"), tenant_id="B") as wrong:
        calls: list[Callable[[], Any]] = [
            wrong.setup, lambda: wrong.get_tuple(thread), lambda: list(wrong.list(None)),
            lambda: wrong.put(thread, empty_checkpoint(), {"source": "input", "step": -1}, {}),
            lambda: wrong.put_writes({"configurable": {**thread["configurable"],
                                                       "checkpoint_id": "x"}}, [("c", 1)], "t"),
            lambda: wrong.delete_thread("t"), lambda: wrong.delete_for_runs(["r"]),
            lambda: wrong.copy_thread("t", "u"), lambda: wrong.prune(["t"])]
        for call in calls:
            with pytest.raises(AccessDenied):
                call()


def test_a_worker_holds_no_privilege_on_the_tables(dsn: str, make_role: Callable[..., str]) -> None:
    with psycopg.connect(login(dsn, make_role, "A"), autocommit=True) as c:
        for table in ("langgraph_checkpoints", "langgraph_blobs", "langgraph_writes",
                      "langgraph_namespaces"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(f"SELECT 1 FROM replaysafe.{table}")  # type: ignore[arg-type]


def test_the_async_saver_is_tenant_bound_too(dsn: str, make_role: Callable[..., str]) -> None:
    import asyncio

    async def main() -> None:
        async with AsyncReplaysafeSaver(login(dsn, make_role, "A"), tenant_id="B") as wrong:
            with pytest.raises(AccessDenied):
                await wrong.setup()

    asyncio.run(main())


LANGGRAPH_CALLS = {
    "put": "SELECT replaysafe.langgraph_put('A', %(t)s, '', 'c1', NULL, '{}', "
           "'{\"source\": \"input\", \"step\": -1}')",
    "put_writes": "SELECT replaysafe.langgraph_put_writes('A', %(t)s, '', 'c1', 'task', '', "
                  "ARRAY[0], ARRAY['ch'], ARRAY['json'], ARRAY['\\x31'::bytea])",
    "get_tuple": "SELECT * FROM replaysafe.langgraph_get_tuple('A', %(t)s, '', NULL)",
    "list": "SELECT * FROM replaysafe.langgraph_list('A', %(t)s)",
    "delete_thread": "SELECT replaysafe.langgraph_delete_thread('A', %(t)s)",
    "delete_for_runs": "SELECT replaysafe.langgraph_delete_for_runs('A', ARRAY[%(t)s])",
    "copy_thread": "SELECT replaysafe.langgraph_copy_thread('A', %(t)s, 'u')",
    "prune": "SELECT replaysafe.langgraph_prune('A', ARRAY[%(t)s], 'delete')",
}


@pytest.mark.parametrize("call", sorted(LANGGRAPH_CALLS))
def test_a_collate_clause_on_any_argument_is_refused(dsn: str, make_role: Callable[..., str],
                                                     call: str) -> None:
    """As for every function (tests/sql/isolation/test_collation_guard.py): the caller's collation would win
    over the columns' in every comparison inside the function."""
    with psycopg.connect(login(dsn, make_role, "A"), autocommit=True) as worker:
        with pytest.raises(psycopg.Error) as caught:
            worker.execute(LANGGRAPH_CALLS[call].replace("%(t)s", "'t' COLLATE \"C\""))  # type: ignore[arg-type]
        assert caught.value.sqlstate == "RS005" and "COLLATE" in str(caught.value)
        worker.execute(LANGGRAPH_CALLS[call].replace("%(t)s", "'t'"))  # type: ignore[arg-type]
