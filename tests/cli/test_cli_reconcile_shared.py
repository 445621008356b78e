"""``replaysafe-pg reconcile`` without ``--tenant`` is shared machinery (SPEC §4): one
tenant's held rows, backlog, large or unreadable payloads, or an error in its pass never keep
the others' actions unknown. Real transactions hold the rows (a no-op ``late`` report left
open)."""

from __future__ import annotations

import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import Result
from helpers.cli import assert_one_line_error, run, run_json
from helpers.reconcile_rows import held, quickly, state, unknown, unprintable, workers_of

from replaysafe_pg import Ledger
from replaysafe_pg.models import Claim
from replaysafe_pg.reconcile import HELD_NOTE

LOOKUPS = '''
from replaysafe_pg.reconcile import NotFound, Succeeded


def refund(action):
    if str(action.request.get("order", "")).startswith("found"):
        return Succeeded({"refund_id": "re_" + action.action_key})
    return NotFound()


LOOKUPS = {"refund": refund}
'''


@pytest.fixture
def lookups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"rs_shared_lookups_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(LOOKUPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:LOOKUPS"


@pytest.fixture
def worker_of(dsn: str, make_role: Callable[..., str]) -> Callable[[str], str]:
    """A LOGIN role in replaysafe_worker bound to the tenant."""
    return workers_of(dsn, make_role)


def _unknown(led: Ledger, key: str, request: dict[str, Any] | None = None) -> Claim:
    """An unknown action the module's lookups find (its order starts with "found")."""
    return unknown(led, key, request or {"order": f"found_{key}"})


def test_every_tenant_is_settled_while_one_holds_its_rows_and_exit_status_is_1(
        dsn: str, lookups: str, worker_of: Callable[[str], str]) -> None:
    with Ledger(dsn, tenant_id="A") as a, Ledger(dsn, tenant_id="B") as b:
        locked = _unknown(a, "a_locked")
        _unknown(a, "a_free")
        _unknown(b, "b_free")
    with held(dsn, worker_of("A"), "A", locked) as release:
        human: Result = quickly(release, lambda: run("reconcile", "--lookups", lookups, dsn=dsn))
        assert state(dsn, "B", "b_free") == "succeeded"  # settled while A still holds its row
    assert human.exit_code == 1, (human.stdout, human.stderr)  # one stays unknown
    lines = human.stdout.splitlines()
    [row] = [ln for ln in lines if "a_locked" in ln]
    assert row.split()[4] == "skipped" and "skipped: held by another transaction" in row
    assert lines[-1] == ("3 unknown action(s) in 2 tenant(s): skipped 1, succeeded 2")
    assert state(dsn, "A", "a_free") == "succeeded"
    assert state(dsn, "A", "a_locked") == "unknown"


def test_json_says_which_actions_were_skipped_and_why(
        dsn: str, lookups: str, worker_of: Callable[[str], str]) -> None:
    with Ledger(dsn, tenant_id="A") as a, Ledger(dsn, tenant_id="B") as b:
        locked = _unknown(a, "a_locked")
        _unknown(b, "b_free")
    with held(dsn, worker_of("A"), "A", locked) as release:
        report = quickly(release, lambda: run_json("reconcile", "--lookups", lookups, dsn=dsn,
                                                    exit_code=1))
    assert report["summary"] == {"skipped": 1, "succeeded": 1}
    assert [(r["tenant_id"], r["action_key"], r["outcome"], r["note"])
            for r in report["results"]] == [
        ("A", "a_locked", "skipped", HELD_NOTE),
        ("B", "b_free", "succeeded", "reconciled: found at provider, no reference")]
    # Once the holder let go, the next pass settles it: exit 0.
    assert run_json("reconcile", "--lookups", lookups, dsn=dsn)["summary"] == {"succeeded": 1}


def test_one_tenants_backlog_does_not_starve_the_others_within_the_limit(
        dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="big") as big:
        for i in range(10):
            _unknown(big, f"big_{i:02}")  # the oldest
    with Ledger(dsn, tenant_id="t2") as t2, Ledger(dsn, tenant_id="t3") as t3:
        _unknown(t2, "t2_a")
        _unknown(t2, "t2_b")
        _unknown(t3, "t3_a")
    report = run_json("reconcile", "--lookups", lookups, "--limit", "6", dsn=dsn)
    assert report["tenants"] == ["big", "t2", "t3"]
    assert [r["action_key"] for r in report["results"]] == [
        "big_00", "big_01", "big_02", "t2_a", "t2_b", "t3_a"]
    again = run_json("reconcile", "--lookups", lookups, "--limit", "6", dsn=dsn)
    assert [r["action_key"] for r in again["results"]] == [f"big_{i:02}" for i in range(3, 9)]


