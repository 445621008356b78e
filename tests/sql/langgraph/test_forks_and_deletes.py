"""A LangGraph thread never forks silently and a deleted one never comes back (docs/langgraph.md):
runs on a lagging clock, two runs on a fresh thread, racing parentless checkpoints, stale or
missing parents by hand, and deletes (delete_thread, prune, delete_for_runs) racing a put in
flight. Real LOGIN roles bound to tenant A."""

from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")
from helpers.db import connect_as, sqlstate
from helpers.langgraph_rows import PUT, counts, login, put_params
from helpers.lg_graphs import NODES, chain_graph
from langgraph.checkpoint.base import empty_checkpoint

from replaysafe_pg.langgraph import ReplaysafeSaver, StaleCheckpointError

MakeRole = Callable[..., str]


# =============================================================================================
# The head is kept on the namespace row. Without it:
# The CAS rule let a run's update go silently, without any concurrent run,
# when the run's clock lags the host that wrote the thread's head: "newest" is the greatest id,
# and an id made on a lagging clock sorts below its own parent. The checkpoint is stored
# (stored = true, no error) but is not the newest, so the next read returns the old head.
# With durability="sync" the same lag gives a StaleCheckpointError with no other run at all.
# =============================================================================================

@pytest.fixture
def lagging_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """From now on, LangGraph's checkpoint ids are made as on a host whose clock lags."""
    import langgraph.checkpoint.base.id as idmod

    def lag(seconds: float) -> None:
        real = time.time_ns
        monkeypatch.setattr(idmod, "time", types.SimpleNamespace(
            time_ns=lambda: real() - int(seconds * 1e9)))
        monkeypatch.setattr(idmod, "_last_v6_timestamp", None)  # another process

    return lag


def run_config(thread_id: str, runner: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "runner": runner}}


def test_a_run_on_a_lagging_clock_is_never_silently_lost(
        dsn: str, lagging_clock: Callable[[float], None]) -> None:
    """A run on a lagging clock was silently lost; fixed: the head is kept on the
    namespace row."""
    with ReplaysafeSaver(dsn, tenant_id="A") as saver:
        graph = chain_graph(saver, [])
        graph.invoke({"log": []}, run_config("skew", "first"), durability="sync")
        lagging_clock(2.0)  # the next request lands on a host 2 s behind
        try:
            answer = graph.invoke({"log": []}, run_config("skew", "late"), durability="exit")
        except StaleCheckpointError:
            return  # loud: fine
        state = graph.get_state({"configurable": {"thread_id": "skew"}}).values["log"]
    late = [f"late:{n}" for n in NODES]
    assert answer["log"][-3:] == late  # the caller was told its run succeeded...
    assert state[-3:] == late, state  # ...so the thread must hold it


def test_a_lagging_clock_alone_raises_no_stale_checkpoint(
        dsn: str, lagging_clock: Callable[[float], None]) -> None:
    """A run on a lagging clock was silently lost; fixed: the head is kept on the
    namespace row."""
    with ReplaysafeSaver(dsn, tenant_id="A") as saver:
        graph = chain_graph(saver, [])
        graph.invoke({"log": []}, run_config("skew", "first"), durability="sync")
        lagging_clock(2.0)
        # One run at a time: there is no conflict to report.
        graph.invoke({"log": []}, run_config("skew", "late"), durability="sync")
        state = graph.get_state({"configurable": {"thread_id": "skew"}}).values["log"]
    assert state[-3:] == [f"late:{n}" for n in NODES]


# =============================================================================================
# A parentless run-loop checkpoint whose versions_seen records a run's work is refused in a
# namespace that has checkpoints. Without it:
# Two runs with durability="exit" on a fresh thread forked it silently. Their
# only checkpoint is the final one, of source "loop", with no parent and a step >= 0: the
# lenient root rule accepts it into a thread that already has checkpoints. docs/langgraph.md
# says with "exit" "the conflict is found at the end".
# =============================================================================================

class GatedSaver(ReplaysafeSaver):
    """Both runs read the newest checkpoint (none) before either writes."""

    gate: threading.Barrier | None = None

    def get_tuple(self, config: Any) -> Any:
        found = super().get_tuple(config)
        if self.gate is not None and "checkpoint_id" not in config["configurable"]:
            self.gate.wait(timeout=10)
        return found


