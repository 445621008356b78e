"""Tenant isolation of the LangGraph checkpointer tables and functions (docs/isolation.md,
docs/langgraph.md), tried as an attacker holding a worker's credentials (a LOGIN role in
replaysafe_worker bound to tenant A, what a prompt-injected agent holds), an auditor's, or an
operator's bound to A: no role reaches tenant B's checkpoints, by B's tenant id or by B's ids
under A's; only the worker group may call the functions and nobody reads the tables; hostile
overloads, index expressions and the fast path's head never act for another tenant."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

pytest.importorskip("langgraph")
from helpers.db import connect_as, sqlstate
from helpers.langgraph_fast_path import (
    PUT_FAST,
    UPDATE,
    assert_head_is_stored,
    fast_params,
    loop_children,
    state,
)
from helpers.langgraph_rows import PUT, PUT_WRITES, counts, login, put_params
from langgraph.checkpoint.base import empty_checkpoint

MakeRole = Callable[..., str]


LANGGRAPH_FUNCTIONS = ("langgraph_put", "langgraph_put_writes", "langgraph_get_tuple",
                       "langgraph_list", "langgraph_delete_thread", "langgraph_delete_for_runs",
                       "langgraph_copy_thread", "langgraph_prune")


def b_calls() -> list[tuple[str, dict[str, Any] | None]]:
    """Every langgraph function, aimed at tenant B's rows."""
    return [
        (PUT, put_params(tenant="B", thread="t", md=json.dumps({"source": "fork", "step": 9}))),
        (PUT_WRITES, {"tenant": "B", "thread": "t", "ns": "", "id": "x", "task": "x",
                      "path": "", "idx": [0], "channels": ["who"], "types": ["null"],
                      "blobs": [b""], "replace": True}),
        ("SELECT * FROM replaysafe.langgraph_get_tuple(p_tenant_id => 'B', p_thread_id => 't')",
         None),
        ("SELECT * FROM replaysafe.langgraph_list(p_tenant_id => 'B')", None),
        ("SELECT * FROM replaysafe.langgraph_list(p_tenant_id => 'B', p_thread_id => 'secret', "
         "p_filter => '{\"source\": \"input\"}', p_limit => NULL)", None),
        ("SELECT replaysafe.langgraph_delete_thread(p_tenant_id => 'B', p_thread_id => 't')",
         None),
        ("SELECT replaysafe.langgraph_delete_for_runs(p_tenant_id => 'B', "
         "p_run_ids => ARRAY['run-B'])", None),
        ("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => 'B', "
         "p_source_thread_id => 'secret', p_target_thread_id => 'stolen')", None),
        ("SELECT replaysafe.langgraph_prune(p_tenant_id => 'B', p_thread_ids => ARRAY['t'], "
         "p_strategy => 'delete')", None),
        ("SELECT replaysafe.langgraph_prune(p_tenant_id => 'B', "
         "p_thread_ids => ARRAY['t', 'secret'])", None),
    ]


@pytest.mark.parametrize("who", ["worker_a", "worker_a_set_role_group", "operator_a",
                                 "auditor_a", "auditor_unbound", "worker_unbound"])
def test_no_role_reaches_another_tenants_checkpoints(checkpointed_world: str, make_role: MakeRole,
                                                     who: str) -> None:
    """An attack on the LangGraph checkpointer that failed , kept as a regression
    test."""
    group = {"operator_a": "replaysafe_operator", "auditor_a": "replaysafe_auditor",
             "auditor_unbound": "replaysafe_auditor"}.get(who, "replaysafe_worker")
    tenant = None if who.endswith("unbound") else "A"
    before = counts(checkpointed_world, "B")
    with connect_as(checkpointed_world, login(checkpointed_world, make_role, tenant, group)) as c:
        if who == "worker_a_set_role_group":
            c.execute("SET ROLE replaysafe_worker")
        states = [sqlstate(c, q, p) for q, p in b_calls()]
    assert set(states) <= {"RS004", "42501"}, states
    assert counts(checkpointed_world, "B") == before


