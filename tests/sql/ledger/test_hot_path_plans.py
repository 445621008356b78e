"""The hot-path statements find their row by primary key, whatever the statistics say.

With few running rows in the statistics, a predicate `state = 'running'` lets the planner
walk the partial index of running leases instead (every in-flight action and every dead
entry since the last vacuum): completions then slow down as in-flight actions grow.
auto_explain shows the plans of the statements inside the functions.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest


@pytest.fixture
def explained(conn: psycopg.Connection[Any]) -> list[str]:
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("auto_explain needs a superuser")
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    return plans


def plans_of(plans: list[str], statement: str) -> list[str]:
    return [p for p in plans if re.search(statement, p)]


def claim_all(conn: psycopg.Connection[Any], prefix: str, n: int) -> dict[str, str]:
    """Claim prefix1 .. prefix<n> in one call: each key's attempt token."""
    keys = [f"{prefix}{i}" for i in range(1, n + 1)]
    rows = conn.execute("SELECT attempt_token FROM replaysafe.claim_actions('t1', %s::text[], "
                        "array_fill('op'::text, ARRAY[%s]), array_fill('{}'::jsonb, ARRAY[%s]), "
                        "'w')", (keys, n, n)).fetchall()
    return {k: r[0] for k, r in zip(keys, rows, strict=True)}


def test_reports_and_heartbeats_update_by_primary_key(conn: psycopg.Connection[Any],
                                                      explained: list[str]) -> None:
    # Statistics that say "almost nothing is running": many finished actions, analysed.
    done = claim_all(conn, "done", 300)
    conn.execute("SELECT replaysafe.complete_action('t1', k, 1, t, '{}') "
                 "FROM unnest(%s::text[], %s::text[]) u(k, t)", (list(done), list(done.values())))
    conn.execute("ANALYZE replaysafe.actions")
    live = claim_all(conn, "live", 50)

    conn.execute("SET auto_explain.log_min_duration = 0; "
                 "SET auto_explain.log_nested_statements = on; SET client_min_messages = log")
    conn.execute("SELECT replaysafe.heartbeat_action('t1', 'live1', 1, %s)", (live["live1"],))
    conn.execute("SELECT replaysafe.complete_action('t1', 'live2', 1, %s, '{}')", (live["live2"],))
    conn.execute("SELECT replaysafe.fail_action('t1', 'live3', 1, %s, '{}')", (live["live3"],))
    conn.execute("SET client_min_messages = notice")

    updates = plans_of(explained, r"Query Text:\s*(?:-- .*\n\s*)*UPDATE replaysafe\.actions x")
    assert len(updates) == 3, explained
    for plan in updates:
        assert "actions_pkey" in plan, plan
        assert "actions_running_lease_idx" not in plan, plan