def test_two_exit_durability_runs_on_a_fresh_thread_do_not_fork_silently(dsn: str) -> None:
    """Two exit-durability runs forked a fresh thread silently; fixed: a
    parentless run-loop checkpoint is refused in a namespace that has checkpoints."""
    with GatedSaver(dsn, tenant_id="A") as saver:
        graph = chain_graph(saver, [])
        saver.gate = threading.Barrier(2)
        outcomes: dict[str, BaseException | None] = {}

        def run(runner: str) -> None:
            try:
                graph.invoke({"log": []}, run_config("fresh", runner), durability="exit")
                outcomes[runner] = None
            except BaseException as exc:
                outcomes[runner] = exc

        workers = [threading.Thread(target=run, args=(r,)) for r in ("r1", "r2")]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        saver.gate = None
        stored = list(saver.list({"configurable": {"thread_id": "fresh"}}))
    failed = [e for e in outcomes.values() if e is not None]
    assert len(outcomes) == 2
    assert len(failed) == 1 and isinstance(failed[0], StaleCheckpointError), (
        f"both runs succeeded; the thread holds {len(stored)} parentless run-loop checkpoints")


def test_two_parentless_run_checkpoints_racing_into_a_fresh_namespace_do_not_both_land(
        dsn: str) -> None:
    """The second put waits on the namespace row the first one is creating; once it has the
    lock it must see the first one's head (not the empty namespace it saw before waiting).

    two exit-durability
    runs forked a fresh thread silently; fixed: a parentless run-loop checkpoint is refused in
    a namespace that has checkpoints."""
    def params() -> dict[str, Any]:
        cp = empty_checkpoint()
        body = {k: v for k, v in cp.items() if k != "channel_values"}
        body["versions_seen"] = {"__input__": {}, "__start__": {"__start__": "1"}}
        return put_params(thread="race", id=cp["id"], cp=json.dumps(body),
                          md=json.dumps({"source": "loop", "step": 1, "parents": {}}))

    answers: list[Any] = []
    with psycopg.connect(dsn) as first:
        answers.append(first.execute(PUT, params()).fetchone())

        def second() -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                answers.append(c.execute(PUT, params()).fetchone())

        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.5)  # the second put now waits on the first one's namespace row
        first.commit()
    waiter.join(10)
    assert [a[0] for a in answers] == [True, False], answers
    assert counts(dsn, "A")[0] == 1


def test_run_loop_checkpoints_cannot_fork_a_thread_by_their_parent(checkpointed_world: str,
                                                                   make_role: MakeRole) -> None:
    """Tried by hand on the CAS rule: a stale parent, a missing parent on a run's first
    checkpoint, the same id again with another parent, NULL and unknown namespaces.

    An attack on the LangGraph checkpointer that failed , kept as
    a regression test."""
    with connect_as(checkpointed_world, login(checkpointed_world, make_role, "A")) as w:
        head = w.execute("SELECT checkpoint_id FROM replaysafe.langgraph_get_tuple("
                         "p_tenant_id => 'A', p_thread_id => 't')").fetchone()
        assert head is not None
        first = json.dumps({"source": "input", "step": -1})
        loop = json.dumps({"source": "loop", "step": 1})
        refused = [
            put_params(md=first),  # a run's first checkpoint into a thread that has some
            put_params(md=loop, parent="00000000-stale"),
            put_params(md=loop, parent=""),  # RS005 below, not stored
        ]
        answers = []
        for p in refused:
            try:
                answers.append(w.execute(PUT, p).fetchone())
            except psycopg.Error as exc:
                answers.append(exc.sqlstate)
        assert answers[0] == (False, head[0]) and answers[1] == (False, head[0])
        assert answers[2] == "RS005"
        assert sqlstate(w, PUT, put_params(ns=None, md=loop, parent=head[0])) == "RS005"
        assert w.execute("SELECT count(*) FROM replaysafe.langgraph_list(p_tenant_id => 'A', "
                         "p_thread_id => 't')").fetchone() == (1,)


# =============================================================================================
# delete_thread and prune lock the namespaces FOR UPDATE first. Without it:
# Delete_thread (and prune "delete") is not atomic against a put in flight: it
# takes no namespace lock first, so a checkpoint committed by a concurrent put (its rows not
# yet visible to the DELETEs) survives a delete_thread that returned. A "deleted" thread then
# comes back with state from before the deletion.
# =============================================================================================