def test_tenant_a_cannot_name_tenant_bs_rows_from_its_own_tenant(
        checkpointed_world: str, make_role: MakeRole) -> None:
    """B's checkpoint ids and thread names, used under tenant A, reach only A's rows.

    An attack on the LangGraph checkpointer that failed , kept as
    a regression test."""
    with psycopg.connect(checkpointed_world) as owner:
        b_head = owner.execute("SELECT checkpoint_id FROM replaysafe.langgraph_checkpoints "
                               "WHERE tenant_id = 'B' AND thread_id = 'secret'").fetchone()
    assert b_head is not None
    before = counts(checkpointed_world, "B")
    with connect_as(checkpointed_world, login(checkpointed_world, make_role, "A")) as w:
        assert w.execute("SELECT * FROM replaysafe.langgraph_get_tuple(p_tenant_id => 'A', "
                         "p_thread_id => 'secret', p_checkpoint_id => %s)", b_head).fetchall() == []
        assert w.execute("SELECT replaysafe.langgraph_copy_thread(p_tenant_id => 'A', "
                         "p_source_thread_id => 'secret', p_target_thread_id => 'stolen')"
                         ).fetchone() == (0,)
        assert w.execute("SELECT replaysafe.langgraph_delete_for_runs(p_tenant_id => 'A', "
                         "p_run_ids => ARRAY['run-B'])").fetchone() == (0,)
        assert w.execute("SELECT replaysafe.langgraph_prune(p_tenant_id => 'A', "
                         "p_thread_ids => ARRAY['secret'], p_strategy => 'delete')"
                         ).fetchone() == (0,)
        rows = w.execute("SELECT thread_id FROM replaysafe.langgraph_list(p_tenant_id => 'A', "
                         "p_filter => '{}', p_limit => NULL)").fetchall()
    assert rows == [("t",)]
    assert counts(checkpointed_world, "B") == before


def test_langgraph_functions_build_no_sql_and_pin_their_search_path(dsn: str) -> None:
    """An attack on the LangGraph checkpointer that failed , kept as a regression
    test."""
    with psycopg.connect(dsn) as c:
        rows = c.execute("SELECT proname, prosrc, prosecdef, proconfig FROM pg_proc "
                         "WHERE pronamespace = 'replaysafe'::regnamespace "
                         "AND proname LIKE '%%langgraph%%'").fetchall()
    assert {r[0] for r in rows} >= set(LANGGRAPH_FUNCTIONS)
    for name, src, secdef, config in rows:
        assert config == ["search_path=pg_catalog, pg_temp"], name
        assert secdef == (not name.startswith("_")), name
        assert "EXECUTE" not in src.upper().replace("EXECUTE ON", ""), name
        assert "format(" not in src, name


def test_only_the_worker_group_may_call_the_langgraph_functions_and_nobody_reads_the_tables(
        dsn: str) -> None:
    """An attack on the LangGraph checkpointer that failed , kept as a regression
    test."""
    with psycopg.connect(dsn) as c:
        grants = c.execute("""
            SELECT p.proname::text, coalesce(a.grantee::regrole::text, 'PUBLIC'), a.privilege_type
            FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
            WHERE p.pronamespace = 'replaysafe'::regnamespace AND p.proname LIKE '%%langgraph%%'
              AND a.grantee <> p.proowner""").fetchall()
        tables = c.execute("""
            SELECT c.relname::text, a.grantee::regrole::text, a.privilege_type
            FROM pg_class c, aclexplode(c.relacl) a
            WHERE c.relnamespace = 'replaysafe'::regnamespace AND c.relname LIKE 'langgraph%%'
              AND a.grantee <> c.relowner""").fetchall()
        rls = c.execute("SELECT relname::text FROM pg_class WHERE relnamespace = "
                        "'replaysafe'::regnamespace AND relname LIKE 'langgraph%%' "
                        "AND relkind = 'r' AND NOT relrowsecurity").fetchall()
    assert sorted(grants) == sorted((f, "replaysafe_worker", "EXECUTE")
                                    for f in LANGGRAPH_FUNCTIONS)
    assert tables == [] and rls == []


