"""docs/isolation.md: code a worker owns (an index expression on a table of its own) that runs in
someone else's session — a superuser's ANALYZE or REINDEX, autovacuum, another tenant's
operator's database-wide ANALYZE: a security-restricted operation — acts as that worker at
most: never for the session's tenant, never for every tenant of a group role. The probe the
functions use to notice such an operation: test_restricted_operation_probe.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as, owner_rows, require_maintain_privilege
from helpers.seeded_tenants import TOKENS, b_rows

import replaysafe_pg

MakeRole = Callable[..., str]


SRO_BAIT = """
CREATE TABLE public.loot (what text, got text);
GRANT INSERT ON public.loot TO PUBLIC;
CREATE FUNCTION public.steal() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.loot SELECT 'read', pg_catalog.string_agg(DISTINCT tenant_id, ',')
                            FROM replaysafe.actions_v;
    BEGIN
        INSERT INTO public.loot SELECT 'complete', replaysafe.complete_action(
            p_tenant_id => 'B', p_action_key => 'live', p_attempt => 1,
            p_attempt_token => 'B_LIVE_TOKEN', p_result => '{"forged": 1}');
    EXCEPTION WHEN OTHERS THEN
        INSERT INTO public.loot VALUES ('complete', 'refused ' || SQLSTATE);
    END;
    RETURN 1;
END $f$;
CREATE FUNCTION public.idx_f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
    $f$ BEGIN IF $1 = 0 THEN PERFORM public.steal(); END IF; RETURN $1; END $f$;
