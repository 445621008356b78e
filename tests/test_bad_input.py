"""Bad input to every ledger function (SPEC §2, §5): RS005 naming the argument, nothing written.

Each case starts from a call that would succeed and write (a new key to claim, a live attempt
to report on, an unknown action to resolve, an expired lease to sweep, an old action to
purge) and breaks exactly one argument, so a missing check shows up as a write.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _db_helpers import cloned_database, reset_ledger

from replaysafe_pg import InvalidArgument, Ledger

T0 = "2026-01-01 12:00:00+00"
LONG = "x" * 513
MAX = "y" * 512

# Named arguments of each function, as SQL expressions of a call that would succeed.
VALID: dict[str, dict[str, str]] = {
    "claim_action": {
        "p_tenant_id": "'t1'", "p_action_key": "'new'", "p_operation": "'refund'",
        "p_request": "'{\"order\": 1}'::jsonb", "p_worker_id": "'w'",
        "p_lease": "'30 seconds'::interval", "p_thread_id": "'th'::text",
        "p_on_expired": "'unknown'", "p_now": f"'{T0}'::timestamptz"},
    "claim_actions": {
        "p_tenant_id": "'t1'", "p_action_keys": "ARRAY['n1', 'n2']",
        "p_operations": "ARRAY['op', 'op']", "p_requests": "ARRAY['{}'::jsonb, '{}'::jsonb]",
        "p_worker_id": "'w'", "p_lease": "'30 seconds'::interval", "p_thread_id": "'th'::text",
        "p_on_expired": "'unknown'", "p_now": f"'{T0}'::timestamptz"},
    "heartbeat_action": {
        "p_tenant_id": "'t1'", "p_action_key": "'live'", "p_attempt": "1",
        "p_lease": "'60 seconds'::interval", "p_now": f"'{T0}'::timestamptz + interval '5 s'"},
    "complete_action": {
        "p_tenant_id": "'t1'", "p_action_key": "'live'", "p_attempt": "1",
        "p_result": "'{\"ok\": 1}'::jsonb", "p_provider_reference": "'re_1'::text",
        "p_now": f"'{T0}'::timestamptz + interval '5 s'"},
    "fail_action": {
        "p_tenant_id": "'t1'", "p_action_key": "'live'", "p_attempt": "1",
        "p_error": "'{\"e\": 1}'::jsonb", "p_retryable": "false",
        "p_now": f"'{T0}'::timestamptz + interval '5 s'"},
    "mark_action_unknown": {
        "p_tenant_id": "'t1'", "p_action_key": "'live'", "p_attempt": "1",
        "p_error": "'{\"e\": 1}'::jsonb", "p_now": f"'{T0}'::timestamptz + interval '5 s'"},
    "resolve_action": {
        "p_tenant_id": "'t1'", "p_action_key": "'unk'", "p_state": "'succeeded'",
        "p_result": "'{}'::jsonb", "p_error": "NULL::jsonb",
        "p_provider_reference": "NULL::text", "p_note": "'checked'::text",
        "p_now": f"'{T0}'::timestamptz + interval '5 s'"},
    "sweep_expired_actions": {"p_limit": "10", "p_now": f"'{T0}'::timestamptz + interval '1 day'"},
    "purge_actions": {"p_older_than": "'0 seconds'::interval", "p_limit": "10",
                      "p_now": f"'{T0}'::timestamptz + interval '1 day'"},
    "bind_role_to_tenant": {"p_role": "current_user::text", "p_tenant_id": "'t9'"},
    "unbind_role": {"p_role": "'rs_nobody'"},
}

ID_ARGS = {
    "claim_action": ["p_tenant_id", "p_action_key", "p_operation", "p_worker_id", "p_thread_id"],
    "claim_actions": ["p_tenant_id", "p_worker_id", "p_thread_id"],
    "heartbeat_action": ["p_tenant_id", "p_action_key"],
    "complete_action": ["p_tenant_id", "p_action_key"],
    "fail_action": ["p_tenant_id", "p_action_key"],
    "mark_action_unknown": ["p_tenant_id", "p_action_key"],
    "resolve_action": ["p_tenant_id", "p_action_key"],
    "bind_role_to_tenant": ["p_tenant_id"],
}

# Arguments whose declared default is NULL: a NULL is fine there.
NULL_OK = {"p_thread_id", "p_provider_reference", "p_note", "p_result@resolve_action",
           "p_error@resolve_action"}

SQL_TYPES = {"p_tenant_id": "text", "p_action_key": "text", "p_operation": "text",
             "p_request": "jsonb", "p_worker_id": "text", "p_lease": "interval",
             "p_thread_id": "text", "p_on_expired": "text", "p_now": "timestamptz",
             "p_action_keys": "text[]", "p_operations": "text[]", "p_requests": "jsonb[]",
             "p_attempt": "integer", "p_result": "jsonb", "p_error": "jsonb",
             "p_retryable": "boolean", "p_state": "text", "p_provider_reference": "text",
             "p_note": "text", "p_limit": "integer", "p_older_than": "interval",
             "p_role": "text"}


def _cases() -> list[tuple[str, str, str, str]]:
    """(function, argument, bad SQL expression, argument the message must name)."""
    cases: list[tuple[str, str, str, str]] = []
    for fn, args in ID_ARGS.items():
        for arg in args:
            cases += [(fn, arg, "''", arg), (fn, arg, f"'{LONG}'", arg)]
    for fn, args in VALID.items():
        for arg in args:
            if arg in NULL_OK or f"{arg}@{fn}" in NULL_OK:
                continue
            cases.append((fn, arg, f"NULL::{SQL_TYPES[arg]}", arg))
    for fn in ("claim_action", "claim_actions", "heartbeat_action"):
        for lease in ("'-1 second'", "'0'", "'1 day -25 hours'"):
            cases.append((fn, "p_lease", f"{lease}::interval", "p_lease"))
    for value in ("'[]'", "'\"text\"'", "'1'", "'null'", "'[{\"a\": 1}]'"):
        cases.append(("claim_action", "p_request", f"{value}::jsonb", "p_request"))
        cases.append(("claim_actions", "p_requests", f"ARRAY[{value}::jsonb, '{{}}'::jsonb]",
                      "p_request"))
    for fn in ("claim_action", "claim_actions"):
        for value in ("'retry'", "''", "'UNKNOWN'", "'Reclaim'"):
            cases.append((fn, "p_on_expired", value, "p_on_expired"))
    for value in ("'running'", "'unknown'", "'bogus'", "''", "'Succeeded'"):
        cases.append(("resolve_action", "p_state", value, "p_state"))
    for fn in ("sweep_expired_actions", "purge_actions"):
        for value in ("0", "-1"):
            cases.append((fn, "p_limit", value, "p_limit"))
    cases.append(("purge_actions", "p_older_than", "'-1 second'::interval", "p_older_than"))
    for fn in ("heartbeat_action", "complete_action", "fail_action", "mark_action_unknown"):
        for value in ("0", "-1"):
            cases.append((fn, "p_attempt", value, "p_attempt"))
    # Array elements of the batch claim.
    cases += [
        ("claim_actions", "p_action_keys", "ARRAY['', 'n2']", "p_action_key"),
        ("claim_actions", "p_action_keys", f"ARRAY['{LONG}', 'n2']", "p_action_key"),
        ("claim_actions", "p_action_keys", "ARRAY[NULL, 'n2']::text[]",
         "p_action_keys: must not contain NULL"),
        ("claim_actions", "p_action_keys", "ARRAY['n1', 'n1']", "p_action_keys"),
        ("claim_actions", "p_action_keys", "ARRAY['n1']", "p_action_keys"),
        ("claim_actions", "p_operations", "ARRAY['op', '']", "p_operation"),
        ("claim_actions", "p_requests", "ARRAY['{}'::jsonb, NULL]", "p_request"),
        ("bind_role_to_tenant", "p_role", "'rs_no_such_role'", "p_role"),
        ("bind_role_to_tenant", "p_role", "''", "p_role"),
    ]
    return cases


def call_sql(fn: str, args: dict[str, str]) -> str:
    named = ", ".join(f"{k} => {v}" for k, v in args.items())
    return f"SELECT * FROM replaysafe.{fn}({named})"


def setup_actions(conn: psycopg.Connection[Any]) -> None:
    """live: running attempt 1 (lease until T0+30s); unk: unknown; done: succeeded at T0."""
    for key in ("live", "unk", "done"):
        conn.execute(call_sql("claim_action", VALID["claim_action"] | {
            "p_action_key": f"'{key}'", "p_thread_id": "NULL::text"}))
    conn.execute(f"SELECT replaysafe.mark_action_unknown('t1', 'unk', 1, '{{}}', '{T0}')")
    conn.execute(f"SELECT replaysafe.complete_action('t1', 'done', 1, '{{}}', NULL, '{T0}')")


def snapshot(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    row = conn.execute("""
        SELECT (SELECT count(*) FROM replaysafe.actions),
               (SELECT count(*) FROM replaysafe.action_attempts),
               (SELECT count(*) FROM replaysafe.role_bindings),
               (SELECT jsonb_agg(to_jsonb(a) ORDER BY a.tenant_id, a.action_key)
                FROM replaysafe.actions a),
               (SELECT jsonb_agg(to_jsonb(t) ORDER BY t.tenant_id, t.action_key, t.attempt)
                FROM replaysafe.action_attempts t),
               (SELECT jsonb_agg(to_jsonb(b) ORDER BY b.role_name) FROM replaysafe.role_bindings b)
    """).fetchone()
    assert row is not None
    return tuple(row)


@pytest.fixture(scope="module")
def shared_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    with cloned_database(admin_dsn, template_db) as dsn:
        yield dsn


@pytest.fixture
def conn(shared_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(shared_dsn, autocommit=True) as c:
        reset_ledger(c)
        yield c


@pytest.fixture
def dsn(shared_dsn: str) -> str:
    return shared_dsn


@pytest.fixture
def ledger(shared_dsn: str) -> Iterator[Ledger]:
    with Ledger(shared_dsn, tenant_id="t1", worker_id="w1") as led:
        yield led


@pytest.fixture
def prepared(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    setup_actions(conn)
    return conn


@pytest.mark.parametrize("fn", list(VALID))
def test_the_valid_baseline_call_writes(prepared: psycopg.Connection[Any], fn: str) -> None:
    """Each baseline would write, so a bad call that slipped through would show."""
    before = snapshot(prepared)
    prepared.execute(call_sql(fn, VALID[fn]))
    if fn != "unbind_role":  # unbinding a role that is not bound writes nothing
        assert snapshot(prepared) != before


def test_bad_arguments_raise_rs005_naming_the_argument_and_write_nothing(
        prepared: psycopg.Connection[Any]) -> None:
    # One database for all cases (a clone per case would cost minutes); a savepoint-free
    # autocommit call either fails whole or writes, and the snapshot shows which.
    before = snapshot(prepared)
    failures: list[str] = []
    for fn, arg, bad, named in _cases():
        sql = call_sql(fn, VALID[fn] | {arg: bad})
        try:
            prepared.execute(sql)
        except psycopg.Error as exc:
            message = exc.diag.message_primary or ""
            if exc.sqlstate != "RS005" or named not in message:
                failures.append(f"{fn}({arg} => {bad[:20]}): {exc.sqlstate} {message}")
        else:
            failures.append(f"{fn}({arg} => {bad[:20]}): no error")
        if snapshot(prepared) != before:
            failures.append(f"{fn}({arg} => {bad[:20]}): wrote something")
            before = snapshot(prepared)
    assert failures == []
    assert len(_cases()) > 100


def test_512_character_ids_are_accepted(conn: psycopg.Connection[Any]) -> None:
    ids = {a: f"'{MAX}'" for a in ("p_tenant_id", "p_action_key", "p_operation", "p_worker_id",
                                   "p_thread_id")}
    c = conn.execute(call_sql("claim_action", VALID["claim_action"] | ids)).fetchone()
    assert c is not None and c[0] == "claimed"
    key = {"p_tenant_id": f"'{MAX}'", "p_action_key": f"'{MAX}'"}
    conn.execute(call_sql("heartbeat_action", VALID["heartbeat_action"] | key))
    assert conn.execute(call_sql("mark_action_unknown", VALID["mark_action_unknown"] | key)
                        ).fetchone() == ("recorded",)
    assert conn.execute(call_sql("resolve_action", VALID["resolve_action"] | key)
                        ).fetchone() == ("succeeded",)
    batch = conn.execute(call_sql("claim_actions", VALID["claim_actions"] | {
        "p_tenant_id": f"'{MAX}'", "p_action_keys": f"ARRAY['{MAX}', 'b']",
        "p_operations": f"ARRAY['{MAX}', 'op']", "p_worker_id": f"'{MAX}'",
        "p_requests": "ARRAY['{\"order\": 1}'::jsonb, '{}'::jsonb]",
        "p_thread_id": f"'{MAX}'"})).fetchall()
    assert [r[0] for r in batch] == ["replay", "claimed"]
    conn.execute(call_sql("bind_role_to_tenant", {"p_role": "current_user::text",
                                                  "p_tenant_id": f"'{MAX}'"}))
    conn.execute("SELECT replaysafe.unbind_role(current_user::text)")
    lengths = conn.execute("SELECT length(tenant_id), length(action_key), length(operation), "
                           "length(worker_id), length(thread_id) FROM replaysafe.actions "
                           "WHERE action_key <> 'b'").fetchone()
    assert lengths == (512, 512, 512, 512, 512)


# --- driver side: values psycopg or jsonb cannot carry ----------------------------------------

class Opaque:
    pass


BAD_JSON: list[Any] = [{"x": Opaque()}, {"x": math.nan}, {"x": math.inf}, {"x": "a\u0000b"},
                       {"a\u0000": 1}, {"x": {1, 2}}, {"x": b"bytes"}]


def driver_calls(led: Ledger) -> list[tuple[str, Callable[[Any], Any]]]:
    return [
        ("claim", lambda v: led.claim("new", "op", v)),
        ("complete", lambda v: led.complete("live", 1, v)),
        ("fail", lambda v: led.fail("live", 1, v)),
        ("mark_unknown", lambda v: led.mark_unknown("live", 1, v)),
        ("resolve result", lambda v: led.resolve("unk", "succeeded", result=v)),
        ("resolve error", lambda v: led.resolve("unk", "failed", error=v)),
    ]


def test_driver_rejects_values_json_cannot_carry(prepared: psycopg.Connection[Any],
                                                 ledger: Ledger) -> None:
    before = snapshot(prepared)
    for name, call in driver_calls(ledger):
        for value in BAD_JSON:
            with pytest.raises(InvalidArgument):
                call(value)
            assert snapshot(prepared) == before, (name, value)


@pytest.mark.parametrize("request_value", [[1, 2], "text", 1, None, True])
def test_driver_rejects_a_non_object_request(prepared: psycopg.Connection[Any], ledger: Ledger,
                                             request_value: Any) -> None:
    before = snapshot(prepared)
    with pytest.raises(InvalidArgument, match="request"):
        ledger.claim("new", "op", request_value)
    assert snapshot(prepared) == before


def test_driver_rejects_bad_ids_and_leases(prepared: psycopg.Connection[Any], ledger: Ledger,
                                           dsn: str) -> None:
    before = snapshot(prepared)
    attempts: list[Callable[[], Any]] = [
        lambda: ledger.claim("a\u0000b", "op", {}),
        lambda: ledger.claim("", "op", {}),
        lambda: ledger.claim(LONG, "op", {}),
        lambda: ledger.claim("new", "", {}),
        lambda: ledger.claim("new", "op", {}, lease=-1),
        lambda: ledger.claim("new", "op", {}, lease=0),
        lambda: ledger.claim("new", "op", {}, lease="30s"),  # type: ignore[arg-type]
        lambda: ledger.claim("new", "op", {}, on_expired="sometimes"),
        lambda: ledger.heartbeat("live", 0),
        lambda: ledger.heartbeat("live", 1, lease=timedelta(seconds=-5)),
        lambda: ledger.resolve("unk", "running"),
        lambda: ledger.sweep(limit=0),
        lambda: ledger.purge(-1),
        lambda: ledger.purge(timedelta(days=1), limit=0),
    ]
    for call in attempts:
        with pytest.raises(InvalidArgument):
            call()
        assert snapshot(prepared) == before
    with Ledger(dsn, tenant_id="", worker_id="w") as nameless, pytest.raises(InvalidArgument):
        nameless.claim("new", "op", {})
    with Ledger(dsn, tenant_id="t1", worker_id=LONG) as wordy, pytest.raises(InvalidArgument):
        wordy.claim("new", "op", {}, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert snapshot(prepared) == before
