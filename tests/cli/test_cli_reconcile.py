"""``replaysafe-pg reconcile`` and ``replaysafe-pg reopen`` against a real Postgres.

The lookups live in a small module written into tmp_path (put on sys.path): the command
imports it by ``MODULE:ATTR`` like an operator's own code. A lookup answers by the order in
the action's request: ``found_*`` Succeeded, ``missing_*`` NotFound, ``refused_*`` Failed,
``broken_*`` raises. Every question it is asked is appended to ``asked.txt``.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.cli import assert_one_line_error, console_script, run, run_json, script_env
from psycopg import conninfo as pg_conninfo

from replaysafe_pg import Ledger
from replaysafe_pg.cli.reconcile_loop import ReconcileBatch, Stop, reconcile_loop
from replaysafe_pg.reconcile import ReconcileOutcome, Reconciliation

LOOKUPS = '''
import os, pathlib, time
from replaysafe_pg.reconcile import Failed, NotFound, Succeeded

ASKED = pathlib.Path(__file__).with_name("asked.txt")


def refund(action):
    order = action.request["order"]
    with ASKED.open("a") as f:
        f.write(action.action_key + "\\n")
    time.sleep(float(os.environ.get("LOOKUP_SLEEP", "0")))
    if order.startswith("found"):
        return Succeeded({"refund_id": "re_" + order}, provider_reference="re_" + order)
    if order.startswith("missing"):
        return NotFound()
    if order.startswith("refused"):
        return Failed({"code": "charge_disputed"})
    raise TimeoutError("provider timed out")


LOOKUPS = {"refund": refund}
'''


@pytest.fixture
def lookups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``MODULE:LOOKUPS`` of a fresh lookups module (a new name per test: no import cache)."""
    return _module(tmp_path, monkeypatch, LOOKUPS) + ":LOOKUPS"


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> str:
    name = f"rs_lookups_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _asked(tmp_path: Path) -> list[str]:
    path = tmp_path / "asked.txt"
    return path.read_text().split() if path.exists() else []


def _unknown(led: Ledger, key: str, order: str | None = None, operation: str = "refund") -> None:
    """An action whose outcome was lost: claimed, then marked unknown."""
    claim = led.claim(key, operation, {"order": order or key})
    led.mark_unknown(claim, {"reason": "timeout"})


def _failed(led: Ledger, key: str) -> None:
    claim = led.claim(key, "refund", {"order": key})
    led.fail(claim, {"code": "card_declined"})


def _state(dsn: str, tenant: str, key: str) -> str:
    with Ledger(dsn, tenant_id=tenant) as led:
        action = led.get(key)
    assert action is not None
    return action.state.value


def _as(dsn: str, role: str) -> str:
    return pg_conninfo.make_conninfo(dsn, user=role)


def _bind(dsn: str, role: str, tenant: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT replaysafe.bind_role_to_tenant(p_role => %s, p_tenant_id => %s)",
                     (role, tenant))


# --- reconcile: outcomes and exit status ------------------------------------------------------