def test_default_privileges_open_no_langgraph_function_or_table(
        empty_dsn: str, make_role: MakeRole) -> None:
    """An attack on the LangGraph checkpointer that failed , kept as a regression
    test."""
    app = make_role()
    grants = ("EXECUTE ON FUNCTIONS", "ALL ON TABLES", "USAGE ON TYPES")
    with psycopg.connect(empty_dsn, autocommit=True) as owner:
        for grant in grants:
            owner.execute(f'ALTER DEFAULT PRIVILEGES GRANT {grant} TO "{app}"')
            owner.execute(f'ALTER DEFAULT PRIVILEGES GRANT {grant} TO replaysafe_worker')
    try:
        import replaysafe_pg

        replaysafe_pg.migrate(empty_dsn)
        with psycopg.connect(empty_dsn) as owner:
            fns = owner.execute(
                "SELECT p.proname::text FROM pg_proc p WHERE p.pronamespace = "
                "'replaysafe'::regnamespace AND p.proname LIKE '%%langgraph%%' "
                "AND has_function_privilege(%s, p.oid, 'EXECUTE')", (app,)).fetchall()
            tabs = owner.execute(
                "SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = "
                "'replaysafe'::regnamespace AND c.relname LIKE 'langgraph%%' AND c.relkind = 'r' "
                "AND (has_table_privilege(%s, c.oid, 'SELECT,INSERT,UPDATE,DELETE,TRUNCATE') "
                "OR has_table_privilege('replaysafe_worker', c.oid, "
                "'SELECT,INSERT,UPDATE,DELETE,TRUNCATE'))", (app,)).fetchall()
            private = owner.execute(
                "SELECT p.proname::text FROM pg_proc p WHERE p.pronamespace = "
                "'replaysafe'::regnamespace AND p.proname LIKE '\\_langgraph%%' "
                "AND has_function_privilege('replaysafe_worker', p.oid, 'EXECUTE')").fetchall()
        assert fns == [] and tabs == [] and private == []
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as owner:
            for grant in grants:
                owner.execute(f'ALTER DEFAULT PRIVILEGES REVOKE {grant} FROM "{app}"')
                owner.execute(f'ALTER DEFAULT PRIVILEGES REVOKE {grant} FROM replaysafe_worker')
            owner.execute(f'DROP OWNED BY "{app}"')


def own_calls(tenant: str) -> list[tuple[str, dict[str, Any] | None]]:
    """Every langgraph function down its main paths, on ``tenant``'s own rows."""
    t = f"p_tenant_id => '{tenant}'"
    first = empty_checkpoint()
    second = empty_checkpoint()
    cp = {k: v for k, v in first.items() if k != "channel_values"}
    cp["channel_versions"] = {"c": "1"}
    loop = json.dumps({"source": "loop", "step": 0, "run_id": "r1"})
    return [
        (PUT, put_params(tenant, "h", id=first["id"], cp=json.dumps(cp),
                         md=json.dumps({"source": "input", "step": -1, "run_id": "r1"}),
                         channels=["c"], versions=["1"], types=["null"], blobs=[b""])),
        (PUT, put_params(tenant, "h", id=second["id"], parent=first["id"], md=loop, limit=1)),
        (PUT, put_params(tenant, "h", id=empty_checkpoint()["id"], parent=first["id"],
                         md=loop)),  # refused
        (PUT_WRITES, {"tenant": tenant, "thread": "h", "ns": "", "id": second["id"],
                      "task": "x", "path": "", "idx": [0, -1], "channels": ["c", "__error__"],
                      "types": ["null", "null"], "blobs": [b"", b""], "replace": False}),
        (PUT_WRITES, {"tenant": tenant, "thread": "h", "ns": "", "id": second["id"],
                      "task": "x", "path": "", "idx": [-1], "channels": ["__error__"],
                      "types": ["null"], "blobs": [b""], "replace": True}),
        (f"SELECT * FROM replaysafe.langgraph_get_tuple({t}, p_thread_id => 'h')", None),
        (f"SELECT * FROM replaysafe.langgraph_get_tuple({t}, p_thread_id => 'h', "
         f"p_checkpoint_id => '{second['id']}')", None),
        (f"SELECT * FROM replaysafe.langgraph_list({t}, p_filter => '{{\"source\": \"loop\"}}', "
         f"p_before => '{'f' * 36}', p_limit => 5)", None),
        (f"SELECT replaysafe.langgraph_copy_thread({t}, p_source_thread_id => 'h', "
         "p_target_thread_id => 'h2')", None),
        (f"SELECT replaysafe.langgraph_prune({t}, p_thread_ids => ARRAY['h2'])", None),
        (f"SELECT replaysafe.langgraph_delete_for_runs({t}, p_run_ids => ARRAY['r1'])", None),
        (f"SELECT replaysafe.langgraph_prune({t}, p_thread_ids => ARRAY['h2'], "
         "p_strategy => 'delete')", None),
        (f"SELECT replaysafe.langgraph_delete_thread({t}, p_thread_id => 'h')", None),
    ]


