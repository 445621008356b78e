"""Security review of revision 0006_langgraph (the LangGraph checkpointer tables and functions)
and of its Python side (replaysafe_pg.langgraph), tried as an attacker holding a worker's
credentials (a LOGIN role in replaysafe_worker bound to tenant A, what a prompt-injected agent
holds), an auditor's, or an operator's bound to A.

Sections marked ``FINDING`` reproduce an attack that worked on the revision reviewed (their
tests failed until it was fixed; each section says how). The others are attacks that failed.
All are kept as regression tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")


import ormsgpack
from helpers.db import bind, connect_as, sqlstate
from helpers.lg_graphs import NODES, chain_graph
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from psycopg import conninfo as pg_conninfo
from test_trust_boundary import called_names, plant_overloads, plant_temp_domains

from replaysafe_pg.langgraph import ReplaysafeSaver, StaleCheckpointError

Conn = psycopg.Connection[Any]
MakeRole = Callable[..., str]
ROOT = Path(__file__).resolve().parents[2]

PUT = ("SELECT * FROM replaysafe.langgraph_put(p_tenant_id => %(tenant)s, "
       "p_thread_id => %(thread)s, p_checkpoint_ns => %(ns)s, p_checkpoint_id => %(id)s, "
       "p_parent_id => %(parent)s::text, p_checkpoint => %(cp)s::jsonb, "
       "p_metadata => %(md)s::jsonb, p_channels => %(channels)s::text[], "
       "p_versions => %(versions)s::text[], p_types => %(types)s::text[], "
       "p_blobs => %(blobs)s::bytea[], p_history_limit => %(limit)s::integer)")
PUT_WRITES = ("SELECT replaysafe.langgraph_put_writes(p_tenant_id => %(tenant)s, "
              "p_thread_id => %(thread)s, p_checkpoint_ns => %(ns)s, "
              "p_checkpoint_id => %(id)s, p_task_id => %(task)s, p_task_path => %(path)s, "
              "p_idx => %(idx)s::integer[], p_channels => %(channels)s::text[], "
              "p_types => %(types)s::text[], p_blobs => %(blobs)s::bytea[], "
              "p_replace => %(replace)s)")
LANGGRAPH_FUNCTIONS = ("langgraph_put", "langgraph_put_writes", "langgraph_get_tuple",
                       "langgraph_list", "langgraph_delete_thread", "langgraph_delete_for_runs",
                       "langgraph_copy_thread", "langgraph_prune")


def put_params(tenant: str = "A", thread: str = "t", **over: Any) -> dict[str, Any]:
    cp = empty_checkpoint()
    params: dict[str, Any] = {
        "tenant": tenant, "thread": thread, "ns": "", "id": cp["id"], "parent": None,
        "cp": json.dumps({k: v for k, v in cp.items() if k != "channel_values"}),
        "md": json.dumps({"source": "update", "step": 0}),
        "channels": [], "versions": [], "types": [], "blobs": [], "limit": None}
    params.update(over)
    return params


def seed_thread(saver: ReplaysafeSaver, thread_id: str, value: str) -> dict[str, Any]:
    """One checkpoint with one value and one pending write, through the saver."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    cp = empty_checkpoint()
    cp["channel_values"] = {"who": value}
    cp["channel_versions"] = {"who": saver.get_next_version(None)}
    stored = saver.put(config, cp, {"source": "input", "step": -1, "run_id": f"run-{value}"},
                       cp["channel_versions"])
    saver.put_writes(stored, [("who", value)], "task")
    return stored


def counts(dsn: str, tenant: str) -> tuple[int, ...]:
    """Rows of ``tenant`` in each langgraph table, read as the schema owner."""
    with psycopg.connect(dsn) as c:
        row = c.execute(
            "SELECT (SELECT count(*) FROM replaysafe.langgraph_checkpoints WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM replaysafe.langgraph_blobs WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM replaysafe.langgraph_writes WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM replaysafe.langgraph_namespaces WHERE tenant_id = %(t)s)",
            {"t": tenant}).fetchone()
    assert row is not None
    return tuple(row)


@pytest.fixture
def world(dsn: str) -> str:
    """Tenants A and B, each with a thread "t" (and B with "secret"), written by the owner."""
    with ReplaysafeSaver(dsn, tenant_id="A") as a, ReplaysafeSaver(dsn, tenant_id="B") as b:
        seed_thread(a, "t", "A")
        seed_thread(b, "t", "B")
        seed_thread(b, "secret", "B")
    return dsn


def login(dsn: str, make_role: MakeRole, tenant: str | None, group: str = "replaysafe_worker") -> str:
    role = make_role(group)
    if tenant is not None:
        bind(dsn, role, tenant)
    return role


