"""langgraph_put's fast path (revision 0009) in plain SQL, for tests/sql/langgraph
(test_fast_path_put.py, test_langgraph_sql_isolation.py): the put answering (stored,
head_checkpoint_id), its parameters for a one-channel checkpoint, and what the owner reads of
a thread afterwards. The fixtures over them (``installed_revision``, ``fast_path_world``,
``fast_path_worker``): tests/sql/langgraph/conftest.py."""

from __future__ import annotations

import json
from typing import Any

import psycopg

PUT_FAST = ("SELECT stored, head_checkpoint_id FROM replaysafe.langgraph_put("
       "p_tenant_id => %(tenant)s, p_thread_id => %(thread)s, p_checkpoint_ns => %(ns)s, "
       "p_checkpoint_id => %(id)s, p_parent_id => %(parent)s::text, "
       "p_checkpoint => %(cp)s::jsonb, p_metadata => %(md)s::jsonb, "
       "p_channels => %(channels)s::text[], p_versions => %(versions)s::text[], "
       "p_types => %(types)s::text[], p_blobs => %(blobs)s::bytea[], "
       "p_history_limit => %(limit)s::integer)")


LOOP = json.dumps({"source": "loop", "step": 1})


UPDATE = json.dumps({"source": "update", "step": 1})


def fast_params(id_: str, parent: str | None, *, tenant: str = "A", thread: str = "t",
                md: str = LOOP, **over: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "tenant": tenant, "thread": thread, "ns": "", "id": id_, "parent": parent,
        "cp": json.dumps({"id": id_, "channel_versions": {"c": id_}}), "md": md,
        "channels": ["c"], "versions": [id_], "types": ["json"], "blobs": [id_.encode()],
        "limit": None}
    p.update(over)
    return p


def owner_one(dsn: str, query: str, args: Any = None) -> Any:
    with psycopg.connect(dsn) as c:
        row = c.execute(query.encode(), args).fetchone()
    return row


def state(dsn: str, tenant: str = "A", thread: str = "t") -> dict[str, Any]:
    """Everything of one thread, read as the owner."""
    with psycopg.connect(dsn) as c:
        head = c.execute("SELECT head, refused FROM replaysafe.langgraph_namespaces "
                         "WHERE tenant_id = %s AND thread_id = %s AND checkpoint_ns = ''",
                         (tenant, thread)).fetchone()
        cps = c.execute("SELECT checkpoint_id, parent_checkpoint_id, metadata ->> 'source' "
                        "FROM replaysafe.langgraph_checkpoints "
                        "WHERE tenant_id = %s AND thread_id = %s ORDER BY 1",
                        (tenant, thread)).fetchall()
        blobs = c.execute("SELECT version FROM replaysafe.langgraph_blobs "
                          "WHERE tenant_id = %s AND thread_id = %s ORDER BY 1",
                          (tenant, thread)).fetchall()
        writes = c.execute("SELECT checkpoint_id FROM replaysafe.langgraph_writes "
                           "WHERE tenant_id = %s AND thread_id = %s ORDER BY 1",
                           (tenant, thread)).fetchall()
    return {"head": head[0] if head else None, "refused": head[1] if head else None,
            "checkpoints": cps, "blobs": [b[0] for b in blobs],
            "writes": [w[0] for w in writes]}


def assert_head_is_stored(dsn: str) -> None:
    """The namespace invariant: every head names a stored checkpoint of its namespace."""
    dangling = owner_one(dsn, """
        SELECT count(*) FROM replaysafe.langgraph_namespaces n
        WHERE n.head IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM replaysafe.langgraph_checkpoints c
            WHERE (c.tenant_id, c.thread_id, c.checkpoint_ns, c.checkpoint_id)
                = (n.tenant_id, n.thread_id, n.checkpoint_ns, n.head))""")
    assert dangling == (0,)


def loop_children(dsn: str, parent: str, tenant: str = "A", thread: str = "t") -> list[str]:
    with psycopg.connect(dsn) as c:
        return [r[0] for r in c.execute(
            "SELECT checkpoint_id FROM replaysafe.langgraph_checkpoints WHERE tenant_id = %s "
            "AND thread_id = %s AND parent_checkpoint_id = %s "
            "AND metadata ->> 'source' IN ('input', 'loop') ORDER BY 1",
            (tenant, thread, parent)).fetchall()]
