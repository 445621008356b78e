"""Rows of the LangGraph checkpointer written through its SQL functions or its saver, for the
sql tier's LangGraph tests (tests/sql/langgraph): the langgraph_put and langgraph_put_writes
calls with their parameters, a seeded thread, per-tenant row counts, a bound worker login.
Imported only where langgraph is installed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
from langgraph.checkpoint.base import empty_checkpoint

from helpers.db import bind
from replaysafe_pg.langgraph import ReplaysafeSaver

MakeRole = Callable[..., str]


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


def login(dsn: str, make_role: MakeRole, tenant: str | None, group: str = "replaysafe_worker") -> str:
    role = make_role(group)
    if tenant is not None:
        bind(dsn, role, tenant)
    return role