# =============================================================================================
# FINDING 1 (high, fixed: strict serializer by default, pickle tags refused unless
# allow_pickle=True): a worker's crafted blob runs code in every process that loads the
# checkpoint. The saver hands the type tag and bytes it reads back to LangGraph's default
# JsonPlusSerializer, whose msgpack ext hook (permissive unless LANGGRAPH_STRICT_MSGPACK=true)
# imports any module and calls any attribute: ("builtins", "exec", "<code>").
# =============================================================================================

def evil_msgpack(marker: Path) -> bytes:
    code = f"open({str(marker)!r}, 'w').write('pwned')"
    # Ext code 0 = EXT_CONSTRUCTOR_SINGLE_ARG: getattr(import_module(m), name)(arg).
    return ormsgpack.packb(ormsgpack.Ext(0, ormsgpack.packb(["builtins", "exec", code])))


def plant_blob(worker: Conn, where: str, type_: str, blob: bytes) -> None:
    """As tenant A's worker, by hand: the blob as a channel value of a new head checkpoint
    ("value") or as a pending write on the current head ("pending_write")."""
    head = worker.execute("SELECT checkpoint_id, checkpoint FROM replaysafe.langgraph_get_tuple("
                          "p_tenant_id => 'A', p_thread_id => 't')").fetchone()
    assert head is not None
    head_id, checkpoint = head
    if where == "pending_write":
        worker.execute(PUT_WRITES, {"tenant": "A", "thread": "t", "ns": "", "id": head_id,
                                    "task": "x", "path": "", "idx": [0], "channels": ["who"],
                                    "types": [type_], "blobs": [blob], "replace": False})
        return
    new = empty_checkpoint()  # a newer id
    checkpoint["id"] = new["id"]
    checkpoint["channel_versions"] = {"who": "99.evil"}
    worker.execute(PUT, put_params(id=new["id"], parent=head_id, cp=json.dumps(checkpoint),
                                   channels=["who"], versions=["99.evil"], types=[type_],
                                   blobs=[blob]))


@pytest.mark.parametrize("where", ["value", "pending_write"])
def test_a_workers_crafted_blob_runs_no_code_where_the_checkpoint_is_loaded(
        world: str, make_role: MakeRole, tmp_path: Path, where: str) -> None:
    marker = tmp_path / "pwned"
    attacker = login(world, make_role, "A")
    with connect_as(world, attacker) as worker:
        plant_blob(worker, where, "msgpack", evil_msgpack(marker))
    # Another process of tenant A (the app's graph runner, an operator's inspection script...)
    # loads the thread with the saver's defaults.
    victim = pg_conninfo.make_conninfo(world, user=login(world, make_role, "A"))
    with ReplaysafeSaver(victim, tenant_id="A") as saver:
        try:
            saver.get_tuple({"configurable": {"thread_id": "t"}})
            list(saver.list(None))
        except Exception:
            pass
    assert not marker.exists(), "the worker's blob ran code in the loading process"