def test_reconcile_settles_every_answer_and_exits_0(dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for key in ("found_1", "missing_1", "refused_1"):
            _unknown(led, key)
    result = run("reconcile", "--lookups", lookups, dsn=dsn)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    out = result.stdout
    assert out.splitlines()[0].split() == ["TENANT_ID", "ACTION_KEY", "OPERATION", "ATTEMPT",
                                           "OUTCOME", "PROVIDER_REFERENCE", "NOTE"]
    assert "reconciled: found at provider, reference re_found_1" in out
    assert "reconciled: not found at provider, will run again with the same idempotency key" in out
    assert "reconciled: refused at provider" in out
    assert out.splitlines()[-1] == ("3 unknown action(s) in 1 tenant(s): succeeded 1, "
                                    "retryable 1, failed 1")
    assert result.stderr == ""
    with Ledger(dsn, tenant_id="t1") as led:
        found = led.get("found_1")
        assert found is not None
        assert (found.state.value, found.result, found.provider_reference) == (
            "succeeded", {"refund_id": "re_found_1"}, "re_found_1")
        assert found.resolution_note == "reconciled: found at provider, reference re_found_1"
        # The attempt history is untouched: an audit tells a reconciled success from a
        # recorded one.
        assert [a.outcome for a in led.attempts("found_1")] == ["unknown"]
    assert _state(dsn, "t1", "missing_1") == "retryable"
    assert _state(dsn, "t1", "refused_1") == "failed"
    again = run("reconcile", "--lookups", lookups, dsn=dsn)
    assert (again.exit_code, again.stdout.strip()) == (0, "no unknown actions to reconcile")


def test_not_found_leave_keeps_the_action_unknown_and_exits_1(dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "missing_1")
        _unknown(led, "found_1")
    result = run("reconcile", "--lookups", lookups, "--not-found", "leave", dsn=dsn)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert "left_unknown" in result.stdout and "not found at provider: left unknown" in result.stdout
    assert _state(dsn, "t1", "missing_1") == "unknown"
    assert _state(dsn, "t1", "found_1") == "succeeded"
    retry = run("reconcile", "--lookups", lookups, "--not-found", "retry", dsn=dsn)
    assert retry.exit_code == 0
    assert _state(dsn, "t1", "missing_1") == "retryable"


def test_a_lookup_that_raises_writes_nothing_and_exits_2(dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "broken_1")
        _unknown(led, "found_1")
    result = run("reconcile", "--lookups", lookups, dsn=dsn)
    # The report is printed; the error is one line on stderr.
    assert "the lookup raised TimeoutError" in result.stdout
    assert_one_line_error(result, "1 lookup(s) failed", "broken_1", "TimeoutError")
    assert _state(dsn, "t1", "broken_1") == "unknown"
    assert _state(dsn, "t1", "found_1") == "succeeded"


def test_operations_without_a_lookup_are_skipped_and_do_not_count(dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "charge_1", operation="charge")
        _unknown(led, "found_1")
    report = run_json("reconcile", "--lookups", lookups, dsn=dsn)
    assert {r["action_key"]: r["outcome"] for r in report["results"]} == {
        "charge_1": "skipped", "found_1": "succeeded"}
    assert _state(dsn, "t1", "charge_1") == "unknown"


def test_dry_run_asks_the_provider_and_writes_nothing(dsn: str, lookups: str,
                                                      tmp_path: Path) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for key in ("found_1", "missing_1", "refused_1"):
            _unknown(led, key)
    report = run_json("reconcile", "--lookups", lookups, "--dry-run", dsn=dsn)
    assert report["dry_run"] is True
    assert {r["action_key"]: (r["outcome"], r["dry_run"]) for r in report["results"]} == {
        "found_1": ("succeeded", True), "missing_1": ("retryable", True),
        "refused_1": ("failed", True)}
    assert sorted(_asked(tmp_path)) == ["found_1", "missing_1", "refused_1"]
    for key in ("found_1", "missing_1", "refused_1"):
        assert _state(dsn, "t1", key) == "unknown"
    human = run("reconcile", "--lookups", lookups, "--dry-run", dsn=dsn)
    assert human.exit_code == 0
    assert human.stdout.splitlines()[-1].startswith("dry run, nothing written: 3 unknown action(s)")


def test_json_output_shape(dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "found_1")
        _unknown(led, "missing_1")
    report = run_json("reconcile", "--lookups", lookups, "--not-found", "leave", dsn=dsn,
                      exit_code=1)
    assert set(report) == {"dry_run", "tenants", "summary", "results"}
    assert report["tenants"] == ["t1"]
    assert report["summary"] == {"succeeded": 1, "left_unknown": 1}
    assert report["results"][0] == {
        "tenant_id": "t1", "action_key": "found_1", "operation": "refund",
        "outcome": "succeeded", "provider_reference": "re_found_1",
        "note": "reconciled: found at provider, reference re_found_1", "attempt": 1,
        "error": None, "dry_run": False}
    assert report["results"][1]["outcome"] == "left_unknown"


def test_tenant_option_and_every_tenant_by_default(dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="t1") as t1, Ledger(dsn, tenant_id="t2") as t2:
        _unknown(t1, "found_1")
        _unknown(t2, "found_2")
        _unknown(t2, "found_3")
    only_t2 = run_json("reconcile", "--lookups", lookups, "--tenant", "t2", dsn=dsn)
    assert only_t2["tenants"] == ["t2"]
    assert [r["action_key"] for r in only_t2["results"]] == ["found_2", "found_3"]
    assert _state(dsn, "t1", "found_1") == "unknown"
    with Ledger(dsn, tenant_id="t2") as t2:
        _unknown(t2, "found_4")
    everyone = run_json("reconcile", "--lookups", lookups, dsn=dsn)
    assert everyone["tenants"] == ["t1", "t2"]
    assert {(r["tenant_id"], r["action_key"]) for r in everyone["results"]} == {
        ("t1", "found_1"), ("t2", "found_4")}


def test_limit_and_older_than(dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="t1") as t1, Ledger(dsn, tenant_id="t2") as t2:
        _unknown(t1, "found_1")
        _unknown(t1, "found_2")
        _unknown(t2, "found_3")
    assert run_json("reconcile", "--lookups", lookups, "--older-than", "1h",
                    dsn=dsn)["results"] == []
    first = run_json("reconcile", "--lookups", lookups, "--limit", "2", dsn=dsn)
    # Over tenants, round-robin: each tenant's oldest, not t1's backlog first.
    assert [r["action_key"] for r in first["results"]] == ["found_1", "found_3"]
    second = run_json("reconcile", "--lookups", lookups, "--limit", "2", dsn=dsn)
    assert [r["action_key"] for r in second["results"]] == ["found_2"]


def test_a_second_reconciler_finds_the_action_already_resolved(
        dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup settles the action itself, as a reconciler running at the same moment
    would: ours reports already_resolved and writes nothing over it."""
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "k")
    module = _module(tmp_path, monkeypatch, f'''
from replaysafe_pg import Ledger
from replaysafe_pg.reconcile import Succeeded

def lookup(action):
    with Ledger({dsn!r}, tenant_id=action.tenant_id) as other:
        other.resolve(action.action_key, "succeeded", result={{"by": "the other"}},
                      expected_attempt=action.attempt, note="the other reconciler")
    return Succeeded({{"by": "us"}}, provider_reference="re_1")

LOOKUPS = {{"refund": lookup}}
''')
    report = run_json("reconcile", "--lookups", f"{module}:LOOKUPS", dsn=dsn)
    assert [r["outcome"] for r in report["results"]] == ["already_resolved"]
    with Ledger(dsn, tenant_id="t1") as led:
        action = led.get("k")
    assert action is not None
    assert (action.result, action.resolution_note) == ({"by": "the other"}, "the other reconciler")


def test_progress_bar_on_a_long_batch_on_stderr_not_with_json(dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for i in range(25):
            _unknown(led, f"found_{i:02d}")
    human = run("reconcile", "--lookups", lookups, "--dry-run", dsn=dsn)
    assert human.exit_code == 0
    assert "reconciling" in human.stderr
    quiet = run("--json", "reconcile", "--lookups", lookups, "--dry-run", dsn=dsn)
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert len(json.loads(quiet.stdout)["results"]) == 25


def test_control_characters_in_keys_and_notes_are_escaped(dsn: str, lookups: str) -> None:
    evil = "found_\x1b[31mRED\r"
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, evil)
    result = run("reconcile", "--lookups", lookups, dsn=dsn)
    assert result.exit_code == 0
    assert "found_\\x1b[31mRED\\r" in result.stdout
    assert "\x1b" not in result.stdout and "\r" not in result.stdout


# --- reconcile: loading the lookups -----------------------------------------------------------

@pytest.mark.parametrize(("body", "spec", "fragment"), [
    (None, "no_colon_here", "--lookups must be MODULE:ATTR"),
    (None, "rs_no_such_module_xyz:LOOKUPS", "cannot import rs_no_such_module_xyz: ModuleNotFoundError"),
    ("LOOKUPS = {}", "{m}:NOPE", "has no attribute NOPE"),
    ("LOOKUPS = [print]", "{m}:LOOKUPS", "is a list, not a mapping of operation name to lookup"),
    ("LOOKUPS = {'refund': 42}", "{m}:LOOKUPS", "'refund' maps to a int"),
    ("LOOKUPS = {}", "{m}:LOOKUPS", "maps no operation"),
    ("raise RuntimeError('boom at import')", "{m}:LOOKUPS", "RuntimeError: boom at import"),
])
def test_bad_lookups_are_one_line_errors(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         body: str | None, spec: str, fragment: str) -> None:
    module = _module(tmp_path, monkeypatch, body) if body is not None else ""
    assert_one_line_error(run("reconcile", "--lookups", spec.format(m=module), dsn=dsn), fragment)


# --- reconcile: roles --------------------------------------------------------------------------

def test_a_worker_is_told_reconciling_is_the_operators_duty(dsn: str, lookups: str,
                                                             make_role: Any) -> None:
    worker = make_role("replaysafe_worker")
    _bind(dsn, worker, "t1")
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "found_1")
    denied = run("reconcile", "--lookups", lookups, dsn=_as(dsn, worker))
    assert_one_line_error(denied, "access denied: reconciling is replaysafe_operator's duty",
                          worker)
    assert _state(dsn, "t1", "found_1") == "unknown"
    # A dry run writes nothing: a worker may see what reconciling would do.
    dry = run_json("reconcile", "--lookups", lookups, "--dry-run", dsn=_as(dsn, worker))
    assert [r["outcome"] for r in dry["results"]] == ["succeeded"]


def test_an_operator_reconciles_its_own_tenant(dsn: str, lookups: str, make_role: Any) -> None:
    operator = make_role("replaysafe_operator")
    _bind(dsn, operator, "t1")
    with Ledger(dsn, tenant_id="t1") as t1, Ledger(dsn, tenant_id="t2") as t2:
        _unknown(t1, "found_1")
        _unknown(t2, "found_2")
    report = run_json("reconcile", "--lookups", lookups, dsn=_as(dsn, operator))
    assert [(r["tenant_id"], r["outcome"]) for r in report["results"]] == [("t1", "succeeded")]
    assert _state(dsn, "t1", "found_1") == "succeeded"
    assert _state(dsn, "t2", "found_2") == "unknown"  # not its tenant: not even seen
    other = run_json("reconcile", "--lookups", lookups, "--tenant", "t2", dsn=_as(dsn, operator))
    assert other["results"] == []


# --- reconcile --loop ---------------------------------------------------------------------------

def _batch(outcome: ReconcileOutcome) -> ReconcileBatch:
    r = Reconciliation(tenant_id="t", action_key="k", operation="op", outcome=outcome,
                       provider_reference=None, note=None, attempt=1)
    return ReconcileBatch(["t"], [r], dry_run=False)


def test_loop_finishes_the_batch_under_way_when_stopped() -> None:
    stop = Stop()
    started, release = threading.Event(), threading.Event()
    batches: list[ReconcileBatch] = []
    outcomes = iter([ReconcileOutcome.SUCCEEDED, ReconcileOutcome.LEFT_UNKNOWN])

    def batch() -> ReconcileBatch:
        outcome = next(outcomes)
        if outcome is ReconcileOutcome.LEFT_UNKNOWN:
            started.set()
            release.wait(5)  # the stop request arrives while this batch runs
        return _batch(outcome)

    result: list[ReconcileBatch] = []
    runner = threading.Thread(target=lambda: result.append(reconcile_loop(
        batch, interval=0.05, stop=stop, report=batches.append)))
    runner.start()
    assert started.wait(5)
    stop.request()
    release.set()
    runner.join(5)
    assert not runner.is_alive()
    assert [b.results[0].outcome for b in batches] == ["succeeded", "left_unknown"]
    assert result[0].exit_code == 1  # by the last batch


def test_loop_wakes_from_its_pause_when_stopped() -> None:
    stop = Stop()
    threading.Timer(0.2, stop.request).start()
    started = time.monotonic()
    last = reconcile_loop(lambda: _batch(ReconcileOutcome.SUCCEEDED), interval=60, stop=stop,
                          report=lambda _b: None)
    assert time.monotonic() - started < 5
    assert last.exit_code == 0


def _start_loop(dsn: str, tmp_path: Path, *args: str, sleep: str = "0") -> subprocess.Popen[str]:
    env = script_env(LOOKUP_SLEEP=sleep)
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    return subprocess.Popen([console_script(), "--dsn", dsn, "reconcile", *args, "--loop",
                             "--interval", "0.2s"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_loop_stops_on_sigterm_after_finishing_its_batch(dsn: str, lookups: str,
                                                         tmp_path: Path) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "found_1")
    proc = _start_loop(dsn, tmp_path, "--lookups", lookups, sleep="1")
    try:
        _wait_for(lambda: _asked(tmp_path) == ["found_1"])  # the lookup is under way
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    assert "Traceback" not in err
    assert "succeeded" in out and "1 unknown action(s) in 1 tenant(s): succeeded 1" in out
    assert _state(dsn, "t1", "found_1") == "succeeded"  # the batch was finished


def test_loop_json_lines_and_exit_status_of_the_last_batch(dsn: str, lookups: str,
                                                          tmp_path: Path) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _unknown(led, "missing_1")
    proc = _start_loop(dsn, tmp_path, "--json", "--lookups", lookups, "--not-found", "leave")
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["summary"] == {"left_unknown": 1}
        assert re.match(r"\d{4}-\d\d-\d\dT", first["at"])
        second = json.loads(proc.stdout.readline())  # every batch, one line each
        assert second["summary"] == {"left_unknown": 1}
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1


# --- reopen -------------------------------------------------------------------------------------

def test_reopen_a_failed_action_keeps_the_note_shown_by_actions_show(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _failed(led, "k")
    result = run("reopen", "k", "--tenant", "t1", "--note", "bug #12 fixed, refund again", dsn=dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "reopened k (tenant t1): failed -> retryable"
    shown = run("actions", "show", "k", "--tenant", "t1", dsn=dsn).stdout
    assert re.search(r"^state +retryable$", shown, re.M)
    assert re.search(r"^resolution note +bug #12 fixed, refund again$", shown, re.M)
    assert re.search(r"^resolved at +\d{4}-\d\d-\d\d ", shown, re.M)
    data = run_json("actions", "show", "k", "--tenant", "t1", dsn=dsn)
    assert data["action"]["resolution_note"] == "bug #12 fixed, refund again"
    assert data["action"]["resolved_at"] is not None


def test_reopen_json(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _failed(led, "k")
    assert run_json("reopen", "k", "--tenant", "t1", "--note", "why", dsn=dsn) == {
        "tenant_id": "t1", "action_key": "k", "state": "retryable", "note": "why"}


def test_reopen_errors_are_one_line(dsn: str, make_role: Any) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        c = led.claim("done", "refund", {"order": 1})
        led.complete(c, {"ok": True})
        _failed(led, "failed")
    assert_one_line_error(run("reopen", "done", "--tenant", "t1", "--note", "n", dsn=dsn),
                          "InvalidTransition", "action done is succeeded; only failed actions "
                                               "can be reopened")
    assert_one_line_error(run("reopen", "failed", "--tenant", "t1", "--note", "", dsn=dsn),
                          "--note must say why the action may run again")
    assert_one_line_error(run("reopen", "failed", "--tenant", "t1", "--note", "  ", dsn=dsn),
                          "--note must say why")
    assert_one_line_error(run("reopen", "nope", "--tenant", "t1", "--note", "n", dsn=dsn),
                          "no action nope for tenant t1")
    missing_note = run("reopen", "failed", "--tenant", "t1", dsn=dsn)
    assert missing_note.exit_code == 2 and "--note" in missing_note.stderr
    worker = make_role("replaysafe_worker")
    _bind(dsn, worker, "t1")
    assert_one_line_error(run("reopen", "failed", "--tenant", "t1", "--note", "n",
                              dsn=_as(dsn, worker)),
                          "access denied: reopening is replaysafe_operator's duty", worker)
    assert _state(dsn, "t1", "failed") == "failed"


def test_reopen_escapes_control_characters(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        _failed(led, "k\x1b[2J")
    result = run("reopen", "k\x1b[2J", "--tenant", "t1", "--note", "n\x1b[8m", dsn=dsn)
    assert result.exit_code == 0
    assert result.stdout.strip() == "reopened k\\x1b[2J (tenant t1): failed -> retryable"
    shown = run("actions", "show", "k\x1b[2J", "--tenant", "t1", dsn=dsn).stdout
    assert "n\\x1b[8m" in shown and "\x1b" not in shown


def test_human_report_of_a_batch_says_already_resolved_wrote_nothing_and_stamps_loop_passes(
        ) -> None:
    from datetime import UTC, datetime

    text = _batch(ReconcileOutcome.ALREADY_RESOLVED).human(datetime(2026, 1, 5, 10, 0, tzinfo=UTC))
    assert "settled by someone else since the lookup: nothing written" in text
    assert text.splitlines()[-1] == ("2026-01-05 10:00:00+0000: 1 unknown action(s) in "
                                     "1 tenant(s): already_resolved 1")
    assert ReconcileBatch([], [], dry_run=False).human() == "no unknown actions to reconcile"
