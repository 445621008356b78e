"""Every replaysafe function is single-key (STYLE 8): each statement touches one
tenant's rows, and of those one key, so that a function distributed by p_tenant_id (Citus)
runs whole on the worker holding its tenant. The rule and the checker:
tests/helpers/single_key.py; docs/isolation.md says how to read a failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import pytest
from helpers.single_key import Finding, check_schema, load_schema, verdict

from replaysafe_pg.schema import schema_sql

# Tenant tables (every table with a tenant_id column) and the column that names one key.
KEY_COLUMNS = {
    "actions": "action_key",
    "action_attempts": "action_key",
    "threads": "thread_id",
    "thread_versions": "thread_id",
    "langgraph_checkpoints": "thread_id",
    "langgraph_blobs": "thread_id",
    "langgraph_writes": "thread_id",
    "langgraph_namespaces": "thread_id",
    "langgraph_thread_users": "thread_id",
    "langgraph_threads": "thread_id",
}

# Tables with a tenant_id column that hold no tenant's data, and why.
NOT_TENANT_TABLES = {
    "role_bindings": "maps a role to its tenant, read by role (the caller's own binding, in "
                     "every call) and written by the schema owner only: distributed, it is a "
                     "reference table on every worker, not a tenant's rows",
    "grant_generations": "a tenant's tenant-grant revocation counter, read by the tenant a "
                         "grant names (after its signature is verified) in every call with a "
                         "grant: distributed, a reference table on every worker",
}

# Functions multi-key by nature. "tenant-only": every statement stays in p_tenant_id's rows,
# across keys; "exempt": not even that. An entry for a function that no longer exists, or
# that passes a stricter rule than its entry says, fails the test: the list stays honest.
# (Reconciliation's work list is no function: it reads replaysafe.actions_v, a view, for
# one tenant; views are not checked.)
ALLOWED: dict[str, tuple[Literal["tenant-only", "exempt"], str]] = {
    "claim_actions": ("tenant-only", "the parallel tool calls of one model turn: one "
                                     "claim_action per key, in one round trip"),
    "langgraph_list": ("tenant-only", "LangGraph's list(): with no thread given, every "
                                      "checkpoint of the tenant"),
    "langgraph_delete_for_runs": ("tenant-only", "LangGraph's delete_for_runs(): a run's "
                                                 "checkpoints, on whichever threads it wrote"),
    "langgraph_copy_thread": ("tenant-only", "LangGraph's copy_thread(): reads one thread, "
                                             "writes another"),
    "langgraph_prune": ("tenant-only", "LangGraph's prune(): takes a list of threads"),
    "sweep_expired_actions": ("exempt", "maintenance: a batch of expired leases across keys, "
                                        "of p_tenant_id (or a grant's tenant) when given, else "
                                        "of the caller's tenant by its binding, of every "
                                        "tenant, round-robin, for the unbound owner and "
                                        "all-tenant roles"),
    "purge_actions": ("exempt", "maintenance: a batch of old terminal actions across keys, of "
                                "p_tenant_id (or a grant's tenant) when given, else of the "
                                "caller's tenant by its binding, of every tenant for the "
                                "unbound owner"),
    "_due_actions": ("exempt", "maintenance: the actions an all-tenant sweep or purge takes "
                               "in one call, shared round-robin among the tenants"),
    "metrics": ("exempt", "monitoring: counts of the caller's tenant, or of every tenant for "
                          "the unbound owner and all-tenant roles"),
    "_estimate": ("exempt", "monitoring: a planner estimate (EXPLAIN) of metrics()' own "
                            "queries, nothing read"),
    "purge_threads": ("exempt", "maintenance: a batch of old threads across keys, of "
                                "p_tenant_id (or a grant's tenant) when given, else of the "
                                "caller's tenant by its binding, of every tenant for the "
                                "unbound owner and all-tenant roles"),
}


def check(sql: str) -> dict[str, list[Finding]]:
    return check_schema(sql, key_columns=KEY_COLUMNS, not_tenant_tables=set(NOT_TENANT_TABLES))


def allow_list_problems(findings: Mapping[str, list[Finding]],
                        allowed: Mapping[str, tuple[str, str]]) -> list[str]:
    """What is wrong, one text per function: a violation, or an allow-list entry that lies."""
    problems = []
    for name, found in sorted(findings.items()):
        got = verdict(found)
        rule = allowed[name][0] if name in allowed else None
        details = "".join(f"\n  {f}" for f in found)
        if rule is None and got != "single-key":
            problems.append(f"replaysafe.{name} is {got}, not single-key:{details}")
        elif rule == "tenant-only" and got == "multi-tenant":
            problems.append(f"replaysafe.{name} (allowed tenant-only) reaches other tenants:"
                            f"{details}")
        elif rule is not None and got == "single-key":
            problems.append(f"replaysafe.{name} is single-key now: remove it from the allow-list")
        elif rule == "exempt" and got == "tenant-only":
            problems.append(f"replaysafe.{name} stays in one tenant now: allow it as "
                            "tenant-only, not exempt")
    for name in sorted(set(allowed) - set(findings)):
        problems.append(f"replaysafe.{name} is on the allow-list but no longer exists")
    return problems


@pytest.fixture(scope="module")
def schema_findings() -> dict[str, list[Finding]]:
    return check(schema_sql())


def test_every_function_is_single_key_or_allowed(schema_findings: dict[str, list[Finding]]) -> None:
    problems = allow_list_problems(schema_findings, ALLOWED)
    assert not problems, "\n".join(problems)


def test_the_check_sees_every_function_and_the_tenant_tables() -> None:
    schema = load_schema(schema_sql(), key_columns=KEY_COLUMNS,
                         not_tenant_tables=set(NOT_TENANT_TABLES))
    assert {"claim_action", "_report", "write_thread", "langgraph_put"} <= set(schema.functions)
    assert len(schema.functions) >= 40
    assert all(reason for _, reason in ALLOWED.values())


def test_a_new_table_with_tenant_id_must_be_classified() -> None:
    sql = schema_sql() + "\nCREATE TABLE replaysafe.notes (tenant_id text, note_id text);\n"
    with pytest.raises(ValueError, match=r"replaysafe\.notes has a tenant_id column"):
        check(sql)


def test_the_allow_list_stays_honest(schema_findings: dict[str, list[Finding]]) -> None:
    stale = {**ALLOWED, "write_thread": ("tenant-only", "no reason"),
             "langgraph_list": ("exempt", "no reason"), "gone_function": ("exempt", "no reason")}
    problems = "\n".join(allow_list_problems(schema_findings, stale))
    assert "replaysafe.write_thread is single-key now" in problems
    assert "replaysafe.langgraph_list stays in one tenant now" in problems
    assert "replaysafe.gone_function is on the allow-list but no longer exists" in problems


# -- the check on functions written to fail it (and two that pass) -----------------------------

EXAMPLES = """
CREATE FUNCTION replaysafe.ok_single_key(p_tenant_id text, p_action_key text, p_now timestamptz)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_tenant text := p_tenant_id;  -- an alias of the parameter counts as the tenant
    a        replaysafe.actions;
    v_n      integer;
