"""The LangGraph saver's serialization (replaysafe_pg.langgraph), tried as an attacker holding a
worker's credentials who writes blobs by hand: a crafted blob or a pickle type tag read back
from the database runs no code where the checkpoint is loaded; pickled values only with
allow_pickle=True; LangGraph's strict msgpack allowlist reaches the saver."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")
import ormsgpack
from helpers.db import connect_as
from helpers.langgraph_rows import PUT, PUT_WRITES, login, put_params
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from psycopg import conninfo as pg_conninfo

from replaysafe_pg.langgraph import ReplaysafeSaver

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


ROOT = Path(__file__).resolve().parents[3]


# =============================================================================================
# A strict serializer by default, pickle tags refused unless allow_pickle=True. Without it, a
# worker's crafted blob would run code in every process that loads the
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
        checkpointed_world: str, make_role: MakeRole, tmp_path: Path, where: str) -> None:
    """A worker's crafted blob runs code in every process that loads the
    checkpoint; fixed: strict serializer by default, pickle tags refused unless
    allow_pickle=True."""
    marker = tmp_path / "pwned"
    attacker = login(checkpointed_world, make_role, "A")
    with connect_as(checkpointed_world, attacker) as worker:
        plant_blob(worker, where, "msgpack", evil_msgpack(marker))
    # Another process of tenant A (the app's graph runner, an operator's inspection script...)
    # loads the thread with the saver's defaults.
    victim = pg_conninfo.make_conninfo(checkpointed_world, user=login(checkpointed_world, make_role, "A"))
    with ReplaysafeSaver(victim, tenant_id="A") as saver:
        try:
            saver.get_tuple({"configurable": {"thread_id": "t"}})
            list(saver.list(None))
        except Exception:
            pass
    assert not marker.exists(), "the worker's blob ran code in the loading process"


def test_a_pickle_type_tag_from_the_database_is_not_trusted(
        checkpointed_world: str, make_role: MakeRole, tmp_path: Path) -> None:
    """With LangGraph's documented pickle_fallback=True (for values msgpack cannot encode),
    the type tag "pickle" a worker writes is pickle.loads()-ed by every reader.

    A worker's crafted
    blob runs code in every process that loads the checkpoint; fixed: strict serializer by
    default, pickle tags refused unless allow_pickle=True."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    attacker = login(checkpointed_world, make_role, "A")
    with connect_as(checkpointed_world, attacker) as worker:
        plant_blob(worker, "pending_write", "pickle", pickle.dumps(Evil()))
    victim = pg_conninfo.make_conninfo(checkpointed_world, user=login(checkpointed_world, make_role, "A"))
    with ReplaysafeSaver(victim, tenant_id="A",
                         serde=JsonPlusSerializer(pickle_fallback=True)) as saver, \
            contextlib.suppress(Exception):
        saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert not marker.exists(), "a pickle written by a worker ran in the loading process"


def test_allow_pickle_opts_in_to_pickled_values(dsn: str) -> None:
    """The way back for trusted writers: allow_pickle=True stores and loads a value only
    pickle can encode; without it the same value is refused at the write, nothing stored.

    A worker's crafted
    blob runs code in every process that loads the checkpoint; fixed: strict serializer by
    default, pickle tags refused unless allow_pickle=True."""
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
        checkpointed_world: str, make_role: MakeRole, tmp_path: Path) -> None:
    """The strict serializer works with this saver: a strict JsonPlusSerializer (no
    module outside LangGraph's safe list) returns the raw payload instead of calling it.

    A worker's crafted
    blob runs code in every process that loads the checkpoint; fixed: strict serializer by
    default, pickle tags refused unless allow_pickle=True."""
    marker = tmp_path / "pwned"
    attacker = login(checkpointed_world, make_role, "A")
    with connect_as(checkpointed_world, attacker) as worker:
        plant_blob(worker, "value", "msgpack", evil_msgpack(marker))
        plant_blob(worker, "pending_write", "msgpack", evil_msgpack(marker))
    with ReplaysafeSaver(checkpointed_world, tenant_id="A",
                         serde=JsonPlusSerializer(allowed_msgpack_modules=None)) as saver:
        found = saver.get_tuple({"configurable": {"thread_id": "t"}})
        list(saver.list(None))
    assert found is not None and not marker.exists()


# =============================================================================================
# The savers override with_allowlist. Without it, LangGraph's own hardening would be lost.
# With LANGGRAPH_STRICT_MSGPACK=true,
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
    """LangGraph's own hardening (the strict msgpack allowlist) was lost; fixed:
    the savers override with_allowlist."""
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", STRICT_SCRIPT, dsn], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    types_seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert types_seen["InMemorySaver"] == "Color"  # LangGraph's own answer
    assert types_seen["ReplaysafeSaver"] == "Color", types_seen
