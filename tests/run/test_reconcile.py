"""Reconciliation (docs/reconcile.md): unknown actions settled by asking the provider, through
resolve_action with the attempt the lookup saw; reopen of a failed action. Against a real
HTTP provider on 127.0.0.1 with a lookup endpoint, and real worker processes killed in the
crash windows."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers.db import bind, connect_as
from helpers.run import Provider, Worker, action_row, attempt_rows, charge_tool

from replaysafe_pg import AccessDenied, AsyncLedger, InvalidArgument, InvalidTransition, Ledger
from replaysafe_pg.models import Action
from replaysafe_pg.reconcile import Failed, NotFound, ReconcileOutcome, Succeeded

LEASE = 1.0



def provider_lookup(url: str) -> Callable[[Action], Succeeded | NotFound]:
    """The lookup of a Stripe-like API: the charge made under the action's idempotency key."""
    def lookup(action: Action) -> Succeeded | NotFound:
        try:
            with urllib.request.urlopen(f"{url}?idempotency_key={action.idempotency_key}",
                                        timeout=10) as resp:
                charge: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return NotFound()
            raise
        return Succeeded(result=charge, provider_reference=charge["charge_id"])
    return lookup


def unknown(led: Ledger, key: str, operation: str = "charge") -> None:
    c = led.claim(key, operation, {"amount": 500})
    led.mark_unknown(c, {"reason": "timeout"})


# --- the crash windows, then the reconciler ---------------------------------------------------

def test_every_crash_window_ends_reconciled_with_exactly_one_effect(
        dsn: str, provider: Provider) -> None:
    """A worker is killed before it sends the charge, or after the provider charged but before
    the record: under the default policy both end unknown; the reconciler asks the provider by
    the idempotency key; a run afterwards replays the charge or sends it, with the same key."""
    common = {"mode": "charge", "dsn": dsn, "url": provider.url, "lease": LEASE}
    windows = ("before_send", "after_send")
    owners = {w: Worker(**common, key=w, worker="owner", on_expired="unknown", stop=w)
              for w in windows}
    try:
        for window, owner in owners.items():
            owner.expect(f"STOP {window}")
            owner.kill()
    finally:
        for w in owners.values():
            w.close()
    time.sleep(LEASE + 0.2)
    with Ledger(dsn, tenant_id="t1", worker_id="ops") as led:
        assert led.sweep() == 2
        results = {r.action_key: r for r in led.reconcile({"charge": provider_lookup(provider.url)})}
        assert {k: r.outcome for k, r in results.items()} == {
            "before_send": ReconcileOutcome.RETRYABLE, "after_send": ReconcileOutcome.SUCCEEDED}
        idem = {w: led.get(w).idempotency_key for w in windows}  # type: ignore[union-attr]
        charged = provider.responses[idem["after_send"]]
        assert results["after_send"].provider_reference == charged["charge_id"]

        after = {w: led.run("charge", charge_tool(provider.url), {"amount": 500}, key=w, lease=5)
                 for w in windows}
    assert after["after_send"].replay and after["after_send"].result == charged
    assert not after["before_send"].replay and after["before_send"].status == "succeeded"
    for w in windows:  # exactly one effect, under the one key every attempt carried
        assert provider.effects.get(idem[w]) == 1, w
    row = action_row(dsn, "after_send")
    assert (row["state"], row["provider_reference"]) == ("succeeded", charged["charge_id"])
    assert row["resolution_note"] == f"reconciled: found at provider, reference {charged['charge_id']}"
    # The history is untouched: an audit tells the reconciled success from a recorded one.
    assert [a["outcome"] for a in attempt_rows(dsn, "after_send")] == ["unknown"]
    assert [a["outcome"] for a in attempt_rows(dsn, "before_send")] == ["unknown", "succeeded"]
    assert action_row(dsn, "before_send")["attempt"] == 2


# --- the rules -----------------------------------------------------------------------------------

