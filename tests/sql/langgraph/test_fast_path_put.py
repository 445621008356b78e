"""langgraph_put's fast path (revision 0009): a put whose parent is the head moves the head in
the UPDATE that locks the namespace, inserts its checkpoint ON CONFLICT DO NOTHING and falls
back to the slow path when the checkpoint was stored before; the channel arrays are checked
by FOREACH loops. Tried as an attacker holding a worker login bound to tenant A: the channel
bounds on every path, stale parents, racing run loops, deletes under a waiting put. The
fast path across tenants: test_langgraph_sql_isolation.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import connect_as, sqlstate
from helpers.langgraph_fast_path import (
    PUT_FAST,
    UPDATE,
    assert_head_is_stored,
    fast_params,
    loop_children,
    state,
)

import replaysafe_pg

MakeRole = Callable[..., str]


PUT_WRITES = ("SELECT replaysafe.langgraph_put_writes(p_tenant_id => %(tenant)s, "
              "p_thread_id => %(thread)s, p_checkpoint_ns => '', p_checkpoint_id => %(id)s, "
              "p_task_id => 'task', p_task_path => '', p_idx => '{0}', p_channels => '{w}', "
              "p_types => '{json}', p_blobs => ARRAY['\\x01'::bytea])")


# =============================================================================================
# Each channel array is looped over on its own: a loop over ``p_channels || p_versions``
# would fail, as array_cat refuses multi-dimensional arrays of equal
# cardinality but other shapes with a raw 2202E ("cannot concatenate incompatible arrays").
# Checked element by element, such a put gets an answer, never a raw error.
# =============================================================================================

SHAPES = {
    "1x2 channels, 2x1 versions": ("{{a,b}}", "{{1},{2}}"),
    "4 channels, 2x2 versions": ("{a,b,c,d}", "{{1,2},{3,4}}"),
    "2x2 channels, 4 versions with lower bound 0": ("{{a,b},{c,d}}", "[0:3]={1,2,3,4}"),
}


@pytest.mark.parametrize("path", ["first put", "parent is the head"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_multi_dimensional_channel_arrays_get_an_answer_not_a_raw_error(
        fast_path_world: str, fast_path_worker: str, installed_revision: str, shape: str, path: str) -> None:
    """Multi-dimensional channel arrays of other shapes ended in a raw 2202E;
    fixed before release."""
    channels, versions = SHAPES[shape]
    n = 4 if "4" in shape else 2
    thread = "arr" if path == "first put" else "t"
    parent = None if path == "first put" else "p1"
    p = fast_params("x1", parent, thread=thread, md=UPDATE, channels=channels, versions=versions,
                    types=["json"] * n, blobs=[b"v"] * n)
    before = state(fast_path_world, thread=thread)
    with connect_as(fast_path_world, fast_path_worker) as w:
        got = sqlstate(w, PUT_FAST, p)
    if got is not None:
        assert state(fast_path_world, thread=thread) == before  # nothing half-written either way
    assert got in (None, "RS005"), f"{installed_revision}: raw SQLSTATE {got} for {shape}"


# =============================================================================================
# delete_for_runs locks the runs' namespaces first and waits for them. Re-pointing a namespace's
# head only where it got the lock at once (FOR NO KEY UPDATE SKIP LOCKED) would fail: with a
# put_writes in
# flight holding the namespace (FOR SHARE) while the head's run was deleted:
#   - the head stayed on the deleted checkpoint d1 (get_tuple said d0, the greatest id left);
#   - the in-flight pending write of d1 survived: a pending write of a checkpoint not stored;
#   - a run-loop put whose parent was d1 (the deleted run going on) matched ``head = parent``
#     and was stored, although readers were given d0 as the head.
# =============================================================================================

def stale_head_after_delete_for_runs(dsn: str, role: str) -> None:
    """The head's run deleted while a put_writes of the head is in flight: delete_for_runs
    waits for it (seen blocked by pg_blocking_pids), then deletes what it committed too."""
    from psycopg import conninfo

    with connect_as(dsn, role) as w:
        w.execute(PUT_FAST, fast_params("d0", None, thread="dr", md=json.dumps(
            {"source": "input", "step": -1, "run_id": "r0"})))
        w.execute(PUT_FAST, fast_params("d1", "d0", thread="dr", md=json.dumps(
            {"source": "loop", "step": 0, "run_id": "r1"})))
    deleted: list[Any] = []
    with psycopg.connect(conninfo.make_conninfo(dsn, user=role)) as inflight, \
            connect_as(dsn, role) as other, psycopg.connect(dsn, autocommit=True) as probe:
        inflight.execute(PUT_WRITES, {"tenant": "A", "thread": "dr", "id": "d1"})
        inflight_pid = inflight.info.backend_pid

        def delete() -> None:
            deleted.append(other.execute("SELECT replaysafe.langgraph_delete_for_runs("
                                         "p_tenant_id => 'A', p_run_ids => ARRAY['r1'])"
                                         ).fetchone())

        thread = threading.Thread(target=delete)
        thread.start()
        deadline = time.monotonic() + 30
        while probe.execute("SELECT %s = ANY (pg_blocking_pids(%s))",
                            (inflight_pid, other.info.backend_pid)).fetchone() != (True,):
            assert thread.is_alive() and time.monotonic() < deadline, \
                "delete_for_runs did not wait for the put_writes in flight"
            time.sleep(0.01)
        inflight.commit()
        thread.join(30)
    assert deleted == [(1,)]


def test_a_deleted_heads_run_cannot_continue_from_it(fast_path_world: str, fast_path_worker: str) -> None:
    """Delete_for_runs left a head on a deleted checkpoint while a put_writes held
    the namespace (0006-0008); fixed in 0009."""
    stale_head_after_delete_for_runs(fast_path_world, fast_path_worker)
    with connect_as(fast_path_world, fast_path_worker) as w:
        head = w.execute("SELECT checkpoint_id FROM replaysafe.langgraph_get_tuple("
                         "p_tenant_id => 'A', p_thread_id => 'dr')").fetchone()
        assert head == ("d0",)
        got = w.execute(PUT_FAST, fast_params("d2", "d1", thread="dr", md=json.dumps(
            {"source": "loop", "step": 1, "run_id": "r1"}))).fetchone()
    assert got == (False, "d0"), f"a run-loop put from the deleted head d1 was stored: {got}"


def test_delete_for_runs_leaves_no_pending_write_of_a_deleted_checkpoint(fast_path_world: str,
                                                                       fast_path_worker: str) -> None:
    """Delete_for_runs left a head on a deleted checkpoint while a put_writes held
    the namespace (0006-0008); fixed in 0009."""
    stale_head_after_delete_for_runs(fast_path_world, fast_path_worker)
    s = state(fast_path_world, thread="dr")
    assert [c[0] for c in s["checkpoints"]] == ["d0"]
    assert s["writes"] == [], f"pending writes of deleted checkpoints: {s['writes']}"
    assert s["head"] in ("d0", None), f"head left on a deleted checkpoint: {s['head']}"


def test_a_stale_parent_is_refused_and_writes_nothing(fast_path_world: str, fast_path_worker: str) -> None:
    """A stale parent is refused and writes nothing."""
    with connect_as(fast_path_world, fast_path_worker) as w:
        # The refused checkpoint's pending writes, sent before its put (durability="async").
        assert w.execute(PUT_WRITES, {"tenant": "A", "thread": "t", "id": "c2"}).fetchone() == (1,)
        before = state(fast_path_world)
        assert before["writes"] == ["c2"]
        assert w.execute(PUT_FAST, fast_params("c2", "p0")).fetchone() == (False, "p1")
        # ... and after it: dropped.
        assert w.execute(PUT_WRITES, {"tenant": "A", "thread": "t", "id": "c2"}).fetchone() == (0,)
        # The stale parent again, on an id already stored: no fork (the stored checkpoint is
        # kept, its writes too), and with other content it is refused as a rewrite.
        with pytest.raises(psycopg.Error) as rewrite:
            w.execute(PUT_FAST, fast_params("p0", "p0"))
        assert rewrite.value.sqlstate == "RS001"
    after = state(fast_path_world)
    assert after["head"] == "p1" and after["checkpoints"] == before["checkpoints"]
    assert after["blobs"] == before["blobs"] and after["writes"] == []
    assert after["refused"] == ["c2"]
    assert_head_is_stored(fast_path_world)


def test_a_stored_checkpoint_saved_from_the_head_leaves_the_head(fast_path_world: str,
                                                                 fast_path_worker: str) -> None:
    """The fallback: the fast path moved the head to p0 and its insert conflicted. p0 is
    stored with other content (another parent): a stored checkpoint is never changed in
    place, so the put is refused (RS001) and nothing of it stays, the head's move neither.

    An attack on the fast path that failed , kept as a regression
    test."""
    before = state(fast_path_world)
    with connect_as(fast_path_world, fast_path_worker) as w:
        for put in (fast_params("p0", "p1", md=UPDATE, limit=1), fast_params("p1", "p1")):
            with pytest.raises(psycopg.Error) as refused:
                w.execute(PUT_FAST, put)
            assert refused.value.sqlstate == "RS001"
        # Saved again as stored: allowed, and nothing changes.
        assert w.execute(PUT_FAST, fast_params("p1", "p0")).fetchone() == (True, "p1")
    assert state(fast_path_world) == before
    assert_head_is_stored(fast_path_world)


BAD_ARRAYS = {
    "lower bound 0, empty first channel": {"channels": '[0:1]={"",c}', "versions": "{1,2}"},
    "lower bound 0, NULL first version": {"channels": "{a,c}", "versions": "[0:1]={NULL,2}"},
    "lower bound -5, empty type": {"types": '[-5:-4]={json,""}'},
    "2-D, NULL inside": {"channels": "{{a,NULL}}", "versions": "{{1,2}}"},
    "2-D types, 1025 bytes": {"types": [["json", "t" * 1025]]},
    "513 characters": {"channels": ["a", "c" * 513]},
    "1026 bytes": {"versions": ["1", "\u00e9" * 513]},
    "257 characters, 1028 bytes": {"channels": ["a", "\U0001f600" * 257]},
    "NULL blobs array": {"blobs": None},
    "one blob short": {"blobs": [b"1"]},
    "versions longer": {"versions": ["1", "2", "3"]},
}


@pytest.mark.parametrize("path", ["first put", "parent is the head", "stored id"])
@pytest.mark.parametrize("case", list(BAD_ARRAYS))
def test_the_channel_bounds_hold_on_every_path(fast_path_world: str, fast_path_worker: str, case: str,
                                               path: str) -> None:
    """The channel bounds hold on every path."""
    id_, parent, thread = {"first put": ("x1", None, "fresh"),
                           "parent is the head": ("x1", "p1", "t"),
                           "stored id": ("p0", "p1", "t")}[path]
    p = fast_params(id_, parent, thread=thread, md=UPDATE, channels=["a", "c"], versions=["1", "2"],
                    types=["json", "json"], blobs=[b"1", b"2"])
    p.update(BAD_ARRAYS[case])
    before = (state(fast_path_world, thread=thread), state(fast_path_world, tenant="B"))
    with connect_as(fast_path_world, fast_path_worker) as w:
        got = sqlstate(w, PUT_FAST, p)
    assert got == "RS005", (case, path, got)
    assert (state(fast_path_world, thread=thread), state(fast_path_world, tenant="B")) == before


def racers(dsn: str, role: str, puts: list[dict[str, Any]],
           isolation: str | None = None) -> tuple[list[threading.Thread], dict[str, Any]]:
    answers: dict[str, Any] = {}

    def go(p: dict[str, Any]) -> None:
        try:
            with connect_as(dsn, role) as c:
                if isolation:
                    c.autocommit = False
                    c.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                    c.execute("SELECT 1")  # the snapshot, before the holder commits
                    answers[p["id"] + ":snap"] = True
                    deadline = time.monotonic() + 30
                    while not answers.get("go") and time.monotonic() < deadline:
                        time.sleep(0.01)
                answers[p["id"]] = c.execute(PUT_FAST, p).fetchone()
                if isolation:
                    c.commit()
        except psycopg.Error as exc:
            answers[p["id"]] = exc.sqlstate

    threads = [threading.Thread(target=go, args=(p,), daemon=True) for p in puts]
    for t in threads:
        t.start()
    return threads, answers


def wait_blocked_by(dsn: str, holder_pid: int, n: int) -> None:
    """Until ``n`` backends wait on a lock, behind ``holder_pid`` or behind each other (a
    row's later waiters queue behind its first), never by sleeping and hoping."""
    with psycopg.connect(dsn, autocommit=True) as probe:
        deadline = time.monotonic() + 30
        while probe.execute("SELECT count(*) FROM pg_stat_activity "
                            "WHERE pid <> %s AND cardinality(pg_blocking_pids(pid)) > 0",
                            (holder_pid,)).fetchone() != (n,):
            assert time.monotonic() < deadline, f"fewer than {n} backends blocked"
            time.sleep(0.01)


@pytest.mark.parametrize("holder", ["new child", "stored id", "rolled back",
                                    "savepoint rolled back"])
def test_racing_run_loop_puts_store_one_child_of_the_head(fast_path_world: str, fast_path_worker: str,
                                                          holder: str) -> None:
    """One session holds a put on the namespace (in an open transaction); eight others put
    run-loop children of the same head meanwhile. At most one child of p1 is stored.

    An attack on the fast path that failed , kept as a regression
    test."""
    from psycopg import conninfo

    held = psycopg.connect(conninfo.make_conninfo(fast_path_world, user=fast_path_worker))
    try:
        if holder == "savepoint rolled back":
            held.execute("SAVEPOINT s")
        # "stored id": the head saved again as it is stored (an id stored already: the put
        # changes nothing, and holds the namespace all the same).
        first = {"new child": fast_params("c1", "p1"), "stored id": fast_params("p1", "p0"),
                 "rolled back": fast_params("c1", "p1"),
                 "savepoint rolled back": fast_params("c1", "p1")}[holder]
        held.execute(PUT_FAST, first).fetchone()
        if holder == "savepoint rolled back":
            held.execute("ROLLBACK TO SAVEPOINT s")
        threads, answers = racers(fast_path_world, fast_path_worker,
                                  [fast_params(f"r{i}", "p1") for i in range(8)])
        if holder == "savepoint rolled back":
            # The rollback to the savepoint let go of the namespace: the racers go on.
            for t in threads:
                t.join(30)
        else:
            wait_blocked_by(fast_path_world, held.info.backend_pid, 8)  # they wait on the namespace
        if holder == "savepoint rolled back":
            # The holder tries again from the same parent, still in its transaction.
            answers["again"] = held.execute(PUT_FAST, fast_params("c1", "p1")).fetchone()
        if holder == "rolled back":
            held.rollback()
        else:
            held.commit()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
    finally:
        held.close()
    children = loop_children(fast_path_world, "p1")
    assert len(children) == 1, (children, answers)
    stored = [k for k, v in answers.items() if isinstance(v, tuple) and v[0]]
    assert len(stored) + (holder == "new child") == 1, answers
    s = state(fast_path_world)
    assert s["head"] == children[0]
    assert_head_is_stored(fast_path_world)
    # No refused racer left a value or a write behind.
    assert set(s["blobs"]) <= {"p0", "p1", children[0]}, s


def test_a_racer_on_an_old_snapshot_cannot_fork(fast_path_world: str, fast_path_worker: str) -> None:
    """REPEATABLE READ: the racer's snapshot sees p1 as the head (before the holder's commit).

    An attack on the fast path that failed , kept as a regression
    test."""
    from psycopg import conninfo

    held = psycopg.connect(conninfo.make_conninfo(fast_path_world, user=fast_path_worker))
    try:
        threads, answers = racers(fast_path_world, fast_path_worker, [fast_params("r1", "p1")],
                                  isolation="REPEATABLE READ")
        try:
            deadline = time.monotonic() + 30
            while "r1:snap" not in answers and time.monotonic() < deadline:
                time.sleep(0.01)
            assert "r1:snap" in answers, answers
            held.execute(PUT_FAST, fast_params("c1", "p1")).fetchone()
            held.commit()
        finally:
            answers["go"] = True
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
    finally:
        held.close()
    assert answers["r1"] in ("40001", (False, "c1")), answers
    assert loop_children(fast_path_world, "p1") == ["c1"]
    assert_head_is_stored(fast_path_world)


def test_a_namespace_deleted_under_a_waiting_fast_path_refuses_it(fast_path_world: str,
                                                                  fast_path_worker: str) -> None:
    """Delete_thread holds the namespace row while a fast-path put waits on it: once the
    row is gone, the put creates a fresh namespace and is refused (no parent there).

    An attack on the fast path that failed , kept as a regression
    test."""
    from psycopg import conninfo

    deleter = psycopg.connect(conninfo.make_conninfo(fast_path_world, user=fast_path_worker))
    try:
        deleter.execute("SELECT replaysafe.langgraph_delete_thread(p_tenant_id => 'A', "
                        "p_thread_id => 't')")
        threads, answers = racers(fast_path_world, fast_path_worker, [fast_params("r1", "p1")])
        wait_blocked_by(fast_path_world, deleter.info.backend_pid, 1)
        deleter.commit()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
    finally:
        deleter.close()
    assert answers["r1"] == (False, None), answers
    s = state(fast_path_world)
    assert s["checkpoints"] == [] and s["blobs"] == [] and s["head"] is None


def test_upgrading_repairs_a_head_left_on_a_deleted_checkpoint(dsn: str) -> None:
    """0006-0008's delete_for_runs could leave a head on a deleted checkpoint ;
    0009's upgrade points such heads at the namespace's real head, so a run-loop put from
    the deleted checkpoint is refused again.

    delete_for_runs left a head on a
    deleted checkpoint while a put_writes held the namespace (0006-0008); fixed in 0009."""
    replaysafe_pg.downgrade(dsn, "0008")
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute(PUT_FAST, fast_params("d0", None, thread="dr", md=json.dumps(
            {"source": "input", "step": -1})))
        owner.execute(PUT_FAST, fast_params("d1", "d0", thread="dr"))
        # What the skipped namespace looked like: d1 deleted, the head still on it.
        owner.execute("DELETE FROM replaysafe.langgraph_checkpoints WHERE checkpoint_id = 'd1'")
        assert state(dsn, thread="dr")["head"] == "d1"
        replaysafe_pg.migrate(dsn)
        assert state(dsn, thread="dr")["head"] == "d0"
        assert owner.execute(PUT_FAST, fast_params("d2", "d1", thread="dr")).fetchone() == (False, "d0")
    assert_head_is_stored(dsn)
