"""Bad arguments: a clear InvalidArgument (RS005 from the functions, or the driver's own
check), nothing written."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint

from replaysafe_pg import InvalidArgument
from replaysafe_pg.langgraph import ReplaysafeSaver


def rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT (SELECT count(*) FROM replaysafe.langgraph_checkpoints) + "
                        "(SELECT count(*) FROM replaysafe.langgraph_writes) + "
                        "(SELECT count(*) FROM replaysafe.langgraph_blobs)").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("thread_id", ["", "x" * 513])
def test_bad_thread_ids_are_refused(dsn: str, thread_id: str) -> None:
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        with pytest.raises(InvalidArgument, match="p_thread_id"):
            saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
        with pytest.raises(InvalidArgument, match="p_thread_id"):
            saver.get_tuple(config)
        with pytest.raises(InvalidArgument, match="p_thread_id"):
            saver.put_writes({"configurable": {**config["configurable"], "checkpoint_id": "c"}},
                             [("ch", 1)], "task")
    assert rows(dsn) == 0


def test_bad_options_are_refused(dsn: str) -> None:
    with pytest.raises(InvalidArgument, match="history_limit"):
        ReplaysafeSaver(dsn, history_limit=0)
    with pytest.raises(InvalidArgument, match="tenant_id"):
        ReplaysafeSaver(dsn, tenant_id="")
    with ReplaysafeSaver(dsn, tenant_id="t1") as saver:
        with pytest.raises(ValueError, match="prune strategy"):
            saver.prune(["t"], strategy="everything")
        with pytest.raises(TypeError):
            saver.prune("t")
        with pytest.raises(TypeError):
            saver.delete_for_runs("r")
        saver.put({"configurable": {"thread_id": "src", "checkpoint_ns": ""}}, empty_checkpoint(),
                  {"source": "input", "step": -1}, {})
        saver.put({"configurable": {"thread_id": "dst", "checkpoint_ns": ""}}, empty_checkpoint(),
                  {"source": "input", "step": -1}, {})
        with pytest.raises(InvalidArgument, match="already has checkpoints"):
            saver.copy_thread("src", "dst")
    assert rows(dsn) == 2


def test_functions_refuse_bad_arguments_called_directly(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for call in (
            "SELECT replaysafe.langgraph_put('t1', 't', '', 'c', NULL, '[]', '{}')",
            "SELECT replaysafe.langgraph_put('t1', 't', '', 'c', NULL, '{}', '{}', "
            "ARRAY['a'], ARRAY[]::text[], ARRAY['x'], ARRAY['\\x00'::bytea])",
            "SELECT replaysafe.langgraph_put('t1', 't', '', 'c', NULL, '{}', '{}', "
            "p_history_limit => 0)",
            "SELECT replaysafe.langgraph_put('t1', 't', NULL, 'c', NULL, '{}', '{}')",
            "SELECT replaysafe.langgraph_prune('t1', ARRAY['t'], 'nope')",
            "SELECT replaysafe.langgraph_delete_for_runs('t1', ARRAY[NULL]::text[])",
        ):
            with pytest.raises(psycopg.DatabaseError) as caught:
                c.execute(call)  # type: ignore[arg-type]
            assert caught.value.sqlstate == "RS005", call
    assert rows(dsn) == 0


BAD_CHANNELS = [
    (["", "v1", "t"], "an empty channel"),
    (["c", "v" * 513, "t"], "a version of 513 characters"),
    (["c", "é" * 513, "t"], "a version of 1026 bytes"),
    (["c", "\U0001f600" * 257, "t"], "a version of 257 characters and 1028 bytes"),
    (["c", "v1", ""], "an empty type"),
    (["c", "v1", "t" * 1025], "a type of 1025 bytes"),
    ([None, "v1", "t"], "a NULL channel"),
    (["c", None, "t"], "a NULL version"),
    (["c", "v1", None], "a NULL type"),
]


@pytest.mark.parametrize("parent", ["first put", "parent is the head"])
@pytest.mark.parametrize(("bad", "what"), BAD_CHANNELS, ids=[w for _, w in BAD_CHANNELS])
def test_every_channel_version_and_type_is_checked(dsn: str, parent: str, bad: list[Any],
                                                   what: str) -> None:
    """The channel arrays are checked element by element before anything is written: on a
    namespace's first put and on the common path (a parent that is the head)."""
    call = ("SELECT stored FROM replaysafe.langgraph_put('t1', 't', '', %s, %s, '{}', '{}', "
            "%s::text[], %s::text[], %s::text[], %s::bytea[])")
    with psycopg.connect(dsn, autocommit=True) as c:
        parent_id = None
        if parent == "parent is the head":
            parent_id = "c0"
            c.execute(call, ("c0", None, ["ok"], ["1"], ["json"], [b"{}"]))
        before = rows(dsn)
        channel, version, type_ = bad
        with pytest.raises(psycopg.DatabaseError,
                           match="every channel, version and type") as caught:
            c.execute(call, ("c1", parent_id, ["fine", channel], ["2", version],
                             ["json", type_], [b"1", b"2"]))
        assert caught.value.sqlstate == "RS005", what
        head = c.execute("SELECT head FROM replaysafe.langgraph_namespaces").fetchall()
    assert rows(dsn) == before
    assert head == ([("c0",)] if parent_id else [])


def test_a_connection_in_pipeline_mode_is_refused(dsn: str) -> None:
    """A put sent inside ``with conn.pipeline()`` would be answered only at the block's end
    (its compare-and-swap unseen), a get_tuple would answer None for a stored checkpoint:
    both are refused before anything is sent."""
    config: Any = {"configurable": {"thread_id": "th", "checkpoint_ns": ""}}
    with psycopg.connect(dsn, autocommit=True) as conn:
        saver = ReplaysafeSaver(conn, tenant_id="t1")
        with conn.pipeline():
            with pytest.raises(InvalidArgument, match="pipeline mode"):
                saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
            with pytest.raises(InvalidArgument, match="pipeline mode"):
                saver.get_tuple(config)
        assert rows(dsn) == 0
        saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
        assert saver.get_tuple(config) is not None