def qualified(query: str) -> str:
    """The caller's own casts, qualified (a pg_temp domain shadows the caller's own types:
    its own business, not the functions')."""
    return (query.replace("::integer", "::pg_catalog.int4").replace("::text", "::pg_catalog.text")
            .replace("::jsonb", "::pg_catalog.jsonb").replace("::bytea", "::pg_catalog.bytea"))


def test_hostile_overloads_never_run_inside_the_langgraph_functions(
        checkpointed_world: str, make_role: MakeRole, hostile_search_path: Any) -> None:
    """An attack on the LangGraph checkpointer that failed , kept as a regression
    test."""
    with psycopg.connect(checkpointed_world, autocommit=True) as owner:
        names = hostile_search_path.called_names(owner)
        assert {"jsonb_each_text", "cardinality", "array_agg", "octet_length"} <= names
        attacker = login(checkpointed_world, make_role, "A")
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    try:
        with connect_as(checkpointed_world, attacker) as c:
            assert hostile_search_path.plant_overloads(c, names) > 100
            for op, typ in (("@>", "jsonb"), ("<", "text"), ("<=", "text"), (">", "text")):
                fn = f"hijack_{typ}_{len(op)}_{ord(op[0])}"
                c.execute(f"CREATE FUNCTION public.{fn}(a {typ}, b {typ}) RETURNS boolean "
                          "LANGUAGE plpgsql AS $f$ BEGIN INSERT INTO public.hijacked "
                          "VALUES ('operator', current_user); RETURN true; END $f$")
                c.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {typ}, RIGHTARG = {typ}, "
                          f"FUNCTION = public.{fn})")
            c.execute("CREATE FUNCTION public.hijack_get(a jsonb, b text) RETURNS text "
                      "LANGUAGE plpgsql AS $f$ BEGIN INSERT INTO public.hijacked "
                      "VALUES ('->>', current_user); RETURN 'loop'; END $f$")
            c.execute("CREATE OPERATOR public.->> (LEFTARG = jsonb, RIGHTARG = text, "
                      "FUNCTION = public.hijack_get)")
        ok = []
        for conn in (connect_as(checkpointed_world, attacker),
                     psycopg.connect(checkpointed_world, autocommit=True)):
            with conn as victim:
                hostile_search_path.plant_temp_domains(victim)
                victim.execute("SET search_path = public, pg_catalog")
                ok.append(sum(sqlstate(victim, qualified(q), p) is None
                              for q, p in own_calls("A")))
        with psycopg.connect(checkpointed_world, autocommit=True) as owner:
            assert owner.execute("SELECT DISTINCT name FROM public.hijacked").fetchall() == []
        assert ok == [len(own_calls("A"))] * 2, ok
    finally:
        with psycopg.connect(checkpointed_world, autocommit=True) as owner:
            owner.execute("DROP TABLE IF EXISTS public.hijacked CASCADE")
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


def test_doctor_notices_langgraph_privileges_and_rls_given_by_hand(dsn: str) -> None:
    """An attack on the LangGraph checkpointer that failed , kept as a regression
    test."""
    from helpers.cli import run

    assert run("doctor", dsn=dsn).exit_code == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("GRANT EXECUTE ON FUNCTION replaysafe.langgraph_list(text, text, text, "
                     "text, jsonb, text, integer, text) TO replaysafe_auditor")
        conn.execute("GRANT SELECT ON replaysafe.langgraph_blobs TO replaysafe_worker")
        conn.execute("ALTER TABLE replaysafe.langgraph_writes DISABLE ROW LEVEL SECURITY")
    result = run("doctor", dsn=dsn)
    assert result.exit_code == 1
    assert "replaysafe.langgraph_list(" in result.stdout and "to replaysafe_auditor" in result.stdout
    assert "SELECT on table langgraph_blobs to replaysafe_worker" in result.stdout
    assert "row-level security on langgraph_writes: DISABLED" in result.stdout


