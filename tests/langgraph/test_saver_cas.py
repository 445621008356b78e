"""Two runs on one thread at once cannot fork it silently (SPEC §9): with durability="sync"
exactly one run succeeds, the other raises StaleStateError before its next node, the thread's
state is the winner's, and nothing of the loser (checkpoints, pending writes) is kept."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")

from helpers.lg_graphs import NODES, achain_graph, chain_graph
from langgraph.checkpoint.base import empty_checkpoint

from replaysafe_pg import StaleStateError
from replaysafe_pg.langgraph import (
    AsyncReplaysafeSaver,
    ReplaysafeSaver,
    StaleCheckpointError,
)

REPS = 20


class GatedSaver(ReplaysafeSaver):
    """While ``gate`` is set, a read of the newest checkpoint waits there until both runs have
    read it: the two runs start from the same checkpoint (the race the rule is for)."""

    gate: threading.Barrier | None = None

    def get_tuple(self, config: Any) -> Any:
        found = super().get_tuple(config)
        gate = self.gate
        if gate is not None and "checkpoint_id" not in config["configurable"]:
            gate.wait(timeout=10)
        return found


class AsyncGatedSaver(AsyncReplaysafeSaver):
    """See :class:`GatedSaver`."""

    gate: asyncio.Barrier | None = None

    async def aget_tuple(self, config: Any) -> Any:
        found = await super().aget_tuple(config)
        gate = self.gate
        if gate is not None and "checkpoint_id" not in config["configurable"]:
            await asyncio.wait_for(gate.wait(), 10)
        return found


def config(thread_id: str, runner: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "runner": runner}}


def orphans(dsn: str, thread_id: str, loser: str = "") -> dict[str, int]:
    """Rows of the thread that no current checkpoint explains, read as the schema owner."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("""
            SELECT (SELECT count(*) FROM replaysafe.langgraph_writes w
                    WHERE w.thread_id = %(t)s AND NOT EXISTS (
                        SELECT 1 FROM replaysafe.langgraph_checkpoints k
                        WHERE k.tenant_id = w.tenant_id AND k.thread_id = w.thread_id
                          AND k.checkpoint_ns = w.checkpoint_ns
                          AND k.checkpoint_id = w.checkpoint_id)),
                   (SELECT count(*) FROM replaysafe.langgraph_checkpoints k
                    WHERE k.thread_id = %(t)s AND k.metadata ->> 'runner' = %(loser)s)""",
                        {"t": thread_id, "loser": loser}).fetchone()
    assert row is not None
    return {"orphan_writes": row[0], "loser_checkpoints": row[1]}


def judge(outcomes: dict[str, BaseException | None], ran: list[str],
          final: list[str], seeded: list[str]) -> tuple[str, str]:
    failed = {r: e for r, e in outcomes.items() if e is not None}
    assert len(failed) == 1, outcomes
    (loser, error), = failed.items()
    winner = next(r for r in outcomes if r != loser)
    assert isinstance(error, StaleCheckpointError) and isinstance(error, StaleStateError), error
    assert error.thread_id is not None and error.checkpoint_id is not None
    # The loser ran at most the node that was running when the conflict was found.
    assert [n for n in ran if n.startswith(loser)] in ([], [f"{loser}:a"]), ran
    assert final == seeded + [f"{winner}:{n}" for n in NODES], final
    return winner, loser


@pytest.mark.parametrize("seed", [False, True], ids=["fresh", "seeded"])
def test_two_threads_on_one_thread(dsn: str, seed: bool) -> None:
    wins = {"r1": 0, "r2": 0}
    with GatedSaver(dsn, tenant_id="t1") as saver:
        for _ in range(REPS):
            thread_id = str(uuid.uuid4())
            ran: list[str] = []
            seeded: list[str] = []
            if seed:
                chain_graph(saver, []).invoke({"log": []}, config(thread_id, "seed"),
                                              durability="sync")
                seeded = [f"seed:{n}" for n in NODES]
            graph = chain_graph(saver, ran)
            saver.gate = threading.Barrier(2)
            outcomes: dict[str, BaseException | None] = {}

            def run(runner: str) -> None:
                try:
                    graph.invoke({"log": []}, config(thread_id, runner), durability="sync")  # noqa: B023
                    outcomes[runner] = None  # noqa: B023
                except BaseException as exc:
                    outcomes[runner] = exc  # noqa: B023

            workers = [threading.Thread(target=run, args=(r,)) for r in ("r1", "r2")]
            for w in workers:
                w.start()
            for w in workers:
                w.join(30)
            saver.gate = None
            final = graph.get_state({"configurable": {"thread_id": thread_id}}).values["log"]
            winner, loser = judge(outcomes, ran, final, seeded)
            wins[winner] += 1
            assert orphans(dsn, thread_id, loser) == {"orphan_writes": 0, "loser_checkpoints": 0}
    assert sum(wins.values()) == REPS


@pytest.mark.parametrize("seed", [False, True], ids=["fresh", "seeded"])
def test_two_tasks_on_one_thread(dsn: str, seed: bool) -> None:
    async def main() -> None:
        async with AsyncGatedSaver(dsn, tenant_id="t1") as saver:
            for _ in range(REPS):
                thread_id = str(uuid.uuid4())
                ran: list[str] = []
                seeded: list[str] = []
                if seed:
                    await achain_graph(saver, []).ainvoke(
                        {"log": []}, config(thread_id, "seed"), durability="sync")
                    seeded = [f"seed:{n}" for n in NODES]
                graph = achain_graph(saver, ran)
                saver.gate = asyncio.Barrier(2)
                results = await asyncio.gather(
                    *(graph.ainvoke({"log": []}, config(thread_id, r), durability="sync")
                      for r in ("r1", "r2")), return_exceptions=True)
                outcomes = {r: (res if isinstance(res, BaseException) else None)
                            for r, res in zip(("r1", "r2"), results, strict=True)}
                saver.gate = None
                state = await graph.aget_state({"configurable": {"thread_id": thread_id}})
                _, loser = judge(outcomes, ran, state.values["log"], seeded)
                assert orphans(dsn, thread_id, loser) == {"orphan_writes": 0,
                                                          "loser_checkpoints": 0}

    asyncio.run(main())


def test_a_refused_checkpoint_keeps_no_pending_writes_even_late_ones(dsn: str) -> None:
    """The loser's writes on its refused checkpoint: those stored before the refusal are
    deleted with it, those that arrive after it are dropped."""
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        base = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        root = empty_checkpoint()
        head = saver.put(base, root, {"source": "input", "step": -1}, {})
        winner = empty_checkpoint()
        saver.put(head, winner, {"source": "loop", "step": 0}, {})
        loser = empty_checkpoint()
        loser_config = {"configurable": {"thread_id": "t", "checkpoint_ns": "",
                                         "checkpoint_id": loser["id"]}}
        saver.put_writes(loser_config, [("log", "early")], "task-1")
        with pytest.raises(StaleCheckpointError) as caught:
            saver.put(head, loser, {"source": "loop", "step": 0}, {})
        assert caught.value.expected_checkpoint_id == root["id"]
        assert caught.value.current_checkpoint_id == winner["id"]
        assert caught.value.checkpoint_id == loser["id"]
        saver.put_writes(loser_config, [("log", "late")], "task-2")
        assert orphans(dsn, "t")["orphan_writes"] == 0
        assert saver.get_tuple(loser_config) is None
        assert saver.get_tuple(base).checkpoint["id"] == winner["id"]  # type: ignore[union-attr]


def test_branching_on_purpose_is_never_refused(dsn: str) -> None:
    """source "fork" / "update" may start from any checkpoint; a parentless first checkpoint
    only goes into an empty thread."""
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        base = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        first = saver.put(base, empty_checkpoint(), {"source": "input", "step": -1}, {})
        saver.put(first, empty_checkpoint(), {"source": "loop", "step": 0}, {})
        for source in ("fork", "update"):
            saver.put(first, empty_checkpoint(), {"source": source, "step": 1}, {})
        with pytest.raises(StaleCheckpointError):
            saver.put(base, empty_checkpoint(), {"source": "input", "step": -1}, {})
        with pytest.raises(StaleCheckpointError):
            saver.put(first, empty_checkpoint(), {"source": "loop", "step": 1}, {})
        assert len(list(saver.list(base))) == 4


def test_control_langgraphs_postgres_saver_forks_silently(dsn: str) -> None:
    """The same race on LangGraph's own PostgresSaver: both runs succeed and the thread's
    state holds only one of them (what the tests above would see without the rule)."""
    postgres = pytest.importorskip("langgraph.checkpoint.postgres")

    class GatedPostgresSaver(postgres.PostgresSaver):  # type: ignore[misc, name-defined]
        gate: threading.Barrier | None = None

        def get_tuple(self, config: Any) -> Any:
            found = super().get_tuple(config)
            if self.gate is not None and "checkpoint_id" not in config["configurable"]:
                self.gate.wait(timeout=10)
            return found

    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0,
                         row_factory=psycopg.rows.dict_row) as conn:
        saver = GatedPostgresSaver(conn)
        saver.setup()
        thread_id = str(uuid.uuid4())
        graph = chain_graph(saver, [])
        saver.gate = threading.Barrier(2)
        outcomes: dict[str, BaseException | None] = {}

        def run(runner: str) -> None:
            try:
                graph.invoke({"log": []}, config(thread_id, runner), durability="sync")
                outcomes[runner] = None
            except BaseException as exc:
                outcomes[runner] = exc

        workers = [threading.Thread(target=run, args=(r,)) for r in ("r1", "r2")]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        saver.gate = None
        final = graph.get_state({"configurable": {"thread_id": thread_id}}).values["log"]
    assert outcomes == {"r1": None, "r2": None}
    assert len(final) == len(NODES)  # one run's update is lost from the current state