def test_a_pickle_type_tag_from_the_database_is_not_trusted(
        world: str, make_role: MakeRole, tmp_path: Path) -> None:
    """With LangGraph's documented pickle_fallback=True (for values msgpack cannot encode),
    the type tag "pickle" a worker writes is pickle.loads()-ed by every reader."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    attacker = login(world, make_role, "A")
    with connect_as(world, attacker) as worker:
        plant_blob(worker, "pending_write", "pickle", pickle.dumps(Evil()))
    victim = pg_conninfo.make_conninfo(world, user=login(world, make_role, "A"))
    with ReplaysafeSaver(victim, tenant_id="A",
                         serde=JsonPlusSerializer(pickle_fallback=True)) as saver, \
            contextlib.suppress(Exception):
        saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert not marker.exists(), "a pickle written by a worker ran in the loading process"


def test_allow_pickle_opts_in_to_pickled_values(dsn: str) -> None:
    """The way back for trusted writers: allow_pickle=True stores and loads a value only
    pickle can encode; without it the same value is refused at the write, nothing stored."""
    config = {"configurable": {"thread_id": "pickled", "checkpoint_ns": ""}}
    cp = empty_checkpoint()
    cp["channel_values"] = {"v": types.SimpleNamespace(x=1)}  # msgpack cannot encode it
    cp["channel_versions"] = {"v": "1"}
    md = {"source": "update", "step": 0}
    serde = JsonPlusSerializer(pickle_fallback=True)
    with ReplaysafeSaver(dsn, tenant_id="A", serde=serde) as refusing:
        with pytest.raises(ValueError, match="allow_pickle"):
            refusing.put(config, cp, md, cp["channel_versions"])
        assert refusing.get_tuple(config) is None
    with ReplaysafeSaver(dsn, tenant_id="A", serde=serde, allow_pickle=True) as trusting:
        trusting.put(config, cp, md, cp["channel_versions"])
        found = trusting.get_tuple(config)
    assert found is not None and found.checkpoint["channel_values"]["v"].x == 1


def test_a_strict_serializer_runs_no_code_from_a_crafted_blob(
        world: str, make_role: MakeRole, tmp_path: Path) -> None:
    """The way out of finding 1 works with this saver: a strict JsonPlusSerializer (no
    module outside LangGraph's safe list) returns the raw payload instead of calling it."""
    marker = tmp_path / "pwned"
    attacker = login(world, make_role, "A")
    with connect_as(world, attacker) as worker:
        plant_blob(worker, "value", "msgpack", evil_msgpack(marker))
        plant_blob(worker, "pending_write", "msgpack", evil_msgpack(marker))
    with ReplaysafeSaver(world, tenant_id="A",
                         serde=JsonPlusSerializer(allowed_msgpack_modules=None)) as saver:
        found = saver.get_tuple({"configurable": {"thread_id": "t"}})
        list(saver.list(None))
    assert found is not None and not marker.exists()


# =============================================================================================
# FINDING 2 (medium, fixed: the savers override with_allowlist): LangGraph's own hardening
# was lost. With LANGGRAPH_STRICT_MSGPACK=true,
# compile() derives an allowlist from the graph's state types and installs it with
# checkpointer.with_allowlist(), a shallow copy with a new .serde; the saver's Codec keeps
# the serializer it was built with, so the graph's own state types come back as raw data.
# =============================================================================================

STRICT_SCRIPT = textwrap.dedent("""
    import enum, json, sys
    from typing import TypedDict
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from replaysafe_pg.langgraph import ReplaysafeSaver

    class Color(enum.Enum):
        RED = "red"

    class S(TypedDict):
        color: Color

    def build(cp):
        g = StateGraph(S)
        g.add_node("n", lambda s: {"color": Color.RED})
        g.add_edge(START, "n")
        g.add_edge("n", END)
        return g.compile(checkpointer=cp)

    out = {}
    with ReplaysafeSaver(sys.argv[1], tenant_id="A") as ours:
        for name, cp in (("InMemorySaver", InMemorySaver()), ("ReplaysafeSaver", ours)):
            graph = build(cp)
            cfg = {"configurable": {"thread_id": "strict"}}
            graph.invoke({"color": Color.RED}, cfg)
            out[name] = type(graph.get_state(cfg).values["color"]).__name__
    print(json.dumps(out))
""")


def test_langgraphs_strict_msgpack_allowlist_reaches_the_saver(dsn: str) -> None:
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", STRICT_SCRIPT, dsn], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    types_seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert types_seen["InMemorySaver"] == "Color"  # LangGraph's own answer
    assert types_seen["ReplaysafeSaver"] == "Color", types_seen


# =============================================================================================
# FINDING 3 (medium; fixed: the head is kept on the namespace row).
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
    with ReplaysafeSaver(dsn, tenant_id="A") as saver:
        graph = chain_graph(saver, [])
        graph.invoke({"log": []}, run_config("skew", "first"), durability="sync")
        lagging_clock(2.0)
        # One run at a time: there is no conflict to report.
        graph.invoke({"log": []}, run_config("skew", "late"), durability="sync")
        state = graph.get_state({"configurable": {"thread_id": "skew"}}).values["log"]
    assert state[-3:] == [f"late:{n}" for n in NODES]


# =============================================================================================
# FINDING 4 (medium, fixed: a parentless run-loop checkpoint whose versions_seen records a
# run's work is refused in a namespace that has checkpoints).
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
    lock it must see the first one's head (not the empty namespace it saw before waiting)."""
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


# =============================================================================================
# FINDING 5 (low; fixed: RS005).
# A worker poisoned reads of its whole tenant. langgraph_put accepts any JSON
# object as p_checkpoint; a "channel_versions" that is not an object makes jsonb_each_text
# raise 22023 in every get_tuple of that thread, in every langgraph_list of the tenant without
# a thread (the saver's list(None)), and in every later put with a history limit once the
# checkpoint is among the oldest. Expected: RS005 at the write.
# =============================================================================================

@pytest.mark.parametrize("versions", ["[]", '"x"', "1", "null"])
def test_a_checkpoint_whose_channel_versions_is_not_an_object_is_refused(
        world: str, make_role: MakeRole, versions: str) -> None:
    attacker = login(world, make_role, "A")
    with connect_as(world, attacker) as worker:
        cp = empty_checkpoint()
        body = {k: v for k, v in cp.items() if k != "channel_values"}
        body["channel_versions"] = json.loads(versions)
        state = sqlstate(worker, PUT, put_params(thread="poison", id=cp["id"],
                                                 cp=json.dumps(body)))
        poisoned = sqlstate(worker, "SELECT * FROM replaysafe.langgraph_list(p_tenant_id => 'A')")
    assert (state, poisoned) == ("RS005", None)


# =============================================================================================
# FINDING 6 (low; fixed: NULL elements refused, channel/version/namespace bounded).
# Inputs the functions do not check end in raw errors (a NOT NULL violation,
# an index row too large: 23502 / 54000) instead of RS005; docs/isolation.md made ids bounded
# in bytes for this very reason.
# =============================================================================================

# Text that compresses poorly (an index row is compressed before its size is checked).
NOISE = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1300))  # 3,900 bytes