def test_outcomes_notes_and_what_is_written(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for key in ("found", "gone", "refused", "broken", "odd", "unstorable"):
            unknown(led, key)
        unknown(led, "no-lookup", operation="email")

        def lookup(action: Action) -> Any:
            if action.action_key == "broken":
                raise ConnectionError("provider down")
            return {"found": Succeeded({"id": "re_1"}, "re_1"), "gone": NotFound(),
                    "refused": Failed({"code": "card_declined"}), "odd": "yes",
                    "unstorable": Succeeded({"at": object()})}[action.action_key]

        before = [led.get(k) for k in ("found", "gone", "refused", "broken", "odd", "no-lookup")]
        dry = {r.action_key: r.outcome for r in led.reconcile({"charge": lookup}, dry_run=True)}
        assert [led.get(k) for k in ("found", "gone", "refused", "broken", "odd", "no-lookup")] == before
        results = {r.action_key: r for r in led.reconcile({"charge": lookup})}
        assert {k: r.outcome for k, r in results.items()} == dry == {
            "found": "succeeded", "gone": "retryable", "refused": "failed", "broken": "error",
            "odd": "error", "unstorable": "error", "no-lookup": "skipped"}
        assert "ConnectionError: 'provider down'" in (results["broken"].error or "")
        states = {k: (a.state, a.resolution_note) for k in results if (a := led.get(k))}
    assert states == {
        "found": ("succeeded", "reconciled: found at provider, reference re_1"),
        "gone": ("retryable", "reconciled: not found at provider, will run again with the same "
                              "idempotency key"),
        "refused": ("failed", "reconciled: refused at provider"),
        "broken": ("unknown", None), "odd": ("unknown", None), "unstorable": ("unknown", None),
        "no-lookup": ("unknown", None)}


def test_not_found_leave_limit_and_older_than(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for i in range(5):
            unknown(led, f"k{i}")
        assert led.reconcile({"charge": lambda a: NotFound()}, older_than=3600) == []
        left = led.reconcile({"charge": lambda a: NotFound()}, not_found="leave", limit=3)
        assert [(r.action_key, r.outcome) for r in left] == [
            ("k0", "left_unknown"), ("k1", "left_unknown"), ("k2", "left_unknown")]  # oldest first
        assert all(led.get(f"k{i}").state == "unknown" for i in range(5))  # type: ignore[union-attr]
        with pytest.raises(InvalidArgument):
            led.reconcile({"charge": lambda a: NotFound()}, not_found="maybe")


def test_a_stale_lookup_never_settles_a_newer_attempt(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led, Ledger(dsn, tenant_id="t1") as other:
        unknown(led, "k")

        def lookup(action: Action) -> Succeeded:
            # Meanwhile an operator settled it as retryable and a worker claimed attempt 2.
            other.resolve("k", "retryable", error={"by": "hand"})
            assert other.claim("k", "charge", {"amount": 500}).attempt == 2
            return Succeeded({"stale": True})

        [result] = led.reconcile({"charge": lookup})
        assert result.outcome == "already_resolved"
        action = led.get("k")
    assert action is not None and (action.state, action.attempt, action.result) == ("running", 2, None)


def test_two_reconcilers_at_once_settle_each_action_once(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for i in range(40):
            unknown(led, f"k{i:02}")
    calls: list[str] = []

    def slow(action: Action) -> Succeeded:
        calls.append(action.action_key)
        time.sleep(0.01)
        return Succeeded({"k": action.action_key})

    out: list[list[Any]] = [[], []]

    def reconciler(i: int) -> None:
        with Ledger(dsn, tenant_id="t1", worker_id=f"rec-{i}") as led:
            out[i] = led.reconcile({"charge": slow}, limit=100, concurrency=4)

    threads = [threading.Thread(target=reconciler, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    settled = [r.action_key for rs in out for r in rs if r.outcome == "succeeded"]
    assert sorted(settled) == [f"k{i:02}" for i in range(40)]  # each once, by one of them
    # Each action asked about at least once, at most by both: one the other had settled by the
    # time its page was read is reported already_resolved without asking the provider.
    assert 40 <= len(calls) <= 80 and set(calls) == set(settled)
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM replaysafe.actions WHERE state = 'succeeded'"
                         ).fetchone() == (40,)


def _reconcile_in_process(dsn: str, barrier: Any, out: Any) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        barrier.wait(30)
        results = led.reconcile({"charge": lambda a: Succeeded({"pid": 1})}, limit=100)
        out.put(sorted(r.action_key for r in results if r.outcome == "succeeded"))


def test_two_reconciler_processes_settle_each_action_once(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for i in range(30):
            unknown(led, f"k{i:02}")
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_reconcile_in_process, args=(dsn, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    settled = out.get(timeout=60) + out.get(timeout=60)
    for p in procs:
        p.join(30)
    assert sorted(settled) == [f"k{i:02}" for i in range(30)]


def test_tenants_never_cross(dsn: str, make_role: Callable[..., str]) -> None:
    with Ledger(dsn, tenant_id="A") as a, Ledger(dsn, tenant_id="B") as b:
        unknown(a, "k")
        unknown(b, "k")
    operator = make_role("replaysafe_operator")
    bind(dsn, operator, "A")
    seen: list[str] = []
    with connect_as(dsn, operator) as conn, Ledger(conn, tenant_id="A") as led:
        results = led.reconcile({"charge": lambda act: seen.append(act.tenant_id) or NotFound()})
    assert seen == ["A"] and [r.tenant_id for r in results] == ["A"]
    with Ledger(dsn, tenant_id="B") as b:
        assert b.get("k").state == "unknown"  # type: ignore[union-attr]
    with connect_as(dsn, operator) as conn, Ledger(conn, tenant_id="B") as led, \
            pytest.raises(AccessDenied):
        led.reopen("k", note="not mine")


def test_reconciling_is_an_operators_duty(dsn: str, make_role: Callable[..., str]) -> None:
    with Ledger(dsn, tenant_id="A") as a:
        unknown(a, "k")
    worker = make_role("replaysafe_worker")
    bind(dsn, worker, "A")
    with connect_as(dsn, worker) as conn, Ledger(conn, tenant_id="A") as led:
        assert [r.outcome for r in led.reconcile({"charge": lambda act: NotFound()},
                                                 dry_run=True)] == ["retryable"]  # reads only
        with pytest.raises(AccessDenied):
            led.reconcile({"charge": lambda act: NotFound()})
    with Ledger(dsn, tenant_id="A") as a:
        assert a.get("k").state == "unknown"  # type: ignore[union-attr]


def test_async_lookups_are_awaited_overlapping_and_bounded(dsn: str) -> None:
    with Ledger(dsn, tenant_id="t1") as led:
        for i in range(12):
            unknown(led, f"k{i:02}")
    in_flight, peak = 0, 0

    async def lookup(action: Action) -> Succeeded:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return Succeeded({"k": action.action_key})

    async def main() -> list[Any]:
        async with AsyncLedger(dsn, tenant_id="t1") as led:
            return await led.reconcile({"charge": lookup}, concurrency=3)

    results = asyncio.run(main())
    assert [r.outcome for r in results] == ["succeeded"] * 12
    assert peak == 3  # overlapping, never more than the bound


# --- reopen --------------------------------------------------------------------------------------

def test_reopen_lets_a_failed_action_run_again(dsn: str) -> None:
    ran: list[int] = []

    def tool(amount: int) -> dict[str, int]:
        ran.append(amount)
        if len(ran) == 1:
            raise ValueError("bug: wrong currency")  # recorded as a permanent failure
        return {"amount": amount}

    with Ledger(dsn, tenant_id="t1") as led:
        first = led.run("charge", tool, {"amount": 5}, key="k")
        assert first.status == "failed"
        assert led.run("charge", tool, {"amount": 5}, key="k").replay  # failed stays failed
        with pytest.raises(InvalidArgument):
            led.reopen("k", note="")
        assert led.reopen("k", note="fixed the currency bug") == "retryable"
        action = led.get("k")
        assert action is not None and action.state == "retryable"
        assert action.resolution_note == "fixed the currency bug" and action.resolved_at is not None
        with pytest.raises(InvalidTransition):
            led.reopen("k", note="again")  # retryable, not failed
        again = led.run("charge", tool, {"amount": 5}, key="k")
        assert (again.status, again.replay, again.attempt, again.result) == (
            "succeeded", False, 2, {"amount": 5})
        with pytest.raises(InvalidTransition):
            led.reopen("k", note="succeeded now")
        with pytest.raises(InvalidTransition):
            led.reopen("nope", note="absent")
    assert ran == [5, 5]
