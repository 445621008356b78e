"""replaysafe.metrics() (docs/operability.md): the rows a scraper reads, scoped like the views,
exact where the docs say so, and read from the non-terminal rows only."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers.db import bind, bind_to_all_tenants, connect_as, sqlstate
from helpers.grants import issue

Conn = psycopg.Connection[Any]
MakeRole = Callable[..., str]
Rows = dict[tuple[str, str | None, str | None], float]

METRICS = "SELECT name, tenant_id, state, value FROM replaysafe.metrics(p_by_tenant => %s)"


def metrics(c: Conn, by_tenant: bool = True) -> Rows:
    rows = c.execute(METRICS, (by_tenant,)).fetchall()
    out: Rows = {}
    for name, tenant, state, value in rows:
        assert (name, tenant, state) not in out, (name, tenant, state)
        out[name, tenant, state] = value
    return out


def add_unresolved_to_b(dsn: str) -> None:
    """Tenant B also has an unknown action and a retryable one (A has neither)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for key, call in (("lost", "mark_action_unknown(p_tenant_id => 'B', p_action_key => 'lost', "
                                   "p_attempt => 1, p_attempt_token => %s, p_error => '{}')"),
                          ("flaky", "fail_action(p_tenant_id => 'B', p_action_key => 'flaky', "
                                    "p_attempt => 1, p_attempt_token => %s, p_error => '{}', "
                                    "p_retryable => true)")):
            row = c.execute("SELECT attempt_token FROM replaysafe.claim_action(p_tenant_id => 'B', "
                            "p_action_key => %s, p_operation => 'refund', p_request => '{}', "
                            "p_worker_id => 'w')", (key,)).fetchone()
            assert row is not None
            c.execute(f"SELECT replaysafe.{call}", (row[0],))


def test_a_bound_worker_reads_its_own_tenants_metrics(claimed_world: str,
                                                      make_role: MakeRole) -> None:
    """Each tenant of the seed has a live lease, an expired one (30 days), three succeeded
    actions, one of them with two successful attempts, and a thread; B also an unknown and
    a retryable action, which A's worker never counts."""
    add_unresolved_to_b(claimed_world)
    worker = make_role("replaysafe_worker")
    bind(claimed_world, worker, "A")
    with connect_as(claimed_world, worker) as c:
        got = metrics(c)
    assert {tenant for _, tenant, _ in got} == {"A"}
    assert got["replaysafe_actions", "A", "running"] == 2
    assert got["replaysafe_actions", "A", "unknown"] == 0
    assert got["replaysafe_actions", "A", "retryable"] == 0
    assert got["replaysafe_expired_leases", "A", None] == 1
    assert got["replaysafe_unresolved_actions", "A", None] == 1
    assert got["replaysafe_multi_effect_actions", "A", None] == 1
    age = got["replaysafe_oldest_unresolved_age_seconds", "A", None]
    assert timedelta(days=29, hours=23) < timedelta(seconds=age) < timedelta(days=30, hours=1)
    # No estimate for one tenant: it would be computed from every tenant's statistics.
    assert {state for name, _, state in got if name == "replaysafe_actions"} \
        == {"running", "unknown", "retryable"}
    assert not [name for name, _, _ in got if name == "replaysafe_threads"]


def test_an_all_tenant_auditor_reads_each_tenant_and_the_totals(claimed_world: str,
                                                                make_role: MakeRole) -> None:
    add_unresolved_to_b(claimed_world)
    auditor = make_role("replaysafe_auditor")
    bind_to_all_tenants(claimed_world, auditor)
    with connect_as(claimed_world, auditor) as c:
        per = metrics(c)
        totals = metrics(c, by_tenant=False)
    for tenant in ("A", "B"):
        assert per["replaysafe_actions", tenant, "running"] == 2
        assert per["replaysafe_multi_effect_actions", tenant, None] == 1
    assert per["replaysafe_actions", "B", "unknown"] == 1
    assert per["replaysafe_actions", "B", "retryable"] == 1
    assert per["replaysafe_unresolved_actions", "B", None] == 2
    assert ("replaysafe_actions", "A", "unknown") in per  # a tenant's zero is a row too
    assert {t for _, t, _ in totals} == {None}
    assert totals["replaysafe_actions", None, "running"] == 4
    assert totals["replaysafe_actions", None, "unknown"] == 1
    assert totals["replaysafe_expired_leases", None, None] == 2
    assert totals["replaysafe_unresolved_actions", None, None] == 3
    assert totals["replaysafe_multi_effect_actions", None, None] == 2