BAD_PUTS = {
    "null channel": {"channels": [None], "versions": ["1"], "types": ["null"], "blobs": [b""]},
    "null version": {"channels": ["c"], "versions": [None], "types": ["null"], "blobs": [b""]},
    "null type": {"channels": ["c"], "versions": ["1"], "types": [None], "blobs": [b""]},
    "huge channel": {"channels": [NOISE], "versions": ["1"], "types": ["null"], "blobs": [b""]},
    "huge version": {"channels": ["c"], "versions": [NOISE], "types": ["null"], "blobs": [b""]},
    "huge namespace": {"ns": NOISE},
}


@pytest.mark.parametrize("case", list(BAD_PUTS))
def test_bad_put_arguments_are_rs005(world: str, make_role: MakeRole, case: str) -> None:
    with connect_as(world, login(world, make_role, "A")) as worker:
        assert sqlstate(worker, PUT, put_params(thread="bad", **BAD_PUTS[case])) == "RS005"


BAD_WRITES = {
    "null idx": {"idx": [None]},
    "null channel": {"channels": [None]},
    "null type": {"types": [None]},
    "null blob": {"blobs": [None]},
    "huge namespace": {"ns": NOISE},
}


@pytest.mark.parametrize("case", list(BAD_WRITES))
def test_bad_put_writes_arguments_are_rs005(world: str, make_role: MakeRole,
                                                    case: str) -> None:
    params = {"tenant": "A", "thread": "bad", "ns": "", "id": "c1", "task": "x", "path": "",
              "idx": [0], "channels": ["c"], "types": ["null"], "blobs": [b""], "replace": False}
    params.update(BAD_WRITES[case])
    with connect_as(world, login(world, make_role, "A")) as worker:
        assert sqlstate(worker, PUT_WRITES, params) == "RS005"


# =============================================================================================
# Attacks that failed (regression tests)
# =============================================================================================

def b_calls() -> list[tuple[str, dict[str, Any] | None]]:
    """Every langgraph function, aimed at tenant B's rows."""
    return [
        (PUT, put_params(tenant="B", thread="t", md=json.dumps({"source": "fork", "step": 9}))),
        (PUT_WRITES, {"tenant": "B", "thread": "t", "ns": "", "id": "x", "task": "x",
                      "path": "", "idx": [0], "channels": ["who"], "types": ["null"],
                      "blobs": [b""], "replace": True}),
        ("SELECT * FROM replaysafe.langgraph_get_tuple(p_tenant_id => 'B', p_thread_id => 't')",
         None),
        ("SELECT * FROM replaysafe.langgraph_list(p_tenant_id => 'B')", None),
        ("SELECT * FROM replaysafe.langgraph_list(p_tenant_id => 'B', p_thread_id => 'secret', "
         "p_filter => '{\"source\": \"input\"}', p_limit => NULL)", None),
        ("SELECT replaysafe.langgraph_delete_thread(p_tenant_id => 'B', p_thread_id => 't')",
         None),
        ("SELECT replaysafe.langgraph_delete_for_runs(p_tenant_id => 'B', "
         "p_run_ids => ARRAY['run-B'])", None),
        ("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => 'B', "
         "p_source_thread_id => 'secret', p_target_thread_id => 'stolen')", None),
        ("SELECT replaysafe.langgraph_prune(p_tenant_id => 'B', p_thread_ids => ARRAY['t'], "
         "p_strategy => 'delete')", None),
        ("SELECT replaysafe.langgraph_prune(p_tenant_id => 'B', "
         "p_thread_ids => ARRAY['t', 'secret'])", None),
    ]