@pytest.mark.parametrize("how", ["delete_thread", "prune_delete"])
def test_delete_thread_leaves_nothing_of_a_put_in_flight(checkpointed_world: str, how: str) -> None:
    """Delete_thread was not atomic against a put in flight; fixed: namespaces
    locked FOR UPDATE first."""
    head = empty_checkpoint()
    body = json.dumps({k: v for k, v in head.items() if k != "channel_values"})
    with psycopg.connect(checkpointed_world) as writer:  # an open transaction: the put in flight
        writer.execute(PUT, put_params(thread="t", id=head["id"], cp=body))
        result: list[Any] = []
        call = ("SELECT replaysafe.langgraph_delete_thread(p_tenant_id => 'A', p_thread_id => 't')"
                if how == "delete_thread" else
                "SELECT replaysafe.langgraph_prune(p_tenant_id => 'A', p_thread_ids => ARRAY['t'], "
                "p_strategy => 'delete')")

        def delete() -> None:
            with psycopg.connect(checkpointed_world, autocommit=True) as c:
                result.append(c.execute(call).fetchone())

        deleter = threading.Thread(target=delete)
        deleter.start()
        time.sleep(0.5)  # the delete now waits on the namespace row the put holds
        writer.commit()
    deleter.join(10)
    assert result, "delete did not return"
    assert counts(checkpointed_world, "A") == (0, 0, 0, 0)


# =============================================================================================
# delete_for_runs collects values only under the namespace lock. Without it: A put in flight
# whose checkpoint keeps a channel at a version stored by an earlier checkpoint (LangGraph
# sends only new versions) is not yet visible to the collection, which deletes that value:
# once the put commits, its checkpoint has lost the channel (get_tuple silently omits it).
# =============================================================================================

def test_delete_for_runs_never_drops_a_value_a_put_in_flight_uses(checkpointed_world: str) -> None:
    """Delete_for_runs collected values without the namespace lock; fixed: values
    collected only under it."""
    config = {"configurable": {"thread_id": "runs", "checkpoint_ns": ""}}
    with ReplaysafeSaver(checkpointed_world, tenant_id="A") as saver:
        first = empty_checkpoint()
        first["channel_values"] = {"kept": "value of run r1"}
        first["channel_versions"] = {"kept": saver.get_next_version(None)}
        c1 = saver.put(config, first, {"source": "input", "step": -1, "run_id": "r1"},
                       first["channel_versions"])
    third = empty_checkpoint()
    third["channel_versions"] = dict(first["channel_versions"])  # unchanged channel
    body = json.dumps({k: v for k, v in third.items() if k != "channel_values"})
    with psycopg.connect(checkpointed_world) as writer, \
            psycopg.connect(checkpointed_world, autocommit=True) as other, \
            psycopg.connect(checkpointed_world, autocommit=True) as probe:  # run r3's put, in flight
        writer.execute(PUT, put_params(thread="runs", id=third["id"],
                                       parent=c1["configurable"]["checkpoint_id"], cp=body,
                                       md=json.dumps({"source": "loop", "step": 0,
                                                      "run_id": "r3"})))
        # Run r1 rolled back meanwhile: delete_for_runs waits for the put (revision 0009).
        deleted: list[Any] = []
        rollback = threading.Thread(target=lambda: deleted.append(other.execute(
            "SELECT replaysafe.langgraph_delete_for_runs(p_tenant_id => 'A', "
            "p_run_ids => ARRAY['r1'])").fetchone()), daemon=True)
        rollback.start()
        deadline = time.monotonic() + 30
        while probe.execute("SELECT %s = ANY (pg_blocking_pids(%s))",
                            (writer.info.backend_pid, other.info.backend_pid)
                            ).fetchone() != (True,):
            assert rollback.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        writer.commit()
        rollback.join(30)
        assert not rollback.is_alive() and deleted == [(1,)]
    with ReplaysafeSaver(checkpointed_world, tenant_id="A") as saver:
        found = saver.get_tuple(config)
    assert found is not None and found.checkpoint["id"] == third["id"]
    assert found.checkpoint["channel_values"] == {"kept": "value of run r1"}
