"""docs/isolation.md: what a worker of tenant A can learn of tenant B without reading its rows:
through a leaky function of its own in a WHERE clause on the views, through EXPLAIN (ANALYZE)
row counts and planner estimates, through the payloads of the wake-up notifications, through
installed_revision. Roles are real LOGIN roles."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as, owner_rows, plan_counts, sqlstate

Conn = psycopg.Connection[Any]


MakeRole = Callable[..., str]


def test_views_defeat_a_leaky_function_in_the_callers_where_clause(seeded_world: str,
                                                                   worker_a: Conn) -> None:
    """Views defeat a leaky function in the callers where clause."""
    worker_a.execute("CREATE FUNCTION pg_temp.leak(t text) RETURNS boolean LANGUAGE plpgsql "
                     "COST 0.0000001 AS $f$ BEGIN RAISE NOTICE 'saw %', t; RETURN true; END $f$")
    seen: list[str] = []
    worker_a.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
    worker_a.execute("SELECT * FROM replaysafe.actions_v WHERE pg_temp.leak(tenant_id)")
    assert seen and all(s == "saw A" for s in seen)


def unsalted_key(tenant: str, key: str) -> str:
    """The 0002 derivation, computable by anyone."""
    return "rs1_" + hashlib.sha256(f"{len(tenant)}:{tenant}{key}".encode()).hexdigest()


def test_a_guessed_pair_cannot_be_confirmed_from_keys_or_payloads(seeded_world: str,
                                                                  make_role: MakeRole) -> None:
    # Any connected role can LISTEN; the payload must not be computable from a guess.
    """A guessed pair cannot be confirmed from keys or payloads."""
    stranger = make_role()
    with connect_as(seeded_world, stranger) as listener:
        listener.execute("LISTEN replaysafe_actions")
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            claimed = owner.execute("SELECT idempotency_key, attempt_token FROM replaysafe.claim_action("
                                    "p_tenant_id => 'A', p_action_key => 'guess', p_operation => 'op', "
                                    "p_request => '{}', p_worker_id => 'w')").fetchone()
            assert claimed is not None
            first = (claimed[0],)
            owner.execute("SELECT replaysafe.claim_action(p_tenant_id => 'A', p_action_key => 'guess', "
                          "p_operation => 'op', p_request => '{}', p_worker_id => 'w2')")  # waits
            owner.execute("SELECT replaysafe.complete_action(p_tenant_id => 'A', "
                          "p_action_key => 'guess', p_attempt => 1, p_attempt_token => %s, "
                          "p_result => '{}')", (claimed[1],))
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == [first[0]]
    assert payloads[0] != unsalted_key("A", "guess")
    assert first[0].startswith("rs2_") and len(first[0]) == 68
    with psycopg.connect(seeded_world) as owner:  # the owner's function derives the same key
        assert owner.execute("SELECT replaysafe.idempotency_key('A', 'guess')").fetchone() == first


def test_explain_analyze_cannot_confirm_another_tenants_key(seeded_world: str, worker_a: Conn) -> None:
    """Explain analyze cannot confirm another tenants key."""
    for view, column, key in (("actions_v", "action_key", "done"),
                              ("action_attempts_v", "action_key", "done"),
                              ("threads_v", "thread_id", "mine")):
        there = plan_counts(worker_a, f"SELECT * FROM replaysafe.{view} "
                                      f"WHERE tenant_id = 'B' AND {column} = '{key}'")
        absent = plan_counts(worker_a, f"SELECT * FROM replaysafe.{view} "
                                       f"WHERE tenant_id = 'B' AND {column} = 'no-such-{key}'")
        ranged = plan_counts(worker_a, f"SELECT * FROM replaysafe.{view} "
                                       f"WHERE {column} >= 'a' AND {column} < 'z'")
        assert there == absent, (view, there, absent)
        # A range over every tenant finds only A's rows, and reads no other.
        assert ranged and all(n == 0 for k, n in ranged if "Rows Removed" in k), (view, ranged)


def estimate(c: Conn, query: str) -> int:
    """The planner's row estimate of the top node (plain EXPLAIN: nothing is executed)."""
    row = c.execute(f"EXPLAIN (FORMAT JSON) {query}".encode()).fetchone()
    assert row is not None
    doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return int(doc[0]["Plan"]["Plan Rows"])


@pytest.mark.xfail(strict=True, reason="honest limit (docs/isolation.md): leakproof text "
                   "operators let EXPLAIN estimates use every tenant's statistics")
def test_explain_estimates_cannot_confirm_another_tenant(dsn: str,
                                                                claimed_worker_a: Conn) -> None:
    """Plain EXPLAIN uses the table's statistics (MCVs, histograms of every tenant: the text
    operators are leakproof, so the planner may use them through the security-barrier views).
    A worker of A learns that tenant 'globex' exists and how big it is, and which operation
    names it uses, without reading a row.

    Planner estimates
    show other tenants' ids and values (not fixed yet: a strict xfail)."""
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("""
            DO $$ BEGIN
              FOR i IN 1..300 LOOP
                PERFORM replaysafe.claim_action('globex', 'k' || i, 'wire_transfer_to_cayman',
                                                '{}', 'w');
              END LOOP;
              PERFORM replaysafe.claim_action('A', 'a1', 'refund', '{}', 'w');
            END $$""")
        owner.execute("ANALYZE replaysafe.actions")
    there = estimate(claimed_worker_a, "SELECT * FROM replaysafe.actions_v WHERE tenant_id = 'globex'")
    absent = estimate(claimed_worker_a, "SELECT * FROM replaysafe.actions_v WHERE tenant_id = 'initech'")
    op_there = estimate(claimed_worker_a, "SELECT * FROM replaysafe.actions_v "
                                  "WHERE operation = 'wire_transfer_to_cayman'")
    op_absent = estimate(claimed_worker_a, "SELECT * FROM replaysafe.actions_v "
                                   "WHERE operation = 'no_such_operation'")
    assert (there, op_there) == (absent, op_absent), (there, absent, op_there, op_absent)


