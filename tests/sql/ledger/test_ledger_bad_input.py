"""Bad input to every ledger function (docs/sql-ledger.md, docs/errors.md): RS005 naming the
argument, nothing written.

Each case starts from a call that would succeed and write (a new key to claim, a live attempt
to report on, an unknown action to resolve, an expired lease to sweep, an old action to
purge) and breaks exactly one argument, so a missing check shows up as a write.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers.bad_input import LONG
from helpers.db import reset_ledger

from replaysafe_pg import AsyncLedger, AttemptToken, InvalidArgument, Ledger, Threads

T0 = "2026-01-01 12:00:00+00"
MAX = "y" * 512
# The attempt tokens of setup_actions' claims live in the session (they are made by the
# database and only their hashes are stored): the token of attempt 1 of `key`.
REPORTS = ("heartbeat_action", "complete_action", "fail_action", "mark_action_unknown")


def token_of(key: str) -> str:
    return f"current_setting('rs_test.token_{key}')"


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
        "p_attempt_token": token_of("live"),
        "p_lease": "'60 seconds'::interval", "p_now": f"'{T0}'::timestamptz + interval '5 s'"},
    "complete_action": {
        "p_tenant_id": "'t1'", "p_action_key": "'live'", "p_attempt": "1",
        "p_attempt_token": token_of("live"),
        "p_result": "'{\"ok\": 1}'::jsonb", "p_provider_reference": "'re_1'::text",
        "p_now": f"'{T0}'::timestamptz + interval '5 s'"},
    "fail_action": {
        "p_tenant_id": "'t1'", "p_action_key": "'live'", "p_attempt": "1",
        "p_attempt_token": token_of("live"),
        "p_error": "'{\"e\": 1}'::jsonb", "p_retryable": "false",
        "p_now": f"'{T0}'::timestamptz + interval '5 s'"},
    "mark_action_unknown": {
        "p_tenant_id": "'t1'", "p_action_key": "'live'", "p_attempt": "1",
        "p_attempt_token": token_of("live"),
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
    "heartbeat_action": ["p_tenant_id", "p_action_key", "p_attempt_token"],
    "complete_action": ["p_tenant_id", "p_action_key", "p_attempt_token"],
    "fail_action": ["p_tenant_id", "p_action_key", "p_attempt_token"],
    "mark_action_unknown": ["p_tenant_id", "p_action_key", "p_attempt_token"],
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
             "p_attempt": "integer", "p_attempt_token": "text", "p_result": "jsonb", "p_error": "jsonb",
             "p_retryable": "boolean", "p_state": "text", "p_provider_reference": "text",
             "p_note": "text", "p_limit": "integer", "p_older_than": "interval",
             "p_role": "text"}


def _cases() -> list[tuple[str, str, str, str]]:
    """(function, argument, bad SQL expression, argument the message must name): RS005."""
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
    for fn in REPORTS:
        for value in ("0", "-1"):
            cases.append((fn, "p_attempt", value, "p_attempt"))
    # Claim tokens: secrets of 22 to 512 characters (ID_ARGS-like bounds otherwise).
    short = "'" + "t" * 21 + "'"
    cases += [
        ("claim_action", "p_claim_token", short, "p_claim_token"),
        ("claim_action", "p_claim_token", "''", "p_claim_token"),
        ("claim_action", "p_claim_token", f"'{LONG}'", "p_claim_token"),
        ("claim_actions", "p_claim_tokens", f"ARRAY[{short}, NULL]", "p_claim_token"),
        ("claim_actions", "p_claim_tokens", f"ARRAY['{LONG}', NULL]", "p_claim_token"),
    ]
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


def _denied_cases() -> list[tuple[str, str, str]]:
    """(function, action, a well-formed attempt token that is not attempt 1's): RS004. On the
    running action and on the one that is unknown (where its own token would be late)."""
    cases: list[tuple[str, str, str]] = []
    for fn in REPORTS:
        for key, other in (("live", "unk"), ("unk", "live")):
            cases += [
                (fn, key, token_of(other)),  # another attempt's real token
                (fn, key, f"upper({token_of(key)})"),  # its own, changed
                (fn, key, f"{token_of(key)} || 'x'"),
                (fn, key, "'rsat_' || repeat('0', 64)"),
            ]
    return cases


def call_sql(fn: str, args: dict[str, str]) -> str:
    named = ", ".join(f"{k} => {v}" for k, v in args.items())
    return f"SELECT * FROM replaysafe.{fn}({named})"


def setup_actions(conn: psycopg.Connection[Any]) -> None:
    """live: running attempt 1 (lease until T0+30s); unk: unknown; done: succeeded at T0.
    Each attempt's token is kept in the session as rs_test.token_<key> (see token_of)."""
    for key in ("live", "unk", "done"):
        row = conn.execute(call_sql("claim_action", VALID["claim_action"] | {
            "p_action_key": f"'{key}'", "p_thread_id": "NULL::text"})).fetchone()
        assert row is not None and row[0] == "claimed"
        conn.execute("SELECT set_config(%s, %s, false)", (f"rs_test.token_{key}", row[8]))
    conn.execute(f"SELECT replaysafe.mark_action_unknown('t1', 'unk', 1, {token_of('unk')}, "
                 f"'{{}}', '{T0}')")
    conn.execute(f"SELECT replaysafe.complete_action('t1', 'done', 1, {token_of('done')}, "
                 f"'{{}}', NULL, '{T0}')")


def live_attempt(conn: psycopg.Connection[Any]) -> AttemptToken:
    """The driver's handle on the running attempt of setup_actions."""
    row = conn.execute("SELECT current_setting('rs_test.token_live')").fetchone()
    assert row is not None
    return AttemptToken("live", 1, row[0])


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
    # A well-formed token that is not the attempt's: RS004 (access denied), nothing written.
    for fn, key, bad in _denied_cases():
        sql = call_sql(fn, VALID[fn] | {"p_action_key": f"'{key}'", "p_attempt_token": bad})
        try:
            prepared.execute(sql)
        except psycopg.Error as exc:
            if exc.sqlstate != "RS004":
                failures.append(f"{fn}({key}, {bad[:40]}): {exc.sqlstate} {exc.diag.message_primary}")
        else:
            failures.append(f"{fn}({key}, {bad[:40]}): no error")
        if snapshot(prepared) != before:
            failures.append(f"{fn}({key}, {bad[:40]}): wrote something")
            before = snapshot(prepared)
    assert failures == []
    assert len(_cases()) > 100


def test_512_character_ids_are_accepted(conn: psycopg.Connection[Any]) -> None:
    ids = {a: f"'{MAX}'" for a in ("p_tenant_id", "p_action_key", "p_operation", "p_worker_id",
                                   "p_thread_id")}
    c = conn.execute(call_sql("claim_action", VALID["claim_action"] | ids)).fetchone()
    assert c is not None and c[0] == "claimed"
    key = {"p_tenant_id": f"'{MAX}'", "p_action_key": f"'{MAX}'"}
    token = {"p_attempt_token": f"'{c[8]}'"}
    conn.execute(call_sql("heartbeat_action", VALID["heartbeat_action"] | key | token))
    assert conn.execute(call_sql("mark_action_unknown", VALID["mark_action_unknown"] | key | token)
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


def driver_calls(led: Ledger, live: AttemptToken) -> list[tuple[str, Callable[[Any], Any]]]:
    return [
        ("claim", lambda v: led.claim("new", "op", v)),
        ("complete", lambda v: led.complete(live, v)),
        ("fail", lambda v: led.fail(live, v)),
        ("mark_unknown", lambda v: led.mark_unknown(live, v)),
        ("resolve result", lambda v: led.resolve("unk", "succeeded", result=v)),
        ("resolve error", lambda v: led.resolve("unk", "failed", error=v)),
    ]


def test_driver_rejects_values_json_cannot_carry(prepared: psycopg.Connection[Any],
                                                 ledger: Ledger) -> None:
    before = snapshot(prepared)
    for name, call in driver_calls(ledger, live_attempt(prepared)):
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
    live = live_attempt(prepared)
    replayed = ledger.claim("done", "refund", {"order": 1})  # a replay holds no attempt
    attempts: list[Callable[[], Any]] = [
        lambda: ledger.claim("a\u0000b", "op", {}),
        lambda: ledger.claim("", "op", {}),
        lambda: ledger.claim(LONG, "op", {}),
        lambda: ledger.claim("new", "", {}),
        lambda: ledger.claim("new", "op", {}, lease=-1),
        lambda: ledger.claim("new", "op", {}, lease=0),
        lambda: ledger.claim("new", "op", {}, lease="30s"),  # type: ignore[arg-type]
        lambda: ledger.claim("new", "op", {}, on_expired="sometimes"),
        lambda: ledger.heartbeat(AttemptToken("live", 0, live.attempt_token)),
        lambda: ledger.heartbeat(live, lease=timedelta(seconds=-5)),
        # The attempt's token is required: a key where the claim goes (the old form with the
        # attempt too is a TypeError), none, an empty or an over-long one.
        lambda: ledger.heartbeat("live"),  # type: ignore[arg-type]
        lambda: ledger.complete("live", {}),  # type: ignore[arg-type]
        lambda: ledger.complete(replayed, {}),
        lambda: ledger.fail(AttemptToken("live", 1, ""), {}),
        lambda: ledger.mark_unknown(AttemptToken("live", 1, LONG), {}),
        lambda: ledger.resolve("unk", "running"),
        lambda: ledger.sweep(limit=0),
        lambda: ledger.purge(-1),
        lambda: ledger.purge(timedelta(days=1), limit=0),
    ]
    for call in attempts:
        with pytest.raises(InvalidArgument):
            call()
        assert snapshot(prepared) == before
    with pytest.raises(InvalidArgument):  # refused when the ledger is made
        Ledger(dsn, tenant_id="", worker_id="w")
    with pytest.raises(InvalidArgument):
        Ledger(dsn, tenant_id="t1", worker_id=LONG)
    assert snapshot(prepared) == before


# --- driver side: types and ranges, refused before anything is sent ---------------------------

NOT_TEXT: list[Any] = [b"k", 42, 4.2, ["k"]]
# Within 512 characters, over 1,024 bytes in UTF-8 (docs/sql-ledger.md): both limits hold.
TOO_MANY_BYTES = ["\u4e2d" * 342, "\U0001f980" * 257]
BAD_TEXT: list[Any] = ["", LONG, *TOO_MANY_BYTES, "a\ud800b", "a\u0000b"]


def _tool() -> dict[str, int]:
    return {"ok": 1}


def id_calls(led: Ledger, dsn: str, token: str) -> list[tuple[str, Callable[[Any], Any]]]:
    def construct(**kw: Any) -> Any:
        with Ledger(dsn, **kw) as fresh:
            return fresh.claim("new", "op", {})

    def threads(**kw: Any) -> Any:
        with Threads(dsn, **kw) as fresh:
            return fresh.write("th", {}, 0)

    def threads_call(v: Any) -> Any:
        with Threads(dsn, tenant_id="t1") as th:
            return th.write(v, {}, 0)

    return [
        ("claim key", lambda v: led.claim(v, "op", {})),
        ("claim operation", lambda v: led.claim("new", v, {})),
        ("claim thread", lambda v: led.claim("new", "op", {}, thread_id=v)),
        ("claim_many key", lambda v: led.claim_many([(v, "op", {})])),
        ("claim_many operation", lambda v: led.claim_many([("new", v, {})])),
        ("heartbeat", lambda v: led.heartbeat(AttemptToken(v, 1, token))),
        ("complete", lambda v: led.complete(AttemptToken(v, 1, token), {})),
        ("fail", lambda v: led.fail(AttemptToken(v, 1, token), {})),
        ("mark_unknown", lambda v: led.mark_unknown(AttemptToken(v, 1, token), {})),
        ("resolve", lambda v: led.resolve(v, "succeeded", result={})),
        ("get", lambda v: led.get(v)),
        ("attempts", lambda v: led.attempts(v)),
        ("run key", lambda v: led.run("op", _tool, {}, key=v)),
        ("run operation", lambda v: led.run(v, _tool, {}, key="new")),
        ("run thread", lambda v: led.run("op", _tool, {}, key="new", thread_id=v)),
        ("run_many key", lambda v: led.run_many([("op", _tool, {}, v)])),
        ("tenant", lambda v: construct(tenant_id=v, worker_id="w")),
        ("worker", lambda v: construct(tenant_id="t1", worker_id=v)),
        ("threads tenant", lambda v: threads(tenant_id=v)),
        ("threads user", lambda v: threads(tenant_id="t1", user_id=v)),
        ("threads thread", threads_call),
    ]


def test_driver_rejects_ids_that_are_not_text(prepared: psycopg.Connection[Any], ledger: Ledger,
                                              dsn: str) -> None:
    """bytes, int ... used to go out as bytea or integer and report SchemaNotInstalled (no
    function of that signature) or a raw psycopg error."""
    before = snapshot(prepared)
    failures = []
    for name, call in id_calls(ledger, dsn, live_attempt(prepared).attempt_token):
        for value in NOT_TEXT:
            try:
                call(value)
            except InvalidArgument as exc:
                if "must be a str" not in str(exc):
                    failures.append(f"{name}({value!r}): {exc}")
            except Exception as exc:
                failures.append(f"{name}({value!r}): {type(exc).__name__}: {exc}")
            else:
                failures.append(f"{name}({value!r}): no error")
    assert failures == []
    assert snapshot(prepared) == before


def test_driver_rejects_empty_long_and_unencodable_ids(prepared: psycopg.Connection[Any],
                                                       ledger: Ledger, dsn: str) -> None:
    before = snapshot(prepared)
    failures = []
    for name, call in id_calls(ledger, dsn, live_attempt(prepared).attempt_token):
        if name in ("get", "attempts"):  # reads: nothing to refuse, nothing found
            continue
        for value in BAD_TEXT:
            try:
                call(value)
            except InvalidArgument:
                pass
            except Exception as exc:
                failures.append(f"{name}({value[:10]!r}): {type(exc).__name__}: {exc}")
            else:
                failures.append(f"{name}({value[:10]!r}): no error")
    assert failures == []
    assert snapshot(prepared) == before


def test_ids_at_both_limits_are_accepted(conn: psycopg.Connection[Any], dsn: str) -> None:
    widest = "\u00e9" * 512  # 512 characters, exactly 1,024 bytes
    with Ledger(dsn, tenant_id=widest, worker_id=widest) as led:
        c = led.claim(widest, widest, {}, thread_id=widest)
        assert c.outcome == "claimed"
        assert led.complete(c, {}) == "recorded"


BAD_LEASES: list[Any] = [math.inf, -math.inf, math.nan, 0, 0.0, -1, 1e300, 7 * 86400 + 1,
                         timedelta(0), timedelta(seconds=-1), timedelta(days=7, microseconds=1),
                         timedelta.max, True, "30s", None]


def test_driver_rejects_leases_out_of_range(prepared: psycopg.Connection[Any],
                                            ledger: Ledger) -> None:
    """Positive, finite, at most 7 days (docs/sql-ledger.md). inf used to raise OverflowError."""
    before = snapshot(prepared)
    live = live_attempt(prepared)
    calls: list[tuple[str, Callable[[Any], Any]]] = [
        ("claim", lambda v: ledger.claim("new", "op", {}, lease=v)),
        ("claim_many", lambda v: ledger.claim_many([("new", "op", {})], lease=v)),
        ("heartbeat", lambda v: ledger.heartbeat(live, lease=v)),
        ("run", lambda v: ledger.run("op", _tool, {}, key="new", lease=v)),
        ("run_many", lambda v: ledger.run_many([("op", _tool, {}, "new")], lease=v)),
    ]
    failures = []
    for name, call in calls:
        for value in BAD_LEASES:
            try:
                call(value)
            except InvalidArgument as exc:
                if "lease" not in str(exc):
                    failures.append(f"{name}({value!r}): {exc}")
            except Exception as exc:
                failures.append(f"{name}({value!r}): {type(exc).__name__}: {exc}")
            else:
                failures.append(f"{name}({value!r}): no error")
    assert failures == []
    assert snapshot(prepared) == before
    assert ledger.claim("week", "op", {}, lease=timedelta(days=7)).outcome == "claimed"
    assert ledger.claim("seconds", "op", {}, lease=7 * 86400.0).outcome == "claimed"


def test_driver_rejects_bad_older_than_and_other_arguments(prepared: psycopg.Connection[Any],
                                                           ledger: Ledger) -> None:
    before = snapshot(prepared)
    naive = datetime(2026, 1, 1, 12, 0)  # no time zone: the point
    live = live_attempt(prepared)
    token = live.attempt_token
    attempts: dict[str, Callable[[], Any]] = {
        "older_than inf": lambda: ledger.purge(math.inf),
        "older_than nan": lambda: ledger.purge(math.nan),
        "older_than -1": lambda: ledger.purge(-1),
        "older_than -1s": lambda: ledger.purge(timedelta(seconds=-1)),
        "older_than huge": lambda: ledger.purge(1e300),
        "older_than text": lambda: ledger.purge("7d"),
        "attempt text": lambda: ledger.complete(AttemptToken("live", "1", token), {}),  # type: ignore[arg-type]
        "attempt float": lambda: ledger.complete(AttemptToken("live", 1.4, token), {}),  # type: ignore[arg-type]
        "attempt bool": lambda: ledger.heartbeat(AttemptToken("live", True, token)),
        "token bytes": lambda: ledger.complete(AttemptToken("live", 1, token.encode()), {}),  # type: ignore[arg-type]
        "limit float": lambda: ledger.sweep(limit=1.5),  # type: ignore[arg-type]
        "limit bool": lambda: ledger.purge(0, limit=True),
        "retryable text": lambda: ledger.fail(live, {}, retryable="no"),  # type: ignore[arg-type]
        "naive now": lambda: ledger.sweep(now=naive),
        "text now": lambda: ledger.sweep(now="2026-01-01"),  # type: ignore[arg-type]
        "note": lambda: ledger.resolve("unk", "succeeded", note=42),  # type: ignore[arg-type]
        "reference": lambda: ledger.complete(live, {}, provider_reference=42),  # type: ignore[arg-type]
        "on_expired": lambda: ledger.claim("new", "op", {}, on_expired=1),  # type: ignore[arg-type]
        "wait_timeout nan": lambda: ledger.run("op", _tool, {}, key="new", wait_timeout=math.nan),
        "timeout inf": lambda: ledger.run("op", _tool, {}, key="new", timeout=math.inf),
    }
    failures = []
    for name, call in attempts.items():
        try:
            call()
        except InvalidArgument:
            pass
        except Exception as exc:
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            failures.append(f"{name}: no error")
        if snapshot(prepared) != before:
            failures.append(f"{name}: wrote something")
            before = snapshot(prepared)
    assert failures == []


def test_async_ledger_checks_the_same_arguments(prepared: psycopg.Connection[Any],
                                                dsn: str) -> None:
    async def main() -> None:
        with pytest.raises(InvalidArgument):
            AsyncLedger(dsn, tenant_id=b"t1")  # type: ignore[arg-type]
        async with AsyncLedger(dsn, tenant_id="t1", worker_id="w") as led:
            for call in (lambda: led.claim(b"k", "op", {}),  # type: ignore[arg-type]
                         lambda: led.claim("new", "op", {}, lease=math.inf),
                         lambda: led.run("op", _tool, {}, key=42),  # type: ignore[arg-type]
                         lambda: led.purge(math.nan)):
                with pytest.raises(InvalidArgument):
                    await call()

    before = snapshot(prepared)
    asyncio.run(main())
    assert snapshot(prepared) == before
