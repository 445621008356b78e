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


def test_reports_and_heartbeats_update_by_primary_key(conn: psycopg.Connection[Any],
                                                      explained: list[str]) -> None:
    # Statistics that say "almost nothing is running": many finished actions, analysed.
    conn.execute("""
        SELECT replaysafe.claim_actions('t1', array_agg('done' || i), array_agg('op'::text),
                                        array_agg('{}'::jsonb), 'w')
        FROM generate_series(1, 300) i""")
    conn.execute("SELECT replaysafe.complete_action('t1', 'done' || i, 1, '{}') "
                 "FROM generate_series(1, 300) i")
    conn.execute("ANALYZE replaysafe.actions")
    conn.execute("SELECT replaysafe.claim_actions('t1', array_agg('live' || i), array_agg('op'::text), "
                 "array_agg('{}'::jsonb), 'w') FROM generate_series(1, 50) i")

    conn.execute("SET auto_explain.log_min_duration = 0; "
                 "SET auto_explain.log_nested_statements = on; SET client_min_messages = log")
    conn.execute("SELECT replaysafe.heartbeat_action('t1', 'live1', 1)")
    conn.execute("SELECT replaysafe.complete_action('t1', 'live2', 1, '{}')")
    conn.execute("SELECT replaysafe.fail_action('t1', 'live3', 1, '{}')")
    conn.execute("SET client_min_messages = notice")

    updates = plans_of(explained, r"Query Text:\s*(?:-- .*\n\s*)*UPDATE replaysafe\.actions x")
    assert len(updates) == 3, explained
    for plan in updates:
        assert "actions_pkey" in plan, plan
        assert "actions_running_lease_idx" not in plan, plan
