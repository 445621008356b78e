"""A stored LangGraph checkpoint is never rewritten in place, by a colleague of the same tenant
either (two worker logins of tenant A): saved again as stored it changes nothing, with other
content it is RS001; only LangGraph's special writes are replaced. On revision 0010 the
stored checkpoint was rewritten."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as
from helpers.langgraph_fast_path import PUT_FAST, fast_params

Conn = psycopg.Connection[Any]


# --- a stored checkpoint is never rewritten in place --------------------------------------------------

def _put(conn: Conn, id_: str, parent: str | None, md: dict[str, Any]) -> Any:
    return conn.execute(PUT_FAST, fast_params(id_, parent, md=json.dumps(md))).fetchone()


@pytest.mark.parametrize("revision", ["0010", "head"])
def test_a_worker_cannot_rewrite_a_stored_checkpoint(new_db_at: Callable[[str], str],
                                                     make_role: Callable[..., str],
                                                     revision: str) -> None:
    """Worker 2 saves a colleague's stored, non-head checkpoint again with other metadata: on
    0010 the stored one was rewritten; now it is RS001 and nothing changes. Saving a
    checkpoint again exactly as stored is allowed and changes nothing."""
    dsn = new_db_at(schema_head() if revision == "head" else revision)
    roles = [make_role("replaysafe_worker") for _ in range(2)]
    for role in roles:
        bind(dsn, role, "A")
    first = {"source": "input", "step": -1}
    with connect_as(dsn, roles[0]) as w1, connect_as(dsn, roles[1]) as w2, \
            psycopg.connect(dsn, autocommit=True) as owner:
        _put(w1, "p0", None, first)
        _put(w1, "p1", "p0", {"source": "loop", "step": 0})
        stored = owner.execute("SELECT row_to_json(c)::text FROM replaysafe.langgraph_checkpoints c "
                               "WHERE checkpoint_id = 'p0'").fetchone()
        forged = {"source": "update", "step": -1, "forged": True}  # deliberate: never a fork
        if revision == "0010":
            _put(w2, "p0", None, forged)
            after = owner.execute("SELECT metadata ->> 'forged' FROM replaysafe.langgraph_checkpoints "
                                  "WHERE checkpoint_id = 'p0'").fetchone()
            assert after == ("true",)  # rewritten in place
            return
        with pytest.raises(psycopg.Error) as refused:
            _put(w2, "p0", None, forged)
        assert refused.value.sqlstate == "RS001"
        # The head saved again exactly as stored: accepted, nothing changes.
        assert _put(w2, "p1", "p0", {"source": "loop", "step": 0}) == (True, "p1")
        assert owner.execute("SELECT row_to_json(c)::text FROM replaysafe.langgraph_checkpoints c "
                             "WHERE checkpoint_id = 'p0'").fetchone() == stored


def schema_head() -> str:
    from replaysafe_pg.schema import head_revision

    return head_revision()


WRITES = ("SELECT replaysafe.langgraph_put_writes(p_tenant_id => 'A', p_thread_id => 't', "
          "p_checkpoint_ns => '', p_checkpoint_id => %s, p_task_id => 'task', p_task_path => '', "
          "p_idx => %s::integer[], p_channels => %s::text[], p_types => '{json}', "
          "p_blobs => %s::bytea[], p_replace => %s)")


def _thread(dsn: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn) as c:
        return tuple(c.execute(q).fetchall() for q in (
            "SELECT checkpoint_id, parent_checkpoint_id, metadata FROM replaysafe.langgraph_checkpoints "
            "ORDER BY 1",
            "SELECT checkpoint_id, idx, channel, blob FROM replaysafe.langgraph_writes ORDER BY 1, 2",
            "SELECT head, refused FROM replaysafe.langgraph_namespaces"))


def test_a_stored_non_head_checkpoint_saved_again_is_no_fork(
        dsn: str, two_workers: tuple[Conn, Conn, Conn]) -> None:
    """Saving a stored checkpoint again is never taken for a fork (which would drop its
    pending writes and refuse the ones to come): as stored it changes nothing, with other
    content it is RS001 — either way its writes and the namespace stay as they were."""
    w1, w2, _listener = two_workers
    _put(w1, "p0", None, {"source": "input", "step": -1})
    _put(w1, "p1", "p0", {"source": "loop", "step": 0})
    _put(w1, "p2", "p1", {"source": "loop", "step": 1})
    w1.execute(WRITES, ("p1", [0], ["w"], [b"v"], False))
    before = _thread(dsn)
    with pytest.raises(psycopg.Error) as refused:
        _put(w2, "p1", "p2", {"source": "loop", "step": 9})
    assert refused.value.sqlstate == "RS001"
    assert _put(w2, "p1", "p0", {"source": "loop", "step": 0}) == (True, "p2")
    assert _put(w2, "p0", None, {"source": "input", "step": -1}) == (True, "p2")
    assert _thread(dsn) == before
    assert w1.execute(WRITES, ("p1", [1], ["w"], [b"later"], False)).fetchone() == (1,)


def test_only_langgraphs_special_writes_are_replaced(dsn: str,
                                                     two_workers: tuple[Conn, Conn, Conn]) -> None:
    w1, w2, _listener = two_workers
    _put(w1, "p0", None, {"source": "input", "step": -1})
    w1.execute(WRITES, ("p0", [0], ["w"], [b"v"], False))
    w1.execute(WRITES, ("p0", [-3], ["__interrupt__"], [b"first"], False))
    before = _thread(dsn)
    # A regular write is kept as first written, p_replace or not; a special one only by its own channel.
    assert w2.execute(WRITES, ("p0", [0], ["w"], [b"evil"], True)).fetchone() == (0,)
    assert w2.execute(WRITES, ("p0", [0], ["__interrupt__"], [b"evil"], True)).fetchone() == (0,)
    assert _thread(dsn) == before
    assert w2.execute(WRITES, ("p0", [-3], ["__interrupt__"], [b"second"], True)).fetchone() == (1,)
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT blob FROM replaysafe.langgraph_writes WHERE idx = -3").fetchone() == (
            b"second",)