CREATE TABLE public.bait (i int);
INSERT INTO public.bait VALUES (1), (0);
"""


def sro_bait() -> str:
    """SRO_BAIT holding B's real attempt token (as if the attacker had it): what refuses the
    forged report must be the tenant check, not the token."""
    return SRO_BAIT.replace("B_LIVE_TOKEN", TOKENS["B", "live"])


def test_a_workers_index_expression_run_by_a_superuser_acts_as_the_worker(
        seeded_world: str, make_role: MakeRole) -> None:
    """Autovacuum (or a superuser's ANALYZE / REINDEX) runs a table owner's index expression
    in the superuser's session: the functions must not act with that session's rights."""
    attacker = make_role("replaysafe_worker")
    bind(seeded_world, attacker, "A")
    with psycopg.connect(seeded_world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    try:
        with connect_as(seeded_world, attacker) as c:
            c.execute(sro_bait())
            c.execute("CREATE INDEX bait_idx ON public.bait (public.idx_f(i))")  # its own run
        with psycopg.connect(seeded_world, autocommit=True) as owner:  # the superuser's maintenance
            owner.execute("DELETE FROM public.loot")
            owner.execute("ANALYZE public.bait")
            owner.execute("REINDEX TABLE public.bait")
            loot = owner.execute("SELECT what, got FROM public.loot ORDER BY 1, 2").fetchall()
        assert ("read", "A") in loot and ("complete", "refused RS004") in loot, loot
        assert {got for what, got in loot if what == "read"} == {"A"}
        assert {got for what, got in loot if what == "complete"} == {"refused RS004"}
        assert owner_rows(seeded_world, "SELECT state::text, result FROM replaysafe.actions "
                                        "WHERE tenant_id = 'B' AND action_key = 'live'"
                          ) == [("running", None)]
    finally:
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


def test_a_workers_index_expression_run_in_another_tenants_session_acts_for_nobody(
        seeded_world: str, make_role: MakeRole) -> None:
    """Tenant B's operator runs a database-wide ANALYZE; A's index expression runs in B's
    session (a security-restricted operation): it must not act for B."""
    require_maintain_privilege(seeded_world)
    attacker = make_role("replaysafe_worker")
    victim = make_role("replaysafe_operator")
    bind(seeded_world, attacker, "A")
    bind(seeded_world, victim, "B")
    with psycopg.connect(seeded_world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    try:
        with connect_as(seeded_world, attacker) as c:
            c.execute(sro_bait())
            c.execute("CREATE INDEX bait_idx ON public.bait (public.idx_f(i))")
            c.execute("GRANT MAINTAIN ON public.bait TO PUBLIC")
        with connect_as(seeded_world, victim) as c:
            c.execute("ANALYZE public.bait")
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            loot = owner.execute("SELECT what, got FROM public.loot").fetchall()
        assert ("complete", "refused RS004") in loot and ("complete", "recorded") not in loot, loot
        assert {got for what, got in loot if what == "read"} <= {"A"}
        assert owner_rows(seeded_world, "SELECT state::text, result FROM replaysafe.actions "
                                        "WHERE tenant_id = 'B' AND action_key = 'live'"
                          ) == [("running", None)]
    finally:
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')


VIEW_BAIT = """
CREATE TABLE {schema}.loot (reader text, tenant_id text, action_key text);
CREATE FUNCTION {schema}.grab() RETURNS void LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
    INSERT INTO {schema}.loot SELECT current_user, tenant_id, action_key FROM replaysafe.actions_v;
END $f$;
CREATE FUNCTION {schema}.f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
    $f$ BEGIN PERFORM {schema}.grab(); RETURN $1; END $f$;
CREATE TABLE {schema}.bait (i int);
INSERT INTO {schema}.bait VALUES (1);
"""


@pytest.mark.parametrize("group", ["replaysafe_worker", "replaysafe_auditor"])
def test_code_a_group_role_owns_reads_no_tenant_in_someone_elses_session(
        seeded_world: str, make_role: MakeRole, group: str) -> None:
    """A's login (a member of `group`) builds an index expression as the unbound group role;
    B's bound session (or a superuser's) runs it with ANALYZE: through the views it must see
    neither B's tenant (the session's) nor every tenant (the group's)."""
    require_maintain_privilege(seeded_world)
    attacker = make_role("replaysafe_worker", "replaysafe_auditor")
    victim = make_role("replaysafe_operator")
    bind(seeded_world, attacker, "A")
    bind(seeded_world, victim, "B")
    schema = f"s_{attacker}"
    with psycopg.connect(seeded_world, autocommit=True) as owner:
        owner.execute(f'CREATE SCHEMA "{schema}" AUTHORIZATION "{attacker}"')
    try:
        with connect_as(seeded_world, attacker) as c:
            c.execute(f'GRANT CREATE, USAGE ON SCHEMA "{schema}" TO {group}')
            c.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO PUBLIC')
            c.execute(f"SET ROLE {group}")  # from here on, objects belong to the group role
            c.execute(VIEW_BAIT.format(schema=f'"{schema}"'))
            c.execute(f'CREATE INDEX ON "{schema}".bait (("{schema}".f(i)))')
            c.execute(f'GRANT MAINTAIN ON "{schema}".bait TO PUBLIC')
            c.execute(f'GRANT INSERT ON "{schema}".loot TO PUBLIC')
            c.execute(f'TRUNCATE "{schema}".loot')
        with connect_as(seeded_world, victim) as c:
            c.execute(f'ANALYZE "{schema}".bait')
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            owner.execute(f'ANALYZE "{schema}".bait')
            loot = owner.execute(f'SELECT reader, tenant_id FROM "{schema}".loot').fetchall()
        assert loot == [], loot
    finally:
        with psycopg.connect(seeded_world, autocommit=True) as owner:
            owner.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')
            owner.execute(f"REVOKE ALL ON SCHEMA public FROM {group}")


Conn = psycopg.Connection[Any]


SWEEP_BAIT = """
CREATE TABLE public.loot (what text, got text);
GRANT INSERT ON public.loot TO PUBLIC;
CREATE FUNCTION public.steal() RETURNS int LANGUAGE plpgsql AS $f$
BEGIN
    BEGIN
        INSERT INTO public.loot SELECT 'sweep', replaysafe.sweep_expired_actions()::text;
    EXCEPTION WHEN OTHERS THEN
        INSERT INTO public.loot VALUES ('sweep', 'refused ' || SQLSTATE);
    END;
    BEGIN
        INSERT INTO public.loot SELECT 'purge',
            replaysafe.purge_actions(p_older_than => '1 day')::text;
    EXCEPTION WHEN OTHERS THEN
        INSERT INTO public.loot VALUES ('purge', 'refused ' || SQLSTATE);
    END;
    BEGIN
        INSERT INTO public.loot SELECT 'claim', outcome FROM replaysafe.claim_action(
            p_tenant_id => 'B', p_action_key => 'live', p_operation => 'refund',
            p_request => '{}', p_worker_id => 'w', p_claim_token => 'secret-claim-token-of-tenant-B');
    EXCEPTION WHEN OTHERS THEN
        INSERT INTO public.loot VALUES ('claim', 'refused ' || SQLSTATE);
    END;
    INSERT INTO public.loot SELECT 'revision', replaysafe.installed_revision();
    RETURN 1;
END $f$;
CREATE FUNCTION public.idx_f(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
    $f$ BEGIN IF $1 = 0 THEN PERFORM public.steal(); END IF; RETURN $1; END $f$;
CREATE TABLE public.bait (i int);
INSERT INTO public.bait VALUES (1), (0);
"""


def test_sweep_and_purge_in_another_tenants_maintenance_act_for_nobody(
        claimed_world: str, make_role: MakeRole) -> None:
    """Tenant B's operator runs ANALYZE on a table of A's operator (MAINTAIN granted to all):
    A's index expression runs in B's session. The batched sweep and purge of 0004 read the
    tenant from _caller_scope: there they act for nobody, and the token claim gets RS004."""
    require_maintain_privilege(claimed_world)
    attacker = make_role("replaysafe_operator", "replaysafe_worker")
    victim = make_role("replaysafe_operator")
    bind(claimed_world, attacker, "A")
    bind(claimed_world, victim, "B")
    before = b_rows(claimed_world)
    with psycopg.connect(claimed_world, autocommit=True) as owner:
        owner.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker}"')
    try:
        with connect_as(claimed_world, attacker) as c:
            c.execute(SWEEP_BAIT.encode())
            c.execute(b"CREATE INDEX bait_idx ON public.bait (public.idx_f(i))")
            c.execute(b"GRANT MAINTAIN ON public.bait TO PUBLIC")
            c.execute(b"DELETE FROM public.loot")
        with connect_as(claimed_world, victim) as c:
            c.execute(b"ANALYZE public.bait")
        loot = dict(owner_rows(claimed_world, "SELECT what, got FROM public.loot"))
        # Acting for nobody: the sweep finds nothing to do, the purge is no operator's here.
        assert loot["sweep"] == "0" and loot["purge"] in ("0", "refused RS004"), loot
        assert loot["revision"] == replaysafe_pg.schema.head_revision(), loot
        assert loot["claim"] == "refused RS004", loot
        assert b_rows(claimed_world) == before
    finally:
        with psycopg.connect(claimed_world, autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{attacker}" CASCADE')