BEGIN
    SELECT * INTO a FROM replaysafe.actions x
    WHERE x.tenant_id = v_tenant AND x.action_key = p_action_key FOR UPDATE;
    SELECT count(*) INTO v_n
    FROM replaysafe.actions x
    JOIN replaysafe.action_attempts t ON t.tenant_id = x.tenant_id AND t.action_key = x.action_key
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at)
    SELECT x.tenant_id, x.action_key, x.attempt + 1, 'w', p_now FROM replaysafe.actions x
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
    PERFORM replaysafe._expire_attempt(a, p_now);  -- a row read under the rule
    PERFORM replaysafe._keep_first_attempt(p_tenant_id, p_action_key);
    RETURN v_n;
END
$$;

CREATE FUNCTION replaysafe.ok_sql(p_tenant_id text, p_thread_id text)
RETURNS bigint LANGUAGE sql AS $$
    SELECT max(v.version) FROM replaysafe.thread_versions v
    WHERE v.tenant_id = p_tenant_id AND v.thread_id = p_thread_id
$$;

CREATE FUNCTION replaysafe.bad_update_by_tenant(p_tenant_id text, p_action_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE replaysafe.actions SET has_waiters = false WHERE tenant_id = p_tenant_id;
END
$$;

CREATE FUNCTION replaysafe.bad_read_all(p_tenant_id text)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT count(*) FROM replaysafe.actions x WHERE x.state = 'unknown');
END
$$;

