"""The ``replaysafe-pg`` command against a real Postgres: every subcommand, human and --json."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers.cli import assert_one_line_error, at, run, run_json
from psycopg import conninfo as pg_conninfo

import replaysafe_pg
import replaysafe_pg.schema
from replaysafe_pg import Ledger

LEASE = timedelta(seconds=30)


def _unknown(led: Ledger, key: str, seconds: float = 0) -> None:
    """An action whose worker died: claimed, lease ran out, noticed by a later claim."""
    led.claim(key, "refund", {"order": key}, lease=LEASE, now=at(seconds))
    led.claim(key, "refund", {"order": key}, lease=LEASE, now=at(seconds + 60))


def _succeeded(led: Ledger, key: str, seconds: float = 0, **kw: Any) -> None:
    c = led.claim(key, kw.pop("operation", "refund"), {"order": key}, lease=LEASE,
                  now=at(seconds), **kw)
    led.complete(c, {"refund_id": f"re_{key}"}, now=at(seconds + 1))


# --- migrate ---------------------------------------------------------------------------------

def test_migrate_installs_the_schema_and_current_reports_it(empty_dsn: str) -> None:
    head = replaysafe_pg.schema.head_revision()
    assert run_json("migrate", "current", dsn=empty_dsn) == {
        "current": None, "head": head, "up_to_date": False}
    result = run("migrate", dsn=empty_dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"migrated from nothing to {head}"
    assert run("migrate", dsn=empty_dsn).stdout.strip() == f"already at {head}"
    assert run("migrate", "current", dsn=empty_dsn).stdout.strip() == f"{head} (head)"
    assert replaysafe_pg.current_revision(empty_dsn) == head


def test_migrate_sql_prints_a_script_that_builds_the_schema(empty_dsn: str) -> None:
    # No database needed for --sql: a bad DSN must not matter.
    result = run("migrate", "--sql", dsn="host=/nonexistent dbname=x")
    assert result.exit_code == 0, result.stderr
    sql = result.stdout
    assert sql.startswith("BEGIN;") and "CREATE FUNCTION replaysafe.claim_action" in sql
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]
        assert conn.execute("SELECT to_regprocedure('replaysafe.sweep_expired_actions(integer,"
                            "timestamptz,text,text)') IS NOT NULL").fetchone() == (True,)
    assert replaysafe_pg.current_revision(empty_dsn) == replaysafe_pg.schema.head_revision()


# --- doctor ----------------------------------------------------------------------------------

def test_doctor_reports_revision_roles_rls_and_counts(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _succeeded(led, "a")
        _unknown(led, "b")
    report = run_json("doctor", dsn=dsn)
    assert report["ok"] is True
    assert report["revision"] == report["head"]
    checks = {c["check"]: c["ok"] for c in report["checks"]}
    assert checks["role replaysafe_worker"] and checks["role replaysafe_auditor"]
    assert checks["row-level security on actions"] and checks["row-level security on action_attempts"]
    assert report["counts"] == {"succeeded": 1, "unknown": 1}
    human = run("doctor", dsn=dsn)
    assert human.exit_code == 0
    assert "actions by state: running 0, succeeded 1, failed 0, retryable 0, unknown 1" in human.stdout


def test_doctor_fails_on_a_database_without_the_schema(empty_dsn: str) -> None:
    result = run("doctor", dsn=empty_dsn)
    assert result.exit_code == 1
    assert "FAIL  schema revision: not installed" in result.stdout


def test_doctor_notices_row_level_security_switched_off(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE replaysafe.actions DISABLE ROW LEVEL SECURITY")
    result = run("doctor", dsn=dsn)
    assert result.exit_code == 1
    assert "FAIL  row-level security on actions: DISABLED" in result.stdout


# --- actions ---------------------------------------------------------------------------------

def test_actions_list_filters(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as t1, Ledger(dsn, tenant_id="t2") as t2:
        _succeeded(t1, "old", seconds=0)  # created at T0: long ago
        _succeeded(t1, "charge", operation="charge", thread_id="th1")
        _unknown(t1, "lost")
        _succeeded(t2, "other")
        t2.claim("fresh", "refund", {"order": 1}, lease=LEASE)  # created now
    everything = run_json("actions", "list", dsn=dsn)
    assert {(r["tenant_id"], r["action_key"]) for r in everything} == {
        ("t1", "old"), ("t1", "charge"), ("t1", "lost"), ("t2", "other"), ("t2", "fresh")}
    assert everything[0]["action_key"] == "fresh"  # newest first

    def keys(*args: str) -> set[str]:
        return {r["action_key"] for r in run_json("actions", "list", *args, dsn=dsn)}

    assert keys("--tenant", "t2") == {"other", "fresh"}
    assert keys("--state", "unknown") == {"lost"}
    assert keys("--state", "unknown", "--state", "running") == {"lost", "fresh"}
    assert keys("--operation", "charge") == {"charge"}
    assert keys("--thread", "th1") == {"charge"}
    assert keys("--older-than", "7d") == {"old", "charge", "lost", "other"}
    assert len(run_json("actions", "list", "--limit", "2", dsn=dsn)) == 2
    row = next(r for r in everything if r["action_key"] == "old")
    assert row["created_at"] == at(0).isoformat().replace("+00:00", "+00:00")
    human = run("actions", "list", "--tenant", "t2", dsn=dsn).stdout.splitlines()
    assert human[0].split()[:4] == ["TENANT_ID", "ACTION_KEY", "OPERATION", "STATE"]
    assert len(human) == 3
    assert run("actions", "list", "--tenant", "nobody", dsn=dsn).stdout.strip() == "no actions"


def test_actions_list_rejects_a_bad_duration(dsn: str) -> None:
    result = run("actions", "list", "--older-than", "7 parsecs", dsn=dsn)
    assert result.exit_code == 2 and "not a duration" in result.stderr


def test_actions_show_with_attempts(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "k")
        led.resolve("k", "retryable", note="provider says no refund")
        c = led.claim("k", "refund", {"order": "k"}, lease=LEASE, now=at(120))
        led.complete(c, {"refund_id": "re_2"}, provider_reference="re_2", now=at(121))
    shown = run_json("actions", "show", "k", "--tenant", "t1", dsn=dsn)
    assert shown["action"]["state"] == "succeeded"
    assert shown["action"]["provider_reference"] == "re_2"
    assert shown["action"]["resolution_note"] == "provider says no refund"
    assert [(a["attempt"], a["outcome"]) for a in shown["attempts"]] == [
        (1, "unknown"), (2, "succeeded")]
    assert shown["attempts"][0]["error"]["reason"] == "lease_expired"
    human = run("actions", "show", "k", "--tenant", "t1", dsn=dsn).stdout
    assert re.search(r"^state\s+succeeded$", human, re.MULTILINE)
    assert "attempts:" in human and "lease_expired" in human


def test_actions_show_unknown_key_is_one_clear_line(dsn: str) -> None:
    assert_one_line_error(run("actions", "show", "nope", "--tenant", "t9", dsn=dsn),
                          "no action nope for tenant t9")


def test_actions_show_prints_attempt_times_like_every_other_table(dsn: str) -> None:
    """actions show prints its attempts' times as every table does ('2026-01-01
    12:00:00+00:00', never ISO 'T12:00'), actions list too."""
    with Ledger(dsn, tenant_id="t1") as led:
        _succeeded(led, "k0")
    human = run("actions", "show", "k0", "--tenant", "t1", dsn=dsn).stdout
    attempts = human.split("attempts:\n", 1)[1].splitlines()
    assert attempts[1].split()[2:6] == [
        "2026-01-01", "12:00:00+00:00", "2026-01-01",
        "12:00:01+00:00"], attempts
    assert "T12:00" not in human
    listed = run("actions", "list", dsn=dsn).stdout
    assert "2026-01-01 12:00:00+00:00" in listed


