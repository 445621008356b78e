"""Crash windows: worker processes SIGKILLed (or SIGSTOPped) at chosen points, a second
worker (its own Ledger and connections) resuming the same call, against a real HTTP
payment provider on 127.0.0.1."""

from __future__ import annotations

import signal
import threading
from typing import Any

from helpers.db import derived_key
from helpers.run import (
    Provider,
    Worker,
    action_row,
    attempt_rows,
    charge_tool,
    count_effects,
    execution_json,
    make_effects_table,
)

from replaysafe_pg import Ledger

WINDOWS = ("before_send", "after_send", "after_record")
POLICIES = ("unknown", "reclaim")
LEASE = 1.0



def test_crash_windows_times_policies(dsn: str, provider: Provider) -> None:
    cases = [(w, p) for w in WINDOWS for p in POLICIES]
    common = {"mode": "charge", "dsn": dsn, "url": provider.url, "lease": LEASE}
    owners = {c: Worker(**common, key=f"{c[0]}:{c[1]}", worker="owner", on_expired=c[1], stop=c[0])
              for c in cases}
    try:
        for (window, _), owner in owners.items():
            owner.expect(f"STOP {window}")
            owner.kill()
    finally:
        for w in owners.values():
            w.close()

    # The resuming workers: one Ledger (own connections, own worker id) per case, at once.
    got: dict[tuple[str, str], dict[str, Any]] = {}

    def resume(case: tuple[str, str]) -> None:
        with Ledger(dsn, tenant_id="t1", worker_id=f"resumer-{case[0]}-{case[1]}") as led:
            got[case] = execution_json(led.run(
                "charge", charge_tool(provider.url), {"amount": 500}, key=f"{case[0]}:{case[1]}",
                lease=LEASE, on_expired=case[1], wait_timeout=20))

    threads = [threading.Thread(target=resume, args=(c,)) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(got) == sorted(cases)

    table = []
    for (window, policy), ex in got.items():
        key = f"{window}:{policy}"
        idem = derived_key(dsn, "t1", key)
        row = action_row(dsn, key)
        table.append((window, policy, row["state"], row["attempt"], provider.requests.get(idem, 0),
                      provider.effects.get(idem, 0), ex["status"], ex["replay"]))
    print("\nwindow        policy   final      attempts requests effects resumer got")
    for t in table:
        print(f"{t[0]:<13} {t[1]:<8} {t[2]:<10} {t[3]:>8} {t[4]:>8} {t[5]:>7} "
              f"{t[6]} (replay={t[7]})")

    expected = {
        # window, policy: final state, attempts, provider requests, effects, resumer status, replay
        ("before_send", "unknown"): ("unknown", 1, 0, 0, "unknown", True),
        ("before_send", "reclaim"): ("succeeded", 2, 1, 1, "succeeded", False),
        ("after_send", "unknown"): ("unknown", 1, 1, 1, "unknown", True),
        ("after_send", "reclaim"): ("succeeded", 2, 2, 1, "succeeded", False),
        ("after_record", "unknown"): ("succeeded", 1, 1, 1, "succeeded", True),
        ("after_record", "reclaim"): ("succeeded", 1, 1, 1, "succeeded", True),
    }
    assert {(t[0], t[1]): t[2:] for t in table} == expected
    # The resumer of window 2 under "reclaim" re-sent the same key: the provider answered
    # with the first charge, so the ledger holds the charge that really happened.
    idem = derived_key(dsn, "t1", "after_send:reclaim")
    assert got[("after_send", "reclaim")]["result"] == provider.responses[idem]


def test_a_paused_owner_cannot_overwrite_the_reclaimers_result(dsn: str) -> None:
    """SIGSTOP the owner past its lease; a reclaimer runs and records; after SIGCONT the
    owner's report is superseded (fencing by attempt number)."""
    owner = Worker(mode="fencing", dsn=dsn, key="f", worker="owner", lease=0.6, hold=1.0)
    try:
        owner.expect("STARTED")
        owner.signal(signal.SIGSTOP)
        with Ledger(dsn, tenant_id="t1", worker_id="reclaimer") as led:
            # Waits (LISTEN) until the paused owner's lease runs out, then claims attempt 2.
            ex = led.run("fenced", lambda: {"by": "reclaimer"}, {}, key="f", lease=5,
                         on_expired="reclaim", wait_timeout=10)
        assert (ex.status, ex.attempt, ex.replay, ex.outcome) == ("succeeded", 2, False, "recorded")
        owner.signal(signal.SIGCONT)
        mine = owner.execution()
    finally:
        owner.close()
    assert (mine["status"], mine["attempt"], mine["outcome"], mine["lease_lost"]) == (
        "succeeded", 1, "superseded", True)
    row = action_row(dsn, "f")
    assert (row["state"], row["attempt"], row["result"]) == ("succeeded", 2, {"by": "reclaimer"})
    first, second = attempt_rows(dsn, "f")
    assert (first["outcome"], first["superseded"]) == ("succeeded", True)
    assert (second["outcome"], second["superseded"]) == ("succeeded", False)


def test_run_many_siblings_that_finished_are_replayed_after_a_crash(dsn: str) -> None:
    make_effects_table(dsn)
    worker = Worker(mode="many", dsn=dsn, worker="crashy", lease=LEASE)
    try:
        worker.expect("STOP slow")  # m:a and m:c are recorded, m:b is running
        worker.kill()
    finally:
        worker.close()
    ran: list[str] = []

    def again(name: str) -> Any:
        ran.append(name)
        return {"done": name}

    with Ledger(dsn, tenant_id="t1", worker_id="resumer") as led:
        out = led.run_many([("tool", again, {"name": k}, k) for k in ("m:a", "m:b", "m:c")],
                           lease=LEASE)
    assert [(e.status, e.replay) for e in out] == [
        ("succeeded", True), ("unknown", True), ("succeeded", True)]
    assert [e.result for e in out] == [{"done": "m:a"}, None, {"done": "m:c"}]
    assert ran == []
    assert [count_effects(dsn, k) for k in ("m:a", "m:b", "m:c")] == [1, 1, 1]