@pytest.mark.parametrize("who", ["worker_a", "worker_a_set_role_group", "operator_a",
                                 "auditor_a", "auditor_unbound", "worker_unbound"])
def test_no_role_reaches_another_tenants_checkpoints(world: str, make_role: MakeRole,
                                                     who: str) -> None:
    group = {"operator_a": "replaysafe_operator", "auditor_a": "replaysafe_auditor",
             "auditor_unbound": "replaysafe_auditor"}.get(who, "replaysafe_worker")
    tenant = None if who.endswith("unbound") else "A"
    before = counts(world, "B")
    with connect_as(world, login(world, make_role, tenant, group)) as c:
        if who == "worker_a_set_role_group":
            c.execute("SET ROLE replaysafe_worker")
        states = [sqlstate(c, q, p) for q, p in b_calls()]
    assert set(states) <= {"RS004", "42501"}, states
    assert counts(world, "B") == before


def test_tenant_a_cannot_name_tenant_bs_rows_from_its_own_tenant(
        world: str, make_role: MakeRole) -> None:
    """B's checkpoint ids and thread names, used under tenant A, reach only A's rows."""
    with psycopg.connect(world) as owner:
        b_head = owner.execute("SELECT checkpoint_id FROM replaysafe.langgraph_checkpoints "
                               "WHERE tenant_id = 'B' AND thread_id = 'secret'").fetchone()
    assert b_head is not None
    before = counts(world, "B")
    with connect_as(world, login(world, make_role, "A")) as w:
        assert w.execute("SELECT * FROM replaysafe.langgraph_get_tuple(p_tenant_id => 'A', "
                         "p_thread_id => 'secret', p_checkpoint_id => %s)", b_head).fetchall() == []
        assert w.execute("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => 'A', "
                         "p_source_thread_id => 'secret', p_target_thread_id => 'stolen')"
                         ).fetchone() == (0,)
        assert w.execute("SELECT replaysafe.langgraph_delete_for_runs(p_tenant_id => 'A', "
                         "p_run_ids => ARRAY['run-B'])").fetchone() == (0,)
        assert w.execute("SELECT replaysafe.langgraph_prune(p_tenant_id => 'A', "
                         "p_thread_ids => ARRAY['secret'], p_strategy => 'delete')"
                         ).fetchone() == (0,)
        rows = w.execute("SELECT thread_id FROM replaysafe.langgraph_list(p_tenant_id => 'A', "
                         "p_filter => '{}', p_limit => NULL)").fetchall()
    assert rows == [("t",)]
    assert counts(world, "B") == before


