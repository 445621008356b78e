"""Retry storms and waiters: many real callers (threads, processes) on one action."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from helpers.run import Worker, action_row, add_effect, attempt_rows, count_effects, make_effects_table

from replaysafe_pg import Execution, Ledger


def effectful(dsn: str, key: str, hold: float = 0.0) -> Any:
    def tool(n: int) -> dict[str, Any]:
        add_effect(dsn, key)
        time.sleep(hold)
        return {"n": n, "at": time.time()}
    return tool


def assert_exactly_once(dsn: str, key: str, outs: list[Execution]) -> None:
    assert count_effects(dsn, key) == 1
    assert {e.status for e in outs} == {"succeeded"}
    assert len({repr(e.result) for e in outs}) == 1, "every caller gets the same result"
    assert sorted(e.replay for e in outs) == [False] + [True] * (len(outs) - 1)
    assert len(attempt_rows(dsn, key)) == 1


def test_twenty_sequential_retries_run_the_tool_once(dsn: str) -> None:
    make_effects_table(dsn)
    with Ledger(dsn, tenant_id="t1") as led:
        outs = [led.run("storm", effectful(dsn, "s"), {"n": 7}, key="s") for _ in range(20)]
    assert_exactly_once(dsn, "s", outs)


def test_sixteen_threads_at_once_run_the_tool_once(dsn: str) -> None:
    make_effects_table(dsn)
    ledgers = [Ledger(dsn, tenant_id="t1", worker_id=f"w{i}") for i in range(16)]
    for led in ledgers:
        led.get("warm-up")  # connected before the start line
    outs: list[Execution] = []
    start = threading.Barrier(16)

    def caller(led: Ledger) -> None:
        start.wait()
        outs.append(led.run("storm", effectful(dsn, "s", hold=0.3), {"n": 7}, key="s"))

    threads = [threading.Thread(target=caller, args=(led,)) for led in ledgers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for led in ledgers:
        led.close()
    assert len(outs) == 16
    assert_exactly_once(dsn, "s", outs)


def test_eight_processes_at_once_run_the_tool_once(dsn: str) -> None:
    make_effects_table(dsn)
    workers = [Worker(mode="storm", dsn=dsn, key="s", worker=f"p{i}", hold=0.3) for i in range(8)]
    try:
        for w in workers:
            w.expect("READY")  # imported and connected
        for w in workers:
            w.send("go")
        outs = [w.execution() for w in workers]
    finally:
        for w in workers:
            w.close()
    assert count_effects(dsn, "s") == 1
    assert {o["status"] for o in outs} == {"succeeded"}
    assert len({repr(o["result"]) for o in outs}) == 1
    assert sorted(o["replay"] for o in outs) == [False] + [True] * 7
    assert len(attempt_rows(dsn, "s")) == 1


def test_waiters_of_a_slow_tool_return_within_100ms_of_the_owner(dsn: str) -> None:
    """Eight callers, one runs a 2 s tool; the others wait via LISTEN/NOTIFY, not polling."""
    make_effects_table(dsn)
    ledgers = [Ledger(dsn, tenant_id="t1", worker_id=f"w{i}") for i in range(8)]
    for led in ledgers:
        led.get("warm-up")
    tool_done: list[float] = []
    returned: dict[int, tuple[float, Execution]] = {}
    start = threading.Barrier(8)

    def tool() -> str:
        add_effect(dsn, "slow")
        time.sleep(2.0)
        tool_done.append(time.monotonic())
        return "slow result"

    def caller(i: int) -> None:
        start.wait()
        ex = ledgers[i].run("slow", tool, {}, key="slow", wait_timeout=10)
        returned[i] = (time.monotonic(), ex)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for led in ledgers:
        led.close()
    assert len(tool_done) == 1 and count_effects(dsn, "slow") == 1
    waits = sorted(at - tool_done[0] for at, ex in returned.values() if ex.replay)
    assert len(waits) == 7
    assert {ex.result for _, ex in returned.values()} == {"slow result"}
    print(f"\nwaiter latency after the tool returned (ms): "
          f"{', '.join(f'{w * 1000:.1f}' for w in waits)}")
    # Target is 100 ms (see docs/run.md for measured values); the bound leaves room for a
    # loaded 2-core CI box.
    assert waits[-1] < 1.0


def test_a_heartbeat_keeps_a_tool_five_times_its_lease_alive(dsn: str) -> None:
    lease = 0.4
    with Ledger(dsn, tenant_id="t1", worker_id="owner") as led, \
            Ledger(dsn, tenant_id="t1", worker_id="other") as other:
        seen: list[Any] = []

        def tool() -> str:
            for _ in range(4):
                time.sleep(lease * 5 / 4)
                # Real clock: an expired lease would be swept or reported to a claimer.
                seen.append((other.sweep(), other.run("long", lambda: "x", {}, key="long",
                                                      wait_timeout=0).status))
            return "finished"

        ex = led.run("long", tool, {}, key="long", lease=lease)
    assert seen == [(0, "running")] * 4
    assert (ex.status, ex.outcome, ex.lease_lost, ex.attempt) == ("succeeded", "recorded", False, 1)
    assert action_row(dsn, "long")["state"] == "succeeded"


def test_a_lost_lease_is_logged_and_reported(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """The heartbeat finds the lease gone (another worker reclaimed): the Execution says so."""
    with Ledger(dsn, tenant_id="t1", worker_id="owner") as led, \
            psycopg.connect(dsn, autocommit=True) as admin:
        def tool() -> str:
            # Someone expires our lease behind our back; the next heartbeat notices.
            admin.execute("UPDATE replaysafe.actions SET lease_expires_at = now() - interval '1s'")
            with Ledger(dsn, tenant_id="t1", worker_id="thief") as thief:
                assert thief.claim("lost", "t", {}, on_expired="reclaim").outcome == "claimed"
            time.sleep(0.5)
            return "mine"

        with caplog.at_level("WARNING"):
            ex = led.run("t", tool, {}, key="lost", lease=0.3, on_expired="reclaim")
    assert (ex.status, ex.lease_lost, ex.outcome, ex.superseded) == (
        "succeeded", True, "superseded", True)
    assert "lost its lease" in caplog.text and "'lost'" in caplog.text
    assert action_row(dsn, "lost")["state"] == "running"  # the thief's attempt holds it