CREATE FUNCTION replaysafe.bad_insert_select(p_tenant_id text, p_action_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replaysafe.action_attempts (tenant_id, action_key, attempt, worker_id, claimed_at)
    SELECT x.tenant_id, x.action_key, x.attempt, x.worker_id, x.created_at
    FROM replaysafe.actions x WHERE x.action_key = p_action_key;
END
$$;

CREATE FUNCTION replaysafe.bad_join(p_tenant_id text, p_action_key text)
RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM replaysafe.actions x
    JOIN replaysafe.action_attempts t ON t.action_key = x.action_key
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key
$$;

CREATE FUNCTION replaysafe.bad_or(p_tenant_id text, p_thread_id text)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT t.version FROM replaysafe.threads t
    WHERE t.tenant_id = p_tenant_id AND (p_thread_id IS NULL OR t.thread_id = p_thread_id);
END
$$;

CREATE FUNCTION replaysafe.bad_tenant_from_a_table(p_action_key text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_tenant text;
BEGIN
    SELECT c.tenant_id INTO v_tenant FROM replaysafe._caller c;
    DELETE FROM replaysafe.actions x WHERE x.tenant_id = v_tenant AND x.action_key = p_action_key;
END
$$;

CREATE FUNCTION replaysafe.bad_dynamic(p_tenant_id text, p_action_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DELETE FROM replaysafe.actions WHERE tenant_id = %L', p_tenant_id);
END
$$;

CREATE FUNCTION replaysafe.bad_constant_execute(p_tenant_id text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE 'TRUNCATE replaysafe.thread_versions';
END
$$;

CREATE FUNCTION replaysafe.bad_helper_call(p_tenant_id text, p_action_key text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM replaysafe._keep_first_attempt(p_tenant_id, p_action_key || '-other');
END
$$;

CREATE FUNCTION replaysafe.bad_row_argument(p_tenant_id text, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    a replaysafe.actions;
BEGIN
    SELECT * INTO a FROM replaysafe.actions x WHERE x.tenant_id = p_tenant_id LIMIT 1;
    PERFORM replaysafe._expire_attempt(a, p_now);
END
$$;

CREATE FUNCTION replaysafe.bad_audit_view(p_tenant_id text, p_action_key text)
RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM replaysafe.actions_v v
    WHERE v.tenant_id = p_tenant_id AND v.action_key = p_action_key
$$;

CREATE FUNCTION replaysafe.bad_moves_a_row(p_tenant_id text, p_action_key text, p_to text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE replaysafe.actions x SET tenant_id = p_to
    WHERE x.tenant_id = p_tenant_id AND x.action_key = p_action_key;
END
$$;

CREATE FUNCTION replaysafe.bad_caller_of_bad(p_tenant_id text, p_action_key text)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN replaysafe.bad_read_all(p_tenant_id);
END
$$;
"""


@pytest.fixture(scope="module")
def example_findings() -> dict[str, list[Finding]]:
    return check(schema_sql() + EXAMPLES)


@pytest.mark.parametrize("name", ["ok_single_key", "ok_sql"])
def test_a_single_key_function_passes(example_findings: dict[str, list[Finding]],
                                      name: str) -> None:
    assert example_findings[name] == []


@pytest.mark.parametrize(("name", "expected", "problem", "statement"), [
    ("bad_update_by_tenant", "tenant-only",
     "updates replaysafe.actions without action_key = p_action_key",
     "UPDATE replaysafe.actions SET has_waiters = false WHERE tenant_id = p_tenant_id"),
    ("bad_read_all", "multi-tenant",
     "reads replaysafe.actions (as x) without tenant_id = p_tenant_id",
     "RETURN (SELECT count(*) FROM replaysafe.actions x WHERE x.state = 'unknown')"),
    ("bad_insert_select", "multi-tenant",
     "inserts into replaysafe.action_attempts a tenant_id that is not p_tenant_id",
     "INSERT INTO replaysafe.action_attempts"),
    ("bad_join", "multi-tenant",
     "reads replaysafe.action_attempts (as t) without tenant_id = p_tenant_id",
     "JOIN replaysafe.action_attempts t ON t.action_key = x.action_key"),
    ("bad_or", "tenant-only",
     "reads replaysafe.threads (as t) without thread_id = p_thread_id",
     "(p_thread_id IS NULL OR t.thread_id = p_thread_id)"),
    ("bad_tenant_from_a_table", "multi-tenant",
     "deletes from replaysafe.actions (as x) without tenant_id = p_tenant_id",
     "WHERE x.tenant_id = v_tenant"),
    ("bad_dynamic", "multi-tenant",
     "dynamic SQL (EXECUTE of a computed string) cannot be checked statically",
     "EXECUTE format('DELETE FROM replaysafe.actions WHERE tenant_id = %L', p_tenant_id)"),
    ("bad_constant_execute", "multi-tenant",
     "TruncateStmt on replaysafe.thread_versions", "EXECUTE 'TRUNCATE replaysafe.thread_versions'"),
    ("bad_helper_call", "tenant-only",
     "calls replaysafe._keep_first_attempt passing p_action_key || '-other' as p_action_key: "
     "not the key", "replaysafe._keep_first_attempt(p_tenant_id, p_action_key || '-other')"),
    ("bad_row_argument", "tenant-only",
     "calls replaysafe._expire_attempt passing a as a: not the key",
     "SELECT replaysafe._expire_attempt(a, p_now)"),
    ("bad_audit_view", "multi-tenant",  # a UNION ALL: no filter reaches inside
     "through view replaysafe.actions_v: through view replaysafe._visible_actions: reads "
     "replaysafe.actions (as x) without tenant_id = p_tenant_id", "FROM replaysafe.actions_v v"),
    ("bad_moves_a_row", "multi-tenant",
     "sets tenant_id of replaysafe.actions to a value that is not p_tenant_id",
     "SET tenant_id = p_to"),
    ("bad_caller_of_bad", "multi-tenant",
     "calls replaysafe.bad_read_all, which is multi-tenant",
     "RETURN replaysafe.bad_read_all(p_tenant_id)"),
])
def test_a_multi_key_function_is_reported(example_findings: dict[str, list[Finding]], name: str,
                                          expected: str, problem: str, statement: str) -> None:
    found = example_findings[name]
    assert verdict(found) == expected
    report = "\n".join(str(f) for f in found)
    assert f"replaysafe.{name} (schema line " in report
    assert problem in report
    assert statement in report


def test_the_ci_check_fails_on_a_multi_key_function(
        example_findings: dict[str, list[Finding]]) -> None:
    """What test_every_function_is_single_key_or_allowed says when such a function lands."""
    problems = "\n".join(allow_list_problems(example_findings, ALLOWED))
    assert "replaysafe.bad_update_by_tenant is tenant-only, not single-key:" in problems
    assert "replaysafe.bad_read_all is multi-tenant, not single-key:" in problems
    assert "ok_single_key" not in problems
    for name in ALLOWED:  # the schema's own functions are as the allow-list says
        assert f"replaysafe.{name} " not in problems