def test_a_row_that_cannot_be_decoded_is_that_actions_error_and_exits_2(
        dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="A") as a, Ledger(dsn, tenant_id="B") as b:
        _unknown(a, "huge")
        _unknown(a, "a_free")
        _unknown(b, "b_free")
    with psycopg.connect(dsn, autocommit=True) as c:  # jsonb keeps it; Python's json refuses
        c.execute("UPDATE replaysafe.actions SET request = ('{\"order\": \"found\", \"n\": ' || "
                  "repeat('7', 5000) || '}')::jsonb WHERE action_key = 'huge'")
    result = run("reconcile", "--lookups", lookups, dsn=dsn)
    assert_one_line_error(result, "1 action(s) could not be reconciled", "huge",
                          "its row cannot be read: ValueError", "4300 digits")
    assert "error" in next(ln for ln in result.stdout.splitlines() if "huge" in ln)
    assert state(dsn, "A", "a_free") == state(dsn, "B", "b_free") == "succeeded"
    report = run_json("reconcile", "--lookups", lookups, dsn=dsn, exit_code=2)
    [only] = report["results"]
    assert (only["action_key"], only["outcome"]) == ("huge", "error")
    assert only["note"] == only["error"] and "cannot be read" in only["note"]


def test_a_pass_holds_one_pages_requests_before_it_reaches_the_other_tenants(
        dsn: str, lookups: str) -> None:
    blob = "x" * 900_000  # under the 1 MiB payload limit
    with Ledger(dsn, tenant_id="big") as big:
        for i in range(12):
            _unknown(big, f"big_{i:02}", {"order": "missing", "blob": blob})
    with Ledger(dsn, tenant_id="small") as small:
        _unknown(small, "small_1")
    del blob
    tracemalloc.start()
    try:
        started = time.monotonic()
        result = run("--json", "reconcile", "--lookups", lookups, "--not-found", "leave",
                     "--concurrency", "2", dsn=dsn)
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert '"small_1"' in result.stdout and elapsed < 60
    # Two pages' worth at most (text and decoded, ~0.9 MB each), not big's 11 MB.
    assert peak < 8_000_000, peak


def test_a_row_the_server_cannot_return_is_that_actions_error_and_exits_2(
        dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="A") as a, Ledger(dsn, tenant_id="B") as b:
        _unknown(a, "poison")
        _unknown(a, "a_free")
        _unknown(b, "b_free")
    unprintable(dsn, "A", "poison")
    result = run("reconcile", "--lookups", lookups, dsn=dsn)
    assert_one_line_error(result, "1 action(s) could not be reconciled", "poison",
                          "the server cannot return it: SQLSTATE 54000")
    assert "error" in next(ln for ln in result.stdout.splitlines() if "poison" in ln)
    assert state(dsn, "A", "a_free") == state(dsn, "B", "b_free") == "succeeded"
    with psycopg.connect(dsn) as c:  # (get() cannot read it either)
        assert c.execute("SELECT state::text FROM replaysafe.actions WHERE action_key = 'poison'"
                         ).fetchone() == ("unknown",)


def _refuse_settling(dsn: str, tenant: str) -> None:
    """A server error in every settlement of the tenant's (a trigger of the schema owner's)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE FUNCTION public.refuse_settling() RETURNS trigger LANGUAGE plpgsql AS "
                  "$$BEGIN IF NEW.tenant_id = TG_ARGV[0] THEN RAISE EXCEPTION 'refused for the "
                  "test'; END IF; RETURN NEW; END$$")
        c.execute(f"CREATE TRIGGER refuse_settling BEFORE UPDATE ON replaysafe.actions FOR EACH "
                  f"ROW EXECUTE FUNCTION public.refuse_settling('{tenant}')")


def test_an_error_in_one_tenants_pass_is_that_tenants_and_the_others_go_on(
        dsn: str, lookups: str) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        _unknown(a, "a_1")  # the oldest: A goes first
    with Ledger(dsn, tenant_id="B") as b:
        _unknown(b, "b_1")
    _refuse_settling(dsn, "A")
    result = run("reconcile", "--lookups", lookups, dsn=dsn)
    assert_one_line_error(result, "1 tenant(s) stopped on an error", "(first: A: ",
                          "SQLSTATE P0001", "refused for the test")
    lines = result.stdout.splitlines()
    assert lines[-2].startswith("tenant A: stopped on an error, its actions not reached stay "
                                "unknown: RaiseException (SQLSTATE P0001): refused for the test")
    assert lines[-1] == ("1 unknown action(s) in 2 tenant(s): succeeded 1; 1 tenant(s) stopped "
                         "on an error")
    assert state(dsn, "B", "b_1") == "succeeded"
    assert state(dsn, "A", "a_1") == "unknown"
    report = run_json("reconcile", "--lookups", lookups, dsn=dsn, exit_code=2)
    assert report["tenants"] == ["A"]
    assert report["results"] == []
    [error] = report["errors"]
    assert error["tenant_id"] == "A"
    assert error["error"].startswith("RaiseException (SQLSTATE P0001): refused for the test")
