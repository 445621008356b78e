"""A COLLATE clause on any argument is refused before anything is read: PL/pgSQL gives every
collatable argument the collation of the call, and it wins over the columns' in every
comparison inside the function. A worker's own nondeterministic collation (a case-insensitive
ICU one created in pg_temp) made its tenant id equal another's: it completed another
tenant's attempt with a forged result and read its threads (found by an attacker's review).
Postgres builds without ICU cannot create such a collation, so this tests the guard with the
built-in collations; tests/sql/test_review_0004_0005.py runs the real attack on a server with
ICU (REPLAYSAFE_ICU_TEST_DSN)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from helpers.db import bind, connect_as

# The world holds no action: any well-formed token will do (no attempt has it).
TOKEN = "'rsat_0123456789abcdef0123456789abcdef'"

CALLS = {
    "claim_action": "SELECT replaysafe.claim_action(p_tenant_id => %(t)s, p_action_key => 'k', "
                    "p_operation => 'pay', p_request => '{}', p_worker_id => 'w')",
    "claim_action (key)": "SELECT replaysafe.claim_action(p_tenant_id => 'A', p_action_key => %(t)s, "
                          "p_operation => 'pay', p_request => '{}', p_worker_id => 'w')",
    "claim_actions": "SELECT replaysafe.claim_actions(p_tenant_id => %(t)s, p_action_keys => '{k}', "
                     "p_operations => '{pay}', p_requests => ARRAY['{}'::jsonb], p_worker_id => 'w')",
    "heartbeat_action": "SELECT replaysafe.heartbeat_action(p_tenant_id => %(t)s, p_action_key => 'k', "
                        f"p_attempt => 1, p_attempt_token => {TOKEN})",
    "complete_action": "SELECT replaysafe.complete_action(p_tenant_id => %(t)s, p_action_key => 'k', "
                       f"p_attempt => 1, p_attempt_token => {TOKEN}, p_result => '{{}}')",
    "fail_action": "SELECT replaysafe.fail_action(p_tenant_id => %(t)s, p_action_key => 'k', "
                   f"p_attempt => 1, p_attempt_token => {TOKEN}, p_error => '{{}}')",
    "mark_action_unknown": "SELECT replaysafe.mark_action_unknown(p_tenant_id => %(t)s, "
                           f"p_action_key => 'k', p_attempt => 1, p_attempt_token => {TOKEN}, "
                           "p_error => '{}')",
    "read_thread": "SELECT * FROM replaysafe.read_thread(p_tenant_id => %(t)s, p_thread_id => 't')",
    "write_thread": "SELECT replaysafe.write_thread(p_tenant_id => %(t)s, p_thread_id => 't', "
                    "p_expected_version => 0, p_state => '{}')",
    "thread_history": "SELECT * FROM replaysafe.thread_history(p_tenant_id => %(t)s, p_thread_id => 't')",
    "delete_thread": "SELECT replaysafe.delete_thread(p_tenant_id => %(t)s, p_thread_id => 't')",
}


@pytest.fixture
def world(dsn: str) -> str:
    return dsn


@pytest.mark.parametrize("collation", ['"C"', '"POSIX"'])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_collate_clause_on_any_argument_is_refused(
        world: str, make_role: Callable[..., str], call: str, collation: str) -> None:
    role = make_role("replaysafe_worker")
    bind(world, role, "A")
    sql = CALLS[call].replace("%(t)s", f"'A' COLLATE {collation}")
    with connect_as(world, role) as worker:
        with pytest.raises(psycopg.Error) as caught:
            worker.execute(sql)
        assert caught.value.sqlstate == "RS005", (call, caught.value)
        assert "COLLATE" in str(caught.value)
        worker.rollback()
    with psycopg.connect(world) as owner:
        assert owner.execute("SELECT (SELECT count(*) FROM replaysafe.actions) "
                             "+ (SELECT count(*) FROM replaysafe.threads)").fetchone() == (0,)
    with connect_as(world, role) as worker:  # without the clause, no RS005
        try:
            worker.execute(CALLS[call].replace("%(t)s", "'A'"))
        except psycopg.Error as e:
            assert e.sqlstate != "RS005", e


def test_operator_duties_refuse_a_collate_clause(world: str, make_role: Callable[..., str]) -> None:
    role = make_role("replaysafe_operator")
    bind(world, role, "A")
    with connect_as(world, role) as operator:
        for sql in ("SELECT replaysafe.resolve_action(p_tenant_id => 'A' COLLATE \"C\", "
                    "p_action_key => 'k', p_state => 'failed')",
                    "SELECT replaysafe.reopen_action(p_tenant_id => 'A', p_action_key => 'k' COLLATE \"C\", "
                    "p_note => 'n')"):
            with pytest.raises(psycopg.Error) as caught:
                operator.execute(sql)
            assert caught.value.sqlstate == "RS005", caught.value
            operator.rollback()