def test_the_estimates_are_an_all_tenant_callers_totals(claimed_world: str,
                                                        make_role: MakeRole) -> None:
    """Succeeded and failed actions and live threads: planner estimates, without a tenant,
    once the tables have statistics (none before the first ANALYZE)."""
    auditor = make_role("replaysafe_auditor")
    bind_to_all_tenants(claimed_world, auditor)
    with connect_as(claimed_world, auditor) as c:
        before = metrics(c)
    assert ("replaysafe_actions", None, "succeeded") not in before
    with psycopg.connect(claimed_world, autocommit=True) as owner:
        owner.execute("ANALYZE replaysafe.actions")
        owner.execute("ANALYZE replaysafe.threads")
    with connect_as(claimed_world, auditor) as c:
        after = metrics(c)
    assert after["replaysafe_actions", None, "succeeded"] >= 1
    assert ("replaysafe_actions", None, "failed") in after
    assert after["replaysafe_threads", None, None] >= 1


def test_a_worker_under_a_grant_reads_the_grants_tenant(claimed_world: str,
                                                        make_role: MakeRole) -> None:
    pooled = make_role("replaysafe_worker")
    with psycopg.connect(claimed_world, autocommit=True) as owner:
        grant = issue(owner, "B")
    with connect_as(claimed_world, pooled) as c:
        rows = c.execute("SELECT DISTINCT tenant_id FROM replaysafe.metrics(p_grant => %s)",
                         (grant,)).fetchall()
        assert rows == [("B",)]
        assert c.execute("SELECT count(*) FROM replaysafe.metrics()").fetchone() == (0,)


@pytest.mark.parametrize("group", ["replaysafe_worker", "replaysafe_auditor", "replaysafe_operator"])
def test_a_role_that_acts_for_no_tenant_reads_no_row(claimed_world: str, make_role: MakeRole,
                                                     group: str) -> None:
    with connect_as(claimed_world, make_role(group)) as c:
        assert c.execute("SELECT count(*) FROM replaysafe.metrics()").fetchone() == (0,)


def test_only_the_group_roles_may_call_it(claimed_world: str, make_role: MakeRole) -> None:
    with connect_as(claimed_world, make_role()) as c:
        assert sqlstate(c, "SELECT * FROM replaysafe.metrics()") == "42501"


def test_bad_arguments_are_refused(claimed_world: str, make_role: MakeRole) -> None:
    worker = make_role("replaysafe_worker")
    bind(claimed_world, worker, "A")
    with connect_as(claimed_world, worker) as c:
        assert sqlstate(c, "SELECT * FROM replaysafe.metrics(p_by_tenant => NULL)") == "RS005"
        # A worker cannot move the clock to age what it sees.
        assert sqlstate(c, "SELECT * FROM replaysafe.metrics(p_now => now() + interval '1 day')") \
            == "RS005"