def test_explain_analyze_on_the_rewritten_views_confirms_no_other_tenants_key(
        claimed_world: str, claimed_worker_a: Conn) -> None:
    """Multi_effect_actions (0004: attempts first, then a lateral lookup of the raw actions
    table) and unresolved_actions (0004's (tenant_id, updated_at) index): B's keys cannot be
    told from absent ones by the rows EXPLAIN ANALYZE counts."""
    with psycopg.connect(claimed_world, autocommit=True) as owner:
        owner.execute("SELECT replaysafe.sweep_expired_actions()")
        owner.execute("ANALYZE")
    for view, key in (("multi_effect_actions", "multi"), ("unresolved_actions", "expired")):
        there = plan_counts(claimed_worker_a, f"SELECT * FROM replaysafe.{view} "
                                      f"WHERE tenant_id = 'B' AND action_key = '{key}'")
        absent = plan_counts(claimed_worker_a, f"SELECT * FROM replaysafe.{view} "
                                       f"WHERE tenant_id = 'B' AND action_key = 'no-{key}'")
        assert there == absent, (view, there, absent)
        seen = claimed_worker_a.execute(f"SELECT DISTINCT tenant_id FROM replaysafe.{view}".encode()
                                ).fetchall()
        assert seen == [("A",)], (view, seen)


def test_installed_revision_answers_the_revision_only(claimed_world: str, claimed_worker_a: Conn,
                                                      make_role: MakeRole) -> None:
    """Installed revision answers the revision only."""
    nobody = make_role()  # no group role: PUBLIC holds nothing
    with connect_as(claimed_world, nobody) as c:
        assert sqlstate(c, "SELECT replaysafe.installed_revision()") == "42501"
    # A temp table of the version table's name, and hostile functions in pg_temp, change
    # nothing: the body names replaysafe.alembic_version and pins its path.
    claimed_worker_a.execute(b"CREATE TEMP TABLE alembic_version (version_num text)")
    claimed_worker_a.execute(b"INSERT INTO pg_temp.alembic_version VALUES ('9999')")
    claimed_worker_a.execute(b"CREATE FUNCTION pg_temp.string_agg(text, text) RETURNS text "
                     b"LANGUAGE sql AS $$ SELECT '9999' $$")
    claimed_worker_a.execute(b"SET search_path = pg_temp, public")
    head = owner_rows(claimed_world, "SELECT version_num FROM replaysafe.alembic_version")
    assert claimed_worker_a.execute(b"SELECT replaysafe.installed_revision()").fetchone() == head[0]
    assert sqlstate(claimed_worker_a, "SELECT * FROM replaysafe.alembic_version") == "42501"
    claimed_worker_a.rollback()
    claimed_worker_a.execute(b"DISCARD TEMP")  # before the role is dropped (its backend may linger)
    claimed_worker_a.commit()


def test_a_leaky_function_sees_no_other_tenants_row_of_the_rewritten_views(
        claimed_world: str, claimed_worker_a: Conn) -> None:
    """A function of the worker's own (in pg_temp: no CREATE needed), as cheap as can be, in
    the WHERE clause of 0004's multi_effect_actions (whose lateral lookup reads the raw
    actions table) and unresolved_actions: it sees A's rows only."""
    with psycopg.connect(claimed_world, autocommit=True) as owner:
        owner.execute("SELECT replaysafe.sweep_expired_actions()")
    seen: list[str] = []
    claimed_worker_a.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
    claimed_worker_a.execute(b"CREATE FUNCTION pg_temp.leak(t text, k text, o text) RETURNS boolean "
                     b"LANGUAGE plpgsql COST 0.0000001 AS $$ BEGIN RAISE NOTICE '%|%|%', t, k, o; "
                     b"RETURN true; END $$")
    for view in ("multi_effect_actions", "unresolved_actions", "actions_v"):
        claimed_worker_a.execute(f"SELECT count(*) FROM replaysafe.{view} "
                         "WHERE pg_temp.leak(tenant_id, action_key, operation)".encode())
    claimed_worker_a.execute(b"SELECT count(*) FROM replaysafe.multi_effect_actions m WHERE EXISTS ("
                     b"SELECT 1 FROM replaysafe.multi_effect_actions x "
                     b"WHERE pg_temp.leak(x.tenant_id, x.action_key, m.operation))")
    assert seen and {s.split("|")[0] for s in seen} == {"A"}, seen
    assert "A|multi|refund" in seen and "A|expired|refund" in seen, seen


@pytest.fixture
def claimed_worker_a(claimed_world: str, make_role: Callable[..., str]) -> Iterator[Conn]:
    """A LOGIN role in replaysafe_worker bound to tenant A, over ``claimed_world``."""
    role = make_role("replaysafe_worker")
    bind(claimed_world, role, "A")
    with connect_as(claimed_world, role) as c:
        yield c