SRO_BAIT = """
CREATE TABLE public.loot (what text, got text);
GRANT INSERT ON public.loot TO PUBLIC;
CREATE FUNCTION public.steal() RETURNS int LANGUAGE plpgsql AS $f$
DECLARE n int;
BEGIN
    BEGIN
        SELECT count(*) INTO n FROM replaysafe.langgraph_list(p_tenant_id => 'B');
        INSERT INTO public.loot VALUES ('list', n::text);
    EXCEPTION WHEN others THEN INSERT INTO public.loot VALUES ('list', 'refused ' || SQLSTATE);
    END;
    BEGIN
        PERFORM replaysafe.langgraph_delete_thread(p_tenant_id => 'B', p_thread_id => 'secret');
        INSERT INTO public.loot VALUES ('delete', 'done');
    EXCEPTION WHEN others THEN INSERT INTO public.loot VALUES ('delete', 'refused ' || SQLSTATE);
    END;
    RETURN 1;
END $f$;
CREATE FUNCTION public.idx_f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
    $f$ BEGIN IF $1 = 0 THEN PERFORM public.steal(); END IF; RETURN $1; END $f$;
CREATE TABLE public.bait (i int);
INSERT INTO public.bait VALUES (1), (0);
"""


def test_a_workers_index_expression_in_tenant_bs_analyze_reaches_no_checkpoint(
        checkpointed_world: str, make_role: MakeRole) -> None:
    """An attack on the LangGraph checkpointer that failed , kept as a regression
    test."""
    attacker = login(checkpointed_world, make_role, "A")
    victim = login(checkpointed_world, make_role, "B")
    with psycopg.connect(checkpointed_world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    before = counts(checkpointed_world, "B")
    try:
        with connect_as(checkpointed_world, attacker) as c:
            c.execute(SRO_BAIT)
            c.execute("CREATE INDEX bait_idx ON public.bait (public.idx_f(i))")
            c.execute("DELETE FROM public.loot")
            c.execute("GRANT MAINTAIN ON public.bait TO PUBLIC")
        with connect_as(checkpointed_world, victim) as c:
            c.execute("ANALYZE public.bait")
        with psycopg.connect(checkpointed_world, autocommit=True) as owner:
            loot = set(owner.execute("SELECT what, got FROM public.loot").fetchall())
        assert loot == {("list", "refused RS004"), ("delete", "refused RS004")}, loot
        assert counts(checkpointed_world, "B") == before
    finally:
        with psycopg.connect(checkpointed_world, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


@pytest.mark.parametrize("tenant", ["B", "b", "B ", " B", "B\u200b"])
def test_the_fast_path_never_moves_another_tenants_head(fast_path_world: str, fast_path_worker: str,
                                                        tenant: str) -> None:
    """Tenant B's head is b1: a put naming it as parent would take the fast path (the
    UPDATE that moves the head) were the tenant check not before it.

    An attack on the fast path that failed , kept as a regression
    test."""
    before = state(fast_path_world, tenant="B")
    with connect_as(fast_path_world, fast_path_worker) as w:
        for p in (fast_params("evil", "b1", tenant=tenant),
                  fast_params("b0", "b1", tenant=tenant),  # the fallback path (stored id)
                  fast_params("evil", "b1", tenant=tenant, md=UPDATE, limit=1)):
            assert sqlstate(w, PUT_FAST, p) in ("RS004", "RS005")
            # A COLLATE clause on any argument, the tenant's included.
            q = PUT_FAST.replace("p_parent_id => %(parent)s::text",
                            "p_parent_id => %(parent)s::text COLLATE \"C\"")
            assert sqlstate(w, q, p) == "RS005"
        w.execute("SET ROLE replaysafe_worker")
        assert sqlstate(w, PUT_FAST, fast_params("evil", "b1", tenant="B")) == "RS004"
    assert state(fast_path_world, tenant="B") == before


def test_tenant_bs_head_named_as_parent_from_tenant_a_moves_nothing_of_b(fast_path_world: str,
                                                                        fast_path_worker: str) -> None:
    """Tenant A's own thread "t" (same name as B's) with B's head b1 as the parent: only
    A's namespace row may be the fast path's UPDATE target (and its head is p1, not b1).

    An attack on the fast path that failed , kept as a regression
    test."""
    before = state(fast_path_world, tenant="B")
    with connect_as(fast_path_world, fast_path_worker) as w:
        assert w.execute(PUT_FAST, fast_params("evil", "b1")).fetchone() == (False, "p1")
        assert w.execute(PUT_FAST, fast_params("b0", "b1")).fetchone() == (False, "p1")
        assert w.execute(PUT_FAST, fast_params("evil2", "b1", md=UPDATE)).fetchone() == (True, "evil2")
    assert state(fast_path_world, tenant="B") == before
    assert loop_children(fast_path_world, "b1", tenant="A") == []
    assert_head_is_stored(fast_path_world)