# --- audit -----------------------------------------------------------------------------------

def test_audit_exit_status_is_zero_when_nothing_needs_attention(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _succeeded(led, "fine")
    result = run("audit", dsn=dsn)
    assert result.exit_code == 0 and result.stdout.strip() == "nothing needs attention"
    assert run_json("audit", dsn=dsn) == {"unresolved_actions": [], "multi_effect_actions": []}


def test_audit_lists_unresolved_and_multi_effect_actions_and_exits_1(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "lost")
        # Attempt 1 stalls, attempt 2 re-runs (reclaim policy), both report success.
        c1 = led.claim("twice", "refund", {"o": 1}, lease=LEASE, on_expired="reclaim", now=at(0))
        c2 = led.claim("twice", "refund", {"o": 1}, lease=LEASE, on_expired="reclaim", now=at(60))
        led.complete(c2, {"ok": 2}, now=at(61))
        led.complete(c1, {"ok": 1}, now=at(62))
    with Ledger(dsn, tenant_id="t2") as other:
        _unknown(other, "elsewhere")
    report = run_json("audit", dsn=dsn, exit_code=1)
    assert {(r["tenant_id"], r["action_key"]) for r in report["unresolved_actions"]} == {
        ("t1", "lost"), ("t2", "elsewhere")}
    assert isinstance(report["unresolved_actions"][0]["age"], float)
    assert report["multi_effect_actions"] == [
        {"tenant_id": "t1", "action_key": "twice", "operation": "refund", "successful_attempts": 2}]
    only_t2 = run_json("audit", "--tenant", "t2", dsn=dsn, exit_code=1)
    assert [r["action_key"] for r in only_t2["unresolved_actions"]] == ["elsewhere"]
    human = run("audit", dsn=dsn)
    assert human.exit_code == 1
    assert "unresolved actions" in human.stdout and "more than once" in human.stdout


# --- resolve, sweep, purge -------------------------------------------------------------------

def test_resolve_an_unknown_action(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "k")
    out = run_json("resolve", "k", "--tenant", "t1", "--state", "succeeded",
                   "--result", '{"refund_id": "re_1"}', "--provider-reference", "re_1",
                   "--note", "found in the provider dashboard", dsn=dsn)
    assert out == {"tenant_id": "t1", "action_key": "k", "state": "succeeded"}
    with Ledger(dsn, tenant_id="t1") as led:
        action = led.get("k")
    assert action is not None
    assert (action.state, action.result, action.provider_reference, action.resolution_note) == (
        "succeeded", {"refund_id": "re_1"}, "re_1", "found in the provider dashboard")


def test_resolve_errors_are_one_line(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _succeeded(led, "done")
    assert_one_line_error(run("resolve", "done", "--tenant", "t1", "--state", "failed", dsn=dsn),
                          "InvalidTransition", "only unknown actions can be resolved")
    assert_one_line_error(run("resolve", "nope", "--state", "failed", dsn=dsn),
                          "no action nope for tenant default")
    bad_json = run("resolve", "done", "--state", "failed", "--error", "{oops", dsn=dsn)
    assert bad_json.exit_code == 2 and "not valid JSON" in bad_json.stderr


def test_sweep_turns_expired_leases_unknown(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        led.claim("stale", "refund", {"o": 1}, lease=LEASE, now=at(0))  # expired long ago
        led.claim("live", "refund", {"o": 2}, lease=timedelta(hours=1))
    assert run_json("sweep", dsn=dsn) == {"swept": 1}
    assert run("sweep", "--limit", "5", dsn=dsn).stdout.strip() == "swept 0 expired lease(s)"
    states = {r["action_key"]: r["state"] for r in run_json("actions", "list", dsn=dsn)}
    assert states == {"stale": "unknown", "live": "running"}


def test_purge_deletes_old_terminal_actions_in_batches(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for i in range(25):
            _succeeded(led, f"old{i}")  # finished at T0 + 1 s
        _unknown(led, "lost")  # never purged
        _succeeded(led, "recent", seconds=0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE replaysafe.actions SET completed_at = now() WHERE action_key = 'recent'")
    result = run("purge", "--older-than", "7d", "--batch-size", "10", "--yes", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    assert re.match(r"purged 25 action\(s\) finished before .* in 3 batch\(es\)", result.stdout)
    assert "purging" in result.stderr  # the progress bar
    left = {r["action_key"] for r in run_json("actions", "list", dsn=dsn)}
    assert left == {"lost", "recent"}
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM replaysafe.action_attempts_v").fetchone() == (2,)
    again = run_json("purge", "--older-than", "7d", dsn=dsn)
    assert (again["purged"], again["batches"]) == (0, 0)


# --- threads ---------------------------------------------------------------------------------

def _has_threads(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regproc('replaysafe.read_thread') IS NOT NULL").fetchone()
    return bool(row and row[0])


def test_threads_show_and_history(dsn: str) -> None:
    if not _has_threads(dsn):
        pytest.skip("thread state (docs/threads.md) is not in this schema yet")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for version, step in enumerate(["greet", "refund", "bye"]):
            conn.execute("SELECT replaysafe.write_thread(p_tenant_id => 't1', p_thread_id => 'th',"
                         " p_expected_version => %s, p_state => %s::jsonb, p_user_id => 'u1')",
                         (version, f'{{"step": "{step}"}}'))
    shown = run_json("threads", "show", "th", "--tenant", "t1", "--user", "u1", dsn=dsn)
    assert (shown["version"], shown["state"], shown["deleted"]) == (3, {"step": "bye"}, False)
    history = run_json("threads", "history", "th", "--tenant", "t1", "--user", "u1", dsn=dsn)
    assert [(h["version"], h["state"]["step"]) for h in history] == [
        (3, "bye"), (2, "refund"), (1, "greet")]
    human = run("threads", "show", "th", "--tenant", "t1", "--user", "u1", dsn=dsn).stdout
    assert '"step": "bye"' in human
    assert_one_line_error(run("threads", "show", "th", "--tenant", "t1", "--user", "u2", dsn=dsn),
                          "AccessDenied")
    assert_one_line_error(run("threads", "show", "none", "--tenant", "t1", dsn=dsn),
                          "no thread none for tenant t1")
    assert_one_line_error(run("threads", "history", "none", "--tenant", "t1", dsn=dsn),
                          "no thread none for tenant t1")


# --- errors and global options ---------------------------------------------------------------

def test_bad_dsn_is_one_clear_line() -> None:
    assert_one_line_error(run("actions", "list", dsn="this is not a dsn"),
                          "cannot connect to the database")


def test_unreachable_server_is_one_clear_line() -> None:
    assert_one_line_error(run("audit", dsn="postgresql://127.0.0.1:1/x?connect_timeout=2"),
                          "cannot connect to the database", "Connection refused")


def test_schema_not_migrated_is_one_clear_line(empty_dsn: str) -> None:
    for args in (["actions", "list"], ["audit"], ["actions", "show", "k"], ["sweep"],
                 ["resolve", "k", "--state", "failed"], ["purge", "--older-than", "1d"],
                 ["demo"]):
        assert_one_line_error(run(*args, dsn=empty_dsn), "replaysafe-pg migrate")


def test_debug_adds_the_traceback_and_keeps_exit_status_2(empty_dsn: str) -> None:
    # 1 would mean "needs attention" for audit: an error must stay 2 with --debug.
    result = run("--debug", "audit", dsn=empty_dsn)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback (most recent call last)" in result.stderr
    assert "SchemaNotInstalled" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("replaysafe-pg: error: ")


def test_global_options_after_the_subcommand_and_from_the_environment(dsn: str) -> None:
    assert run("audit", "--json", "--dsn", dsn).stdout.strip().startswith("{")
    from_env = run("--json", "sweep", env={"REPLAYSAFE_DSN": dsn})
    assert from_env.exit_code == 0 and from_env.stdout.strip().startswith("{")


def test_dsn_on_the_command_line_wins_over_the_environment_at_every_level(
        dsn: str, empty_dsn: str) -> None:
    """A --dsn before the subcommand is not replaced by REPLAYSAFE_DSN, which the subcommand
    reads again; without --dsn the environment's is used."""
    result = run("--dsn", dsn, "audit", env={"REPLAYSAFE_DSN": empty_dsn})
    assert result.exit_code == 0, result.stderr
    assert run("audit", env={"REPLAYSAFE_DSN": empty_dsn}).exit_code == 2


def test_doctor_lists_objects_the_migration_did_not_create_or_another_role_owns(
        dsn: str, make_role: Any) -> None:
    assert run("doctor", dsn=dsn).exit_code == 0
    intruder = make_role()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION replaysafe.installed_revision(text) RETURNS int LANGUAGE sql "
                     "AS 'SELECT 1'")  # an overload: unpinned, not the migration's
        conn.execute(f'GRANT USAGE, CREATE ON SCHEMA replaysafe TO "{intruder}"')
    with psycopg.connect(pg_conninfo.make_conninfo(dsn, user=intruder), autocommit=True) as conn:
        conn.execute("CREATE TABLE replaysafe.notes (x int)")
    result = run("doctor", dsn=dsn)
    assert result.exit_code == 1
    out = result.stdout
    assert "FAIL  schema objects created by the migration: NOT created by the migration: " in out
    assert ("2 functions named installed_revision (the migration creates one): "
            "replaysafe.installed_revision(), replaysafe.installed_revision(text)") in out
    assert "table notes" in out
    assert f"FAIL  schema objects owned by the schema owner: owned by another role: table notes " \
           f"(owner {intruder})" in out
    assert "FAIL  functions pin search_path: NOT pinned: function replaysafe.installed_revision(text)" in out
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE replaysafe.notes")
        conn.execute(f'REVOKE ALL ON SCHEMA replaysafe FROM "{intruder}"')

# --- terminal safety: control characters in values are shown escaped --------------------------

EVIL = "k\x1b[31mRED\x1b[0m\r\x07\x9b2J\x7f"
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # all but the CLI's own newlines


def _no_raw_controls(result: Any) -> str:
    for stream in (result.stdout, result.stderr):
        assert not CONTROL.search(stream), repr(stream)
    text: str = result.stdout + result.stderr
    return text


def test_human_output_escapes_control_characters_in_every_value(dsn: str) -> None:
    """A key, operation, note or error holding terminal escape sequences (written by an
    agent, say) must not reach the operator's terminal raw: shown as \\x1b-style text."""
    with Ledger(dsn, tenant_id="t\x1b]0;owned\x07") as led:
        _unknown(led, EVIL)
        c = led.claim(EVIL + "2", "op\x1b[2J", {"o": 1}, lease=LEASE, on_expired="reclaim",
                      now=at(0))
        c2 = led.claim(EVIL + "2", "op\x1b[2J", {"o": 1}, lease=LEASE, on_expired="reclaim",
                       now=at(60))
        led.complete(c2, {"ok": "\x1b[5m"}, now=at(61))
        # Attempt 1 (stale): an "unknown" with the error, then its success (a final report
        # replaces a provisional "unknown" and keeps its error; it would not replace a failure).
        led.mark_unknown(c, {"message": "boom\x1b[1A\r\x9d"}, now=at(62))
        led.complete(c, {"ok": 1}, now=at(63))
        _unknown(led, EVIL + "3")
        led.resolve(EVIL + "3", "retryable", note="note\x1b[8m\x85")
    tenant = "t\x1b]0;owned\x07"
    listed = _no_raw_controls(run("actions", "list", dsn=dsn))
    assert "k\\x1b[31mRED\\x1b[0m\\r\\x07\\x9b2J\\x7f" in listed
    shown = _no_raw_controls(run("actions", "show", EVIL + "2", "--tenant", tenant, dsn=dsn))
    assert "op\\x1b[2J" in shown and "\\u001b[5m" in shown  # a JSON value: JSON escapes
    _no_raw_controls(run("actions", "show", EVIL + "3", "--tenant", tenant, dsn=dsn))
    audit = run("audit", dsn=dsn)
    assert audit.exit_code == 1
    assert "t\\x1b]0;owned\\x07" in _no_raw_controls(audit)
    resolved = run("resolve", EVIL, "--tenant", tenant, "--state", "failed", "--note", "n", dsn=dsn)
    assert resolved.exit_code == 0
    assert "resolved k\\x1b[31mRED" in _no_raw_controls(resolved)
    missing = run("actions", "show", "nope\x1b[2J\r", "--tenant", tenant, dsn=dsn)
    assert_one_line_error(missing, "no action nope\\x1b[2J\\r")
    _no_raw_controls(missing)
    # --json stays exact (JSON escapes every control character, C1 and DEL included).
    exact = run("--json", "actions", "list", dsn=dsn)
    assert not CONTROL.search(exact.stdout)
    assert EVIL in {a["action_key"] for a in json.loads(exact.stdout)}


def test_thread_output_escapes_control_characters(dsn: str) -> None:
    if not _has_threads(dsn):
        pytest.skip("thread state (docs/threads.md) is not in this schema yet")
    thread = "th\x1b[2J"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT replaysafe.write_thread(p_tenant_id => 't1', p_thread_id => %s,"
                     " p_expected_version => 0, p_state => %s::jsonb)",
                     (thread, json.dumps({"say": "hi\x1b[31m\x9b\x7f", "k\x07": 1})))
    shown = _no_raw_controls(run("threads", "show", thread, "--tenant", "t1", dsn=dsn))
    assert "th\\x1b[2J" in shown
    _no_raw_controls(run("threads", "history", thread, "--tenant", "t1", dsn=dsn))
    assert json.loads(run("--json", "threads", "show", thread, "--tenant", "t1",
                          dsn=dsn).stdout)["state"]["say"] == "hi\x1b[31m\x9b\x7f"


def test_doctor_notices_privileges_the_migration_does_not_grant(dsn: str) -> None:
    assert "ok    privileges only as the migration grants them: yes" in run("doctor", dsn=dsn).stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("GRANT SELECT ON replaysafe.actions TO replaysafe_auditor")
        conn.execute("GRANT EXECUTE ON FUNCTION replaysafe.unbind_role(text) TO replaysafe_worker")
        conn.execute("GRANT EXECUTE ON FUNCTION replaysafe.bind_role_to_tenant(text, text) TO PUBLIC")
    result = run("doctor", dsn=dsn)
    assert result.exit_code == 1
    assert ("FAIL  privileges only as the migration grants them: NOT granted by the migration: "
            "EXECUTE on function replaysafe.bind_role_to_tenant(text,text) to public, ") in result.stdout
    assert "SELECT on table actions to replaysafe_auditor" in result.stdout
    assert "EXECUTE on function replaysafe.unbind_role(text) to replaysafe_worker" in result.stdout


def test_doctor_notices_crossed_duties_schema_grants_and_default_privileges(dsn: str,
                                                                            make_role: Any) -> None:
    stranger = make_role()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("GRANT EXECUTE ON FUNCTION replaysafe.resolve_action(text, text, text, jsonb, jsonb, "
                     "text, text, timestamptz, integer, text) TO replaysafe_worker")
        conn.execute(f'GRANT CREATE ON SCHEMA replaysafe TO "{stranger}"')
        conn.execute(f'ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO "{stranger}"')
    try:
        out = run("doctor", dsn=dsn).stdout
        assert "EXECUTE on function replaysafe.resolve_action(" in out and ") to replaysafe_worker" in out
        assert f"CREATE on schema replaysafe to {stranger}" in out
        assert (f"FAIL  no default privileges on the schema's objects: ALTER DEFAULT PRIVILEGES: "
                f"postgres grants EXECUTE on new functions in every schema to {stranger}") in out
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM "{stranger}"')
            conn.execute(f'REVOKE ALL ON SCHEMA replaysafe FROM "{stranger}"')