def test_langgraph_functions_build_no_sql_and_pin_their_search_path(dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        rows = c.execute("SELECT proname, prosrc, prosecdef, proconfig FROM pg_proc "
                         "WHERE pronamespace = 'replaysafe'::regnamespace "
                         "AND proname LIKE '%%langgraph%%'").fetchall()
    assert {r[0] for r in rows} >= set(LANGGRAPH_FUNCTIONS)
    for name, src, secdef, config in rows:
        assert config == ["search_path=pg_catalog, pg_temp"], name
        assert secdef == (not name.startswith("_")), name
        assert "EXECUTE" not in src.upper().replace("EXECUTE ON", ""), name
        assert "format(" not in src, name


def test_only_the_worker_group_may_call_the_langgraph_functions_and_nobody_reads_the_tables(
        dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        grants = c.execute("""
            SELECT p.proname::text, coalesce(a.grantee::regrole::text, 'PUBLIC'), a.privilege_type
            FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
            WHERE p.pronamespace = 'replaysafe'::regnamespace AND p.proname LIKE '%%langgraph%%'
              AND a.grantee <> p.proowner""").fetchall()
        tables = c.execute("""
            SELECT c.relname::text, a.grantee::regrole::text, a.privilege_type
            FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relname LIKE 'langgraph%%'
              AND a.grantee <> c.relowner""").fetchall()
        rls = c.execute("SELECT relname::text FROM pg_class WHERE relnamespace = "
                        "'replaysafe'::regnamespace AND relname LIKE 'langgraph%%' "
                        "AND relkind = 'r' AND NOT relrowsecurity").fetchall()
    assert sorted(grants) == sorted((f, "replaysafe_worker", "EXECUTE")
                                    for f in LANGGRAPH_FUNCTIONS)
    assert tables == [] and rls == []


def test_default_privileges_open_no_langgraph_function_or_table(
        empty_dsn: str, make_role: MakeRole) -> None:
    app = make_role()
    grants = ("EXECUTE ON FUNCTIONS", "ALL ON TABLES", "USAGE ON TYPES")
    with psycopg.connect(empty_dsn, autocommit=True) as owner:
        for grant in grants:
            owner.execute(f'ALTER DEFAULT PRIVILEGES GRANT {grant} TO "{app}"')
            owner.execute(f'ALTER DEFAULT PRIVILEGES GRANT {grant} TO replaysafe_worker')
    try:
        import replaysafe_pg

        replaysafe_pg.migrate(empty_dsn)
        with psycopg.connect(empty_dsn) as owner:
            fns = owner.execute(
                "SELECT p.proname::text FROM pg_proc p WHERE p.pronamespace = "
                "'replaysafe'::regnamespace AND p.proname LIKE '%%langgraph%%' "
                "AND has_function_privilege(%s, p.oid, 'EXECUTE')", (app,)).fetchall()
            tabs = owner.execute(
                "SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = "
                "'replaysafe'::regnamespace AND c.relname LIKE 'langgraph%%' AND c.relkind = 'r' "
                "AND (has_table_privilege(%s, c.oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE') "
                "OR has_table_privilege('replaysafe_worker', c.oid, "
                "'SELECT,INSERT,UPDATE,DELETE,TRUNCATE'))", (app,)).fetchall()
            private = owner.execute(
                "SELECT p.proname::text FROM pg_proc p WHERE p.pronamespace = "
                "'replaysafe'::regnamespace AND p.proname LIKE '\\_langgraph%%' "
                "AND has_function_privilege('replaysafe_worker', p.oid, 'EXECUTE')").fetchall()
        assert fns == [] and tabs == [] and private == []
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as owner:
            for grant in grants:
                owner.execute(f'ALTER DEFAULT PRIVILEGES REVOKE {grant} FROM "{app}"')
                owner.execute(f'ALTER DEFAULT PRIVILEGES REVOKE {grant} FROM replaysafe_worker')
            owner.execute(f'DROP OWNED BY "{app}"')


def own_calls(tenant: str) -> list[tuple[str, dict[str, Any] | None]]:
    """Every langgraph function down its main paths, on ``tenant``'s own rows."""
    t = f"p_tenant_id => '{tenant}'"
    first = empty_checkpoint()
    second = empty_checkpoint()
    cp = {k: v for k, v in first.items() if k != "channel_values"}
    cp["channel_versions"] = {"c": "1"}
    loop = json.dumps({"source": "loop", "step": 0, "run_id": "r1"})
    return [
        (PUT, put_params(tenant, "h", id=first["id"], cp=json.dumps(cp),
                         md=json.dumps({"source": "input", "step": -1, "run_id": "r1"}),
                         channels=["c"], versions=["1"], types=["null"], blobs=[b""])),
        (PUT, put_params(tenant, "h", id=second["id"], parent=first["id"], md=loop, limit=1)),
        (PUT, put_params(tenant, "h", id=empty_checkpoint()["id"], parent=first["id"],
                         md=loop)),  # refused
        (PUT_WRITES, {"tenant": tenant, "thread": "h", "ns": "", "id": second["id"],
                      "task": "x", "path": "", "idx": [0, -1], "channels": ["c", "__error__"],
                      "types": ["null", "null"], "blobs": [b"", b""], "replace": False}),
        (PUT_WRITES, {"tenant": tenant, "thread": "h", "ns": "", "id": second["id"],
                      "task": "x", "path": "", "idx": [-1], "channels": ["__error__"],
                      "types": ["null"], "blobs": [b""], "replace": True}),
        (f"SELECT * FROM replaysafe.langgraph_get_tuple({t}, p_thread_id => 'h')", None),
        (f"SELECT * FROM replaysafe.langgraph_get_tuple({t}, p_thread_id => 'h', "
         f"p_checkpoint_id => '{second['id']}')", None),
        (f"SELECT * FROM replaysafe.langgraph_list({t}, p_filter => '{{\"source\": \"loop\"}}', "
         f"p_before => '{'f' * 36}', p_limit => 5)", None),
        (f"SELECT replaysafe.langgraph_copy_thread({t}, p_source_thread_id => 'h', "
         "p_target_thread_id => 'h2')", None),
        (f"SELECT replaysafe.langgraph_prune({t}, p_thread_ids => ARRAY['h2'])", None),
        (f"SELECT replaysafe.langgraph_delete_for_runs({t}, p_run_ids => ARRAY['r1'])", None),
        (f"SELECT replaysafe.langgraph_prune({t}, p_thread_ids => ARRAY['h2'], "
         "p_strategy => 'delete')", None),
        (f"SELECT replaysafe.langgraph_delete_thread({t}, p_thread_id => 'h')", None),
    ]


def qualified(query: str) -> str:
    """The caller's own casts, qualified (a pg_temp domain shadows the caller's own types:
    its own business, not the functions')."""
    return (query.replace("::integer", "::pg_catalog.int4").replace("::text", "::pg_catalog.text")
            .replace("::jsonb", "::pg_catalog.jsonb").replace("::bytea", "::pg_catalog.bytea"))


def test_hostile_overloads_never_run_inside_the_langgraph_functions(
        world: str, make_role: MakeRole) -> None:
    with psycopg.connect(world, autocommit=True) as owner:
        names = called_names(owner)
        assert {"jsonb_each_text", "cardinality", "array_agg", "octet_length"} <= names
        attacker = login(world, make_role, "A")
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    try:
        with connect_as(world, attacker) as c:
            assert plant_overloads(c, names) > 100
            for op, typ in (("@>", "jsonb"), ("<", "text"), ("<=", "text"), (">", "text")):
                fn = f"hijack_{typ}_{len(op)}_{ord(op[0])}"
                c.execute(f"CREATE FUNCTION public.{fn}(a {typ}, b {typ}) RETURNS boolean "
                          "LANGUAGE plpgsql AS $f$ BEGIN INSERT INTO public.hijacked "
                          "VALUES ('operator', current_user); RETURN true; END $f$")
                c.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {typ}, RIGHTARG = {typ}, "
                          f"FUNCTION = public.{fn})")
            c.execute("CREATE FUNCTION public.hijack_get(a jsonb, b text) RETURNS text "
                      "LANGUAGE plpgsql AS $f$ BEGIN INSERT INTO public.hijacked "
                      "VALUES ('->>', current_user); RETURN 'loop'; END $f$")
            c.execute("CREATE OPERATOR public.->> (LEFTARG = jsonb, RIGHTARG = text, "
                      "FUNCTION = public.hijack_get)")
        ok = []
        for conn in (connect_as(world, attacker), psycopg.connect(world, autocommit=True)):
            with conn as victim:
                plant_temp_domains(victim)
                victim.execute("SET search_path = public, pg_catalog")
                ok.append(sum(sqlstate(victim, qualified(q), p) is None
                              for q, p in own_calls("A")))
        with psycopg.connect(world, autocommit=True) as owner:
            assert owner.execute("SELECT DISTINCT name FROM public.hijacked").fetchall() == []
        assert ok == [len(own_calls("A"))] * 2, ok
    finally:
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute("DROP TABLE IF EXISTS public.hijacked CASCADE")
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


def test_run_loop_checkpoints_cannot_fork_a_thread_by_their_parent(world: str,
                                                                   make_role: MakeRole) -> None:
    """Tried by hand on the CAS rule: a stale parent, a missing parent on a run's first
    checkpoint, the same id again with another parent, NULL and unknown namespaces."""
    with connect_as(world, login(world, make_role, "A")) as w:
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


def test_doctor_notices_langgraph_privileges_and_rls_given_by_hand(dsn: str) -> None:
    from helpers.cli import run

    assert run("doctor", dsn=dsn).exit_code == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("GRANT EXECUTE ON FUNCTION replaysafe.langgraph_list(text, text, text, "
                     "text, jsonb, text, integer, text) TO replaysafe_auditor")
        conn.execute("GRANT SELECT ON replaysafe.langgraph_blobs TO replaysafe_worker")
        conn.execute("ALTER TABLE replaysafe.langgraph_writes DISABLE ROW LEVEL SECURITY")
    result = run("doctor", dsn=dsn)
    assert result.exit_code == 1
    assert "replaysafe.langgraph_list(" in result.stdout and "to replaysafe_auditor" in result.stdout
    assert "SELECT on table langgraph_blobs to replaysafe_worker" in result.stdout
    assert "row-level security on langgraph_writes: DISABLED" in result.stdout


# =============================================================================================
# FINDING 7 (low; fixed: namespaces locked FOR UPDATE first).
# Delete_thread (and prune "delete") is not atomic against a put in flight: it
# takes no namespace lock first, so a checkpoint committed by a concurrent put (its rows not
# yet visible to the DELETEs) survives a delete_thread that returned. A "deleted" thread then
# comes back with state from before the deletion.
# =============================================================================================

@pytest.mark.parametrize("how", ["delete_thread", "prune_delete"])
def test_delete_thread_leaves_nothing_of_a_put_in_flight(world: str, how: str) -> None:
    head = empty_checkpoint()
    body = json.dumps({k: v for k, v in head.items() if k != "channel_values"})
    with psycopg.connect(world) as writer:  # an open transaction: the put in flight
        writer.execute(PUT, put_params(thread="t", id=head["id"], cp=body))
        result: list[Any] = []
        call = ("SELECT replaysafe.langgraph_delete_thread(p_tenant_id => 'A', p_thread_id => 't')"
                if how == "delete_thread" else
                "SELECT replaysafe.langgraph_prune(p_tenant_id => 'A', p_thread_ids => ARRAY['t'], "
                "p_strategy => 'delete')")

        def delete() -> None:
            with psycopg.connect(world, autocommit=True) as c:
                result.append(c.execute(call).fetchone())

        deleter = threading.Thread(target=delete)
        deleter.start()
        time.sleep(0.5)  # the delete now waits on the namespace row the put holds
        writer.commit()
    deleter.join(10)
    assert result, "delete did not return"
    assert counts(world, "A") == (0, 0, 0, 0)


SRO_BAIT = """
CREATE TABLE public.loot (what text, got text);
GRANT INSERT ON public.loot TO PUBLIC;
CREATE FUNCTION public.steal() RETURNS int LANGUAGE plpgsql AS $f$
DECLARE n int;
BEGIN
    BEGIN
        SELECT count(*) INTO n FROM replaysafe.langgraph_list(p_tenant_id => 'B');
        INSERT INTO public.loot VALUES ('list', n::text);
    EXCEPTION WHEN others THEN INSERT INTO public.loot VALUES ('list', 'refused ' || SQLSTATE);
    END;
    BEGIN
        PERFORM replaysafe.langgraph_delete_thread(p_tenant_id => 'B', p_thread_id => 'secret');
        INSERT INTO public.loot VALUES ('delete', 'done');
    EXCEPTION WHEN others THEN INSERT INTO public.loot VALUES ('delete', 'refused ' || SQLSTATE);
    END;
    RETURN 1;
END $f$;
CREATE FUNCTION public.idx_f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
    $f$ BEGIN IF $1 = 0 THEN PERFORM public.steal(); END IF; RETURN $1; END $f$;
CREATE TABLE public.bait (i int);
INSERT INTO public.bait VALUES (1), (0);
"""


def test_a_workers_index_expression_in_tenant_bs_analyze_reaches_no_checkpoint(
        world: str, make_role: MakeRole) -> None:
    attacker = login(world, make_role, "A")
    victim = login(world, make_role, "B")
    with psycopg.connect(world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    before = counts(world, "B")
    try:
        with connect_as(world, attacker) as c:
            c.execute(SRO_BAIT)
            c.execute("CREATE INDEX bait_idx ON public.bait (public.idx_f(i))")
            c.execute("DELETE FROM public.loot")
            c.execute("GRANT MAINTAIN ON public.bait TO PUBLIC")
        with connect_as(world, victim) as c:
            c.execute("ANALYZE public.bait")
        with psycopg.connect(world, autocommit=True) as owner:
            loot = set(owner.execute("SELECT what, got FROM public.loot").fetchall())
        assert loot == {("list", "refused RS004"), ("delete", "refused RS004")}, loot
        assert counts(world, "B") == before
    finally:
        with psycopg.connect(world, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


# =============================================================================================
# FINDING 8 (low; fixed: values collected only under the namespace lock — taken when free
# at first, waited for since revision 0009). Delete_for_runs collected values without the
# namespace lock. A put in flight
# whose checkpoint keeps a channel at a version stored by an earlier checkpoint (LangGraph
# sends only new versions) is not yet visible to the collection, which deletes that value:
# once the put commits, its checkpoint has lost the channel (get_tuple silently omits it).
# =============================================================================================

def test_delete_for_runs_never_drops_a_value_a_put_in_flight_uses(world: str) -> None:
    config = {"configurable": {"thread_id": "runs", "checkpoint_ns": ""}}
    with ReplaysafeSaver(world, tenant_id="A") as saver:
        first = empty_checkpoint()
        first["channel_values"] = {"kept": "value of run r1"}
        first["channel_versions"] = {"kept": saver.get_next_version(None)}
        c1 = saver.put(config, first, {"source": "input", "step": -1, "run_id": "r1"},
                       first["channel_versions"])
    third = empty_checkpoint()
    third["channel_versions"] = dict(first["channel_versions"])  # unchanged channel
    body = json.dumps({k: v for k, v in third.items() if k != "channel_values"})
    with psycopg.connect(world) as writer, \
            psycopg.connect(world, autocommit=True) as other, \
            psycopg.connect(world, autocommit=True) as probe:  # run r3's put, in flight
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
    with ReplaysafeSaver(world, tenant_id="A") as saver:
        found = saver.get_tuple(config)
    assert found is not None and found.checkpoint["id"] == third["id"]
    assert found.checkpoint["channel_values"] == {"kept": "value of run r1"}
