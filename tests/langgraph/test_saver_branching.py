"""Deliberate branching still works with the CAS rule: time travel, update_state on an older
checkpoint, interrupt() + Command(resume=...), subgraphs, a thread reused after
delete_thread; and the thread keeps going on the new branch afterwards."""

from __future__ import annotations

import asyncio
import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from helpers.lg_graphs import NODES, achain_graph, chain_graph
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from replaysafe_pg.langgraph import AsyncReplaysafeSaver, ReplaysafeSaver


def cfg(thread_id: str, runner: str = "r") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "runner": runner}}


def test_time_travel_and_update_state_on_an_older_checkpoint(dsn: str) -> None:
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        graph = chain_graph(saver, [])
        t = str(uuid.uuid4())
        graph.invoke({"log": []}, cfg(t, "one"), durability="sync")
        history = list(graph.get_state_history(cfg(t)))
        after_a = next(s for s in history if s.next == ("b",))
        # Time travel: replay from after "a" (source "fork"), then go on.
        out = graph.invoke(None, {"configurable": {**after_a.config["configurable"],
                                                   "runner": "two"}}, durability="sync")
        assert out["log"] == ["one:a", "two:b", "two:c"]
        # update_state on an older checkpoint (source "update"), then resume from it.
        updated = graph.update_state(after_a.config, {"log": ["edit"]})
        out = graph.invoke(None, {"configurable": {**updated["configurable"],
                                                   "runner": "three"}}, durability="sync")
        assert out["log"] == ["one:a", "edit", "three:b", "three:c"]
        # The thread goes on from the newest branch as usual.
        out = graph.invoke({"log": []}, cfg(t, "four"), durability="sync")
        assert out["log"][-3:] == [f"four:{n}" for n in NODES]
        assert out["log"][:4] == ["one:a", "edit", "three:b", "three:c"]


class Approval(TypedDict):
    log: Annotated[list[str], operator.add]


def approval_graph(saver: Any) -> Any:
    def ask(state: Approval) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"log": [f"answer:{answer}"]}

    def act(state: Approval) -> dict[str, Any]:
        return {"log": ["acted"]}

    g = StateGraph(Approval)
    g.add_node("ask", ask)
    g.add_node("act", act)
    g.add_edge(START, "ask")
    g.add_edge("ask", "act")
    g.add_edge("act", END)
    return g.compile(checkpointer=saver)


def test_interrupt_and_resume(dsn: str) -> None:
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        graph = approval_graph(saver)
        t = str(uuid.uuid4())
        first = graph.invoke({"log": ["start"]}, cfg(t), durability="sync")
        assert "__interrupt__" in first
        out = graph.invoke(Command(resume="yes"), cfg(t), durability="sync")
        assert out["log"] == ["start", "answer:yes", "acted"]


def subgraph_run(saver: Any) -> tuple[Any, Any]:
    inner = approval_graph(None)  # a subgraph: the parent's checkpointer, its own namespace
    g = StateGraph(Approval)
    g.add_node("inner", inner)
    g.add_node("after", lambda s: {"log": ["after"]})
    g.add_edge(START, "inner")
    g.add_edge("inner", "after")
    g.add_edge("after", END)
    graph = g.compile(checkpointer=saver)
    t = str(uuid.uuid4())
    first = graph.invoke({"log": ["start"]}, cfg(t), durability="sync")
    assert "__interrupt__" in first
    return graph.invoke(Command(resume="ok"), cfg(t), durability="sync"), t


def test_subgraphs_in_their_own_namespaces(dsn: str) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    expected, _ = subgraph_run(InMemorySaver())
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        out, t = subgraph_run(saver)
        assert out == expected and out["log"][-3:] == ["answer:ok", "acted", "after"]
        namespaces = {c.config["configurable"]["checkpoint_ns"] for c in saver.list(
            {"configurable": {"thread_id": t}})}
        assert "" in namespaces and any(ns.startswith("inner:") for ns in namespaces)


def test_a_thread_reused_after_delete_thread(dsn: str) -> None:
    async def main() -> None:
        async with AsyncReplaysafeSaver(dsn, tenant_id="t1") as saver:
            graph = achain_graph(saver, [])
            t = str(uuid.uuid4())
            await graph.ainvoke({"log": []}, cfg(t, "old"), durability="sync")
            await saver.adelete_thread(t)
            out = await graph.ainvoke({"log": []}, cfg(t, "new"), durability="sync")
            assert out["log"] == [f"new:{n}" for n in NODES]

    asyncio.run(main())


@pytest.mark.parametrize("durability", ["async", "exit"])
def test_one_run_at_a_time_works_with_every_durability(dsn: str, durability: str) -> None:
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        graph = chain_graph(saver, [])
        t = str(uuid.uuid4())
        for runner in ("x", "y", "z"):
            graph.invoke({"log": []}, cfg(t, runner), durability=durability)
        assert graph.get_state(cfg(t)).values["log"] == [f"{r}:{n}" for r in "xyz" for n in NODES]


def test_a_history_limit_prunes_a_bounded_amount_per_write(dsn: str) -> None:
    import psycopg
    from langgraph.checkpoint.base import empty_checkpoint

    def counts() -> tuple[int, int, int]:
        with psycopg.connect(dsn, autocommit=True) as c:
            row = c.execute("SELECT (SELECT count(*) FROM replaysafe.langgraph_checkpoints), "
                            "(SELECT count(*) FROM replaysafe.langgraph_blobs), "
                            "(SELECT count(*) FROM replaysafe.langgraph_writes)").fetchone()
        assert row is not None
        return row[0], row[1], row[2]

    def put_many(saver: ReplaysafeSaver, config: Any, n: int) -> Any:
        for _ in range(n):
            version = saver.get_next_version(None)
            cp = empty_checkpoint()
            # "fixed" keeps one version throughout: its value must outlive every prune.
            cp["channel_values"] = {"fixed": "kept", "step": version}
            cp["channel_versions"] = {"fixed": "1", "step": version}
            new = {"step": version} if config["configurable"].get("checkpoint_id") else \
                {"fixed": "1", "step": version}
            config = saver.put(config, cp, {"source": "loop", "step": 1}, new)
            saver.put_writes(config, [("step", 1)], "task")
        return config

    with ReplaysafeSaver(dsn, tenant_id="t1", history_limit=5) as saver:
        config = put_many(saver, {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, 12)
        assert counts() == (5, 6, 5)  # 5 checkpoints, their 5 "step" values + "fixed", 5 writes
        kept = list(saver.list({"configurable": {"thread_id": "t"}}))
        assert all(t.checkpoint["channel_values"]["fixed"] == "kept" for t in kept)
    with ReplaysafeSaver(dsn, tenant_id="t1", history_limit=1) as saver:
        config = put_many(saver, config, 1)
        assert counts()[0] == 2  # 6 beyond the new limit, at most 4 deleted per write
        put_many(saver, config, 1)
        assert counts() == (1, 2, 1)