def test_an_empty_installation_answers_zeros(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        got = metrics(c)
    assert got and all(value == 0 for value in got.values())
    assert ("replaysafe_actions", None, "succeeded") in got  # an empty table: 0, no guess
    assert {t for _, t, _ in got} == {None}


def _plans(notices: list[str]) -> list[dict[str, Any]]:
    """The plans auto_explain sent as notices (JSON), of the statements metrics() ran."""
    out = []
    for text in notices:
        start = text.find("{")
        if start >= 0:
            out.append(json.loads(text[start:]))
    return out


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


@pytest.mark.parametrize("all_tenants", [False, True], ids=["one tenant", "every tenant"])
def test_the_exact_counts_read_only_the_non_terminal_rows(dsn: str, all_tenants: bool) -> None:
    """200,000 succeeded actions and 300 in each non-terminal state, over 20 tenants: every
    statement metrics() runs reads actions and attempts through an index (the partial ones of
    the states it counts), never a sequential scan, and no node reads more rows than the
    non-terminal ones."""
    now = datetime.now(UTC)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("""
            INSERT INTO replaysafe.actions (tenant_id, action_key, operation, request, state,
                attempt, on_expired, idempotency_key, worker_id, lease_expires_at, result,
                created_at, updated_at, completed_at)
            SELECT 't' || mod(i, 20), 'k' || i, 'op', '{}', s.state, 1, 'unknown', 'rs2_' || i, 'w',
                   %(now)s::timestamptz + CASE WHEN mod(i, 2) = 0 THEN interval '1 hour'
                                              ELSE interval '-1 hour' END,
                   '{}', %(now)s, %(now)s, %(now)s
            FROM generate_series(1, 201200) i
            CROSS JOIN LATERAL (SELECT (CASE WHEN i <= 200000 THEN 'succeeded'
                                             WHEN i <= 200300 THEN 'running'
                                             WHEN i <= 200600 THEN 'unknown'
                                             WHEN i <= 200900 THEN 'retryable'
                                             ELSE 'failed' END)::replaysafe.action_state AS state) s
            """, {"now": now})
        # 40 actions with two successful attempts (the first superseded) among 20,000 that
        # succeeded on their second attempt.
        c.execute("INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, "
                  "claimed_at, ended_at, outcome, superseded) SELECT 't' || mod(i, 20), 'k' || i, a, "
                  "'w', %(now)s, %(now)s, CASE WHEN i <= 40 OR a = 2 THEN 'succeeded' ELSE 'unknown' "
                  "END::replaysafe.action_state, i <= 40 AND a = 1 "
                  "FROM generate_series(1, 20000) i, generate_series(1, 2) a", {"now": now})
        c.execute("ANALYZE replaysafe.actions")
        c.execute("ANALYZE replaysafe.action_attempts")
        role = "postgres"
        if not all_tenants:
            c.execute("CREATE ROLE rs_metrics_probe")
            c.execute("GRANT replaysafe_auditor TO rs_metrics_probe")
            c.execute("SELECT replaysafe.bind_role_to_tenant(p_role => 'rs_metrics_probe', "
                      "p_tenant_id => 't3')")
            role = "rs_metrics_probe"
        try:
            notices: list[str] = []
            c.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            c.execute("LOAD 'auto_explain'")
            for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_analyze = on",
                            "auto_explain.log_nested_statements = on",
                            "auto_explain.log_format = json", "auto_explain.log_level = notice"):
                c.execute(f"SET {setting}")
            c.execute(f"SET ROLE {role}")
            got = metrics(c)
            c.execute("RESET ROLE")
            c.execute("SET auto_explain.log_min_duration = -1")
        finally:
            if not all_tenants:
                c.execute("SELECT replaysafe.unbind_role(p_role => 'rs_metrics_probe')")
                c.execute("DROP ROLE rs_metrics_probe")
    tenant = None if all_tenants else "t3"
    expected_running = 300 if all_tenants else 15
    running = sum(v for (n, t, s), v in got.items() if n == "replaysafe_actions" and s == "running")
    assert running == expected_running and (all_tenants or tenant in {t for _, t, _ in got})
    nodes = [n for plan in _plans(notices) for n in _nodes(plan["Plan"])]
    # Executed nodes only: the estimates' EXPLAIN plans are logged too, but never run.
    scans = [n for n in nodes if n.get("Relation Name") in ("actions", "action_attempts")
             and n.get("Actual Loops", 0) > 0]
    assert scans, notices[:3]
    assert not [(n.get("Relation Name"), n.get("Filter"), n.get("Actual Rows"))
                for n in scans if n["Node Type"] == "Seq Scan"]
    partial = {n["Index Name"] for n in nodes if n.get("Index Name", "").startswith("action")
               and n.get("Actual Loops", 0) > 0}
    assert partial <= {"actions_tenant_running_lease_idx", "actions_running_lease_idx",
                       "actions_unknown_idx", "actions_retryable_idx",
                       "action_attempts_superseded_success_idx", "action_attempts_pkey"}, partial
    assert max(n.get("Actual Rows", 0) for n in scans) <= 300, scans
    assert sum(v for (n, t, s), v in got.items() if n == "replaysafe_multi_effect_actions") \
        == (40 if all_tenants else 2)
    assert re.search(r"actions_retryable_idx", json.dumps(nodes))
