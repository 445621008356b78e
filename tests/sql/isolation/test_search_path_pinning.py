"""docs/isolation.md, the trust boundary: no function of the schema, the command line or the
driver resolves a name through the caller's search_path. An attacker holding a worker's
credentials plants overloads of every built-in the bodies call (in public, with CREATE on it)
and pg_temp domains shadowing the base types; nothing of it may ever run. Roles are real
LOGIN roles. The hostile search path itself: the ``hostile_search_path`` fixture
(tests/sql/conftest.py), shared with tests/sql/langgraph."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from helpers.db import bind, connect_as
from helpers.seeded_tenants import VIEWS

Conn = psycopg.Connection[Any]


ROOT = Path(__file__).resolve().parents[3]


MakeRole = Callable[..., str]


def exercise_every_function(c: Conn, tenant: str, *, operator: bool) -> int:
    """Call every public function down as many paths as possible (errors are expected);
    how many calls succeeded. The caller's own statements name only literals: what they
    would resolve through its hostile search_path is the caller's own business.

    A claim's entry is a tuple naming the keys its answer is for (in order): the attempt
    token of each claimed one is kept under that name, and <name> in a later call stands
    for it (for a token no attempt has when nothing was claimed under the name)."""
    t = f"p_tenant_id => '{tenant}'"
    calls: list[str | tuple[str, ...]] = [
        (f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h1', p_operation => 'op', "
         "p_request => '{}', p_worker_id => 'w', p_lease => '1 second')", "h1"),
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h1', p_operation => 'op', "
        "p_request => '{}', p_worker_id => 'w')",  # running: registers a waiter
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h1', p_operation => 'op2', "
        "p_request => '{}', p_worker_id => 'w')",  # RS001
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => '', p_operation => 'op', "
        "p_request => '[]', p_worker_id => 'w', p_lease => '8 days')",  # RS005
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h9', p_operation => 'op', "
        "p_request => '{}', p_worker_id => 'w', p_now => 'infinity')",  # RS005
        (f"SELECT * FROM replaysafe.claim_actions({t}, p_action_keys => '{{h2,h3}}', "
         "p_operations => '{op,op}', p_requests => '{\"{}\",\"{}\"}', p_worker_id => 'w', "
         "p_on_expired => 'reclaim', p_lease => '1 second')", "h2", "h3"),
        f"SELECT * FROM replaysafe.claim_actions({t}, p_action_keys => '{{h2,h2}}', "
        "p_operations => '{op,op}', p_requests => '{\"{}\",\"{}\"}', p_worker_id => 'w')",
        # A claim token: the attempt token is derived from it, and a retry answers it again.
        (f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h4', p_operation => 'op', "
         "p_request => '{}', p_worker_id => 'w', p_claim_token => 'a-claim-token-of-22-chars-or-more')",
         "h4"),
        (f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h4', p_operation => 'op', "
         "p_request => '{}', p_worker_id => 'w', p_claim_token => 'a-claim-token-of-22-chars-or-more')",
         "h4"),
        f"SELECT replaysafe.complete_action({t}, p_action_key => 'h4', p_attempt => 1, "
        "p_attempt_token => '<h4>', p_result => '{}')",
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => '<h1>')",
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h1', p_attempt => 7, "
        "p_attempt_token => '<h1>')",  # RS002
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => '<none>')",  # RS004
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => NULL)",  # RS005
        f"SELECT replaysafe.complete_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => '<h1>', p_result => '{\"r\": 1}', p_provider_reference => 'ref')",
        f"SELECT replaysafe.complete_action({t}, p_action_key => 'h1', p_attempt => 1, "
        "p_attempt_token => '<h1>', p_result => '{}')",  # superseded
        f"SELECT replaysafe.fail_action({t}, p_action_key => 'h2', p_attempt => 1, "
        "p_attempt_token => '<h2>', p_error => '{}', p_retryable => true)",
        (f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h2', p_operation => 'op', "
         "p_request => '{}', p_worker_id => 'w', p_on_expired => 'reclaim')", "h2b"),  # attempt 2
        f"SELECT replaysafe.complete_action({t}, p_action_key => 'h2', p_attempt => 1, "
        "p_attempt_token => '<h2>', p_result => '{}')",  # superseded: attempt 1 reported
        f"SELECT replaysafe.heartbeat_action({t}, p_action_key => 'h2', p_attempt => 2, "
        "p_attempt_token => '<h2b>')",
        f"SELECT replaysafe.mark_action_unknown({t}, p_action_key => 'h3', p_attempt => 1, "
        "p_attempt_token => '<h3>', p_error => '{}')",
        f"SELECT replaysafe.fail_action({t}, p_action_key => 'h3', p_attempt => 1, "
        "p_attempt_token => '<h3>', p_error => '{}')",  # late
        f"SELECT replaysafe.fail_action({t}, p_action_key => 'nope', p_attempt => 1, "
        "p_attempt_token => '<nope>', p_error => '{}')",  # RS006
        f"SELECT replaysafe.write_thread({t}, p_thread_id => 'ht', p_expected_version => 0, "
        "p_state => '{}', p_history_limit => 1)",
        f"SELECT replaysafe.write_thread({t}, p_thread_id => 'ht', p_expected_version => 1, "
        "p_state => '{\"a\": 1}')",
        f"SELECT replaysafe.write_thread({t}, p_thread_id => 'ht', p_expected_version => 1, "
        "p_state => '{}')",  # RS003
        f"SELECT replaysafe.write_thread({t}, p_thread_id => 'mine', p_expected_version => 1, "
        "p_state => '{}')",  # RS004
        f"SELECT * FROM replaysafe.read_thread({t}, p_thread_id => 'ht')",
        f"SELECT * FROM replaysafe.read_thread({t}, p_thread_id => 'absent')",
        f"SELECT * FROM replaysafe.thread_history({t}, p_thread_id => 'ht')",
        f"SELECT replaysafe.delete_thread({t}, p_thread_id => 'ht')",
        f"SELECT * FROM replaysafe.read_thread({t}, p_thread_id => 'ht')",
        f"SELECT * FROM replaysafe.read_thread({t}, p_thread_id => '')",  # RS005
        "SELECT pg_catalog.pg_sleep(1.1)",
        "SELECT replaysafe.sweep_expired_actions()",
        f"SELECT * FROM replaysafe.claim_action({t}, p_action_key => 'h1', p_operation => 'op', "
        "p_request => '{}', p_worker_id => 'w')",
        "SELECT * FROM replaysafe.claim_action(p_tenant_id => 'someone-else', p_action_key => 'x', "
        "p_operation => 'op', p_request => '{}', p_worker_id => 'w')",  # RS004 (but the owner)
    ]
    if operator:
        calls += [
            f"SELECT replaysafe.resolve_action({t}, p_action_key => 'h3', p_state => 'succeeded', "
            "p_result => '{}', p_note => 'n', p_expected_attempt => 1)",
            f"SELECT replaysafe.resolve_action({t}, p_action_key => 'h3', p_state => 'failed')",
            f"SELECT replaysafe.reopen_action({t}, p_action_key => 'h3', p_note => 'fixed')",
            "SELECT replaysafe.purge_actions(p_older_than => '0 seconds')",
            f"SELECT replaysafe.sweep_expired_actions(p_now => '{datetime.now(UTC) + timedelta(days=1)}')",
        ]
    calls += [f"SELECT * FROM replaysafe.{v}" for v in VIEWS]
    tokens: dict[str, str] = {}
    succeeded = 0
    for entry in calls:
        query, *keys = (entry,) if isinstance(entry, str) else entry
        query = re.sub(r"<(\w+)>", lambda m: tokens.get(m.group(1), "rsat_no-attempt-has-this"), query)
        try:
            cur = c.execute(query.encode())
        except psycopg.Error:
            continue
        succeeded += 1
        for key, row in zip(keys, cur.fetchall() if keys else [], strict=True):
            if row[0] == "claimed":  # outcome, ..., attempt_token
                tokens[key] = row[-1]
    return succeeded


def test_hostile_overloads_in_public_and_pg_temp_never_run(
        seeded_world: str, make_role: MakeRole, hostile_search_path: Any) -> None:
    """Hostile overloads in public and pg temp never run."""
    with psycopg.connect(seeded_world, autocommit=True) as owner:
        names = hostile_search_path.called_names(owner)
        assert {"length", "format", "jsonb_build_object", "pg_notify", "count"} <= names
        attacker = make_role("replaysafe_worker")
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')  # the pre-15 default
    bind(seeded_world, attacker, "A")
    operator = make_role("replaysafe_operator")
    bind(seeded_world, operator, "A")
    try:
        with connect_as(seeded_world, attacker) as c:
            planted = hostile_search_path.plant_overloads(c, names)
            assert planted > 100
            # The trap works: an unpinned function of the attacker's own falls into it.
            c.execute("CREATE FUNCTION public.control() RETURNS int LANGUAGE plpgsql AS "
                      "$f$ BEGIN RETURN length('x'::text); END $f$")
            c.execute("SET search_path = public, pg_catalog")
            c.execute("SELECT public.control()")
            assert c.execute("SELECT pg_catalog.count(*) FROM public.hijacked").fetchone() == (1,)
            c.execute("DELETE FROM public.hijacked")
        succeeded = []
        for role, is_operator in ((attacker, False), (operator, True)):
            with connect_as(seeded_world, role) as victim:
                hostile_search_path.plant_temp_domains(victim)
                victim.execute("SET search_path = public, pg_catalog")
                succeeded.append(exercise_every_function(victim, "A", operator=is_operator))
        with psycopg.connect(seeded_world, autocommit=True) as owner:  # the schema owner, a superuser
            hostile_search_path.plant_temp_domains(owner)
            owner.execute("SET search_path = public, pg_catalog")
            succeeded.append(exercise_every_function(owner, "B", operator=True))
            assert owner.execute("SELECT DISTINCT name FROM public.hijacked").fetchall() == []
            # Enough ran for the test to mean something (the operator may only settle).
            assert succeeded[0] >= 20 and succeeded[1] >= 8 and succeeded[2] >= 25, succeeded
    finally:
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            owner.execute("DROP TABLE IF EXISTS public.hijacked CASCADE")
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


def test_every_function_is_definer_or_private_and_pins_its_search_path(dsn: str) -> None:
    """Every function is definer or private and pins its search path."""
    with psycopg.connect(dsn) as c:
        rows = c.execute("""
            SELECT p.proname, p.prosecdef, p.proconfig
            FROM pg_proc p WHERE p.pronamespace = 'replaysafe'::regnamespace""").fetchall()
    assert rows
    for name, secdef, config in rows:
        assert config == ["search_path=pg_catalog, pg_temp"], name
        assert secdef == (not name.startswith("_") and name != "idempotency_key"), name


def test_the_cli_and_the_driver_never_resolve_through_a_hostile_search_path(
        seeded_world: str, make_role: MakeRole, hostile_search_path: Any) -> None:
    """The cli and the driver never resolve through a hostile search path."""
    from helpers.cli import run

    from replaysafe_pg import Ledger, Threads

    attacker = make_role("replaysafe_worker")
    with psycopg.connect(seeded_world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
        owner.execute(f'GRANT USAGE ON TYPE replaysafe.action_state TO "{attacker}"')
    text = "\n".join((ROOT / "sql" / f).read_text() for f in ("cli.sql", "queries.sql"))
    names = {m.group(1).lower() for m in re.finditer(r"([a-z_][a-z0-9_]*)\s*\(", text, re.IGNORECASE)}
    try:
        assert {"cardinality", "unnest", "count", "now"} <= names
        with connect_as(seeded_world, attacker) as c:
            hostile_search_path.plant_overloads(c, names)
            c.execute("CREATE FUNCTION public.state_eq(a replaysafe.action_state, "
                      "b replaysafe.action_state) RETURNS boolean LANGUAGE plpgsql AS $f$ BEGIN "
                      "INSERT INTO public.hijacked VALUES ('enum =', current_user); RETURN true; "
                      "END $f$")
            c.execute("CREATE OPERATOR public.= (LEFTARG = replaysafe.action_state, "
                      "RIGHTARG = replaysafe.action_state, FUNCTION = public.state_eq)")
        # The owner's own session would fall into the trap (its search_path puts public first).
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            owner.execute("SELECT count(*) FROM pg_catalog.unnest(ARRAY['a']) WHERE "
                          "public.cardinality(ARRAY['x']) IS NULL")
            assert owner.execute("SELECT pg_catalog.count(*) FROM public.hijacked").fetchone() == (1,)
            owner.execute("DELETE FROM public.hijacked")
        for args in (("doctor",), ("actions", "list", "--state", "running"), ("audit",),
                     ("actions", "show", "done", "--tenant", "A"),
                     ("threads", "show", "mine", "--tenant", "A", "--user", "alice"),
                     ("purge", "--older-than", "1000d"), ("sweep",)):
            run(*args, dsn=seeded_world)
        with Ledger(seeded_world, tenant_id="A") as led, \
                Threads(seeded_world, tenant_id="A", user_id="alice") as th:
            claim = led.claim("k", "op", {})
            led.heartbeat(claim)
            led.complete(claim, {})
            assert led.get("done") is not None and led.attempts("done")
            th.read("mine")
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            assert owner.execute("SELECT name FROM public.hijacked").fetchall() == []
    finally:
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            owner.execute("DROP TABLE IF EXISTS public.hijacked CASCADE")
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')
